#!/usr/bin/env bash
# A one-node SLURM on this machine, to try the pipeline's cluster path (profiles/slurm-local) without a cluster.
#
#   scripts/slurm_local.sh start    # install (Debian's slurm-wlm + munge, once: 10 s here), configure, start
#   scripts/slurm_local.sh status   # the node and the queue
#   scripts/slurm_local.sh stop     # cancel every job, stop the daemons (the configuration stays)
#
# Idempotent: `start` on a running cluster rewrites the configuration and reloads it only where it changed.
# Needs root (apt, the daemons, /dev nodes). The node is this machine, declared with its cores and memory, and
# with fake GPUs (FOCUS_SLURM_GPUS, default 2): character devices that SLURM schedules like GPUs, so that a
# `--gpus=1` job runs (with CUDA_VISIBLE_DEVICES set) and its torch falls back to the CPU.
#
# A second node, `gpu-node` in partition `paper-check`, is declared like a cluster's GPU node (8 GPUs, 2 TB,
# 128 cores; its slurmd runs here too, trusting the declaration): `sbatch --test-only -p paper-check` against it
# tells whether a request could ever be met (scripts/slurm_check.py). Nothing is sent there to run.
# Accounting is off: job status comes from squeue (profiles/slurm-local says so).
set -euo pipefail

gpus=${FOCUS_SLURM_GPUS:-2}
partition=local
conf_dir=/etc/slurm
log_dir=/var/log/slurm
spool=/var/spool

die() { echo "slurm_local.sh: $*" >&2; exit 2; }

install() {
    command -v slurmctld >/dev/null && command -v munged >/dev/null && return
    command -v apt-get >/dev/null || die "no apt-get: install slurm-wlm and munge with your package manager"
    echo "installing slurm-wlm and munge (Debian packages)..."
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge >/dev/null
}

fake_gpus() {
    # Character devices with the NVIDIA major number: slurmd only checks that the files exist.
    local count=$1
    for ((i = 0; i < count; i++)); do
        [ -e "/dev/fakenv$i" ] || mknod "/dev/fakenv$i" c 195 "$i"
    done
}

write_config() {
    local host cpus memory
    host=$(hostname -s)
    cpus=$(nproc)
    # What slurmd may hand out: 90% of the memory, the rest for the daemons and the submitting Snakemake.
    memory=$(awk '/MemTotal/ {printf "%d", $2 / 1024 * 0.9}' /proc/meminfo)
    mkdir -p "$conf_dir" "$log_dir" "$spool/slurmctld"
    cat >"$conf_dir/slurm.conf.new" <<EOF
# Written by focus scripts/slurm_local.sh: this machine as a node with fake GPUs, and a GPU node for --test-only.
ClusterName=focus-local
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
SchedulerType=sched/backfill
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
StateSaveLocation=$spool/slurmctld
SlurmdSpoolDir=$spool/slurmd/%n
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd-%n.pid
SlurmctldLogFile=$log_dir/slurmctld.log
SlurmdLogFile=$log_dir/slurmd-%n.log
# The nodes are what this file declares, not what slurmd finds (gpu-node is not this machine).
SlurmdParameters=config_overrides
ReturnToService=2
# squeue still shows a finished job for this long (the local profile reads job status from squeue).
MinJobAge=300
# A job past its time limit gets SIGTERM, then SIGKILL this many seconds later.
KillWait=10
GresTypes=gpu
NodeName=$host CPUs=$cpus RealMemory=$memory Gres=gpu:$gpus State=UNKNOWN
NodeName=gpu-node NodeAddr=127.0.0.1 Port=6899 CPUs=128 RealMemory=2000000 Gres=gpu:8 State=UNKNOWN
PartitionName=$partition Nodes=$host Default=YES MaxTime=INFINITE State=UP
PartitionName=paper-check Nodes=gpu-node MaxTime=INFINITE State=UP
EOF
    cat >"$conf_dir/gres.conf.new" <<EOF
AutoDetect=off
NodeName=$host Name=gpu File=/dev/fakenv[0-$((gpus - 1))]
NodeName=gpu-node Name=gpu File=/dev/fakenv[0-7]
EOF
    local changed=1
    if cmp -s "$conf_dir/slurm.conf.new" "$conf_dir/slurm.conf" && cmp -s "$conf_dir/gres.conf.new" "$conf_dir/gres.conf"; then
        changed=0
    fi
    mv "$conf_dir/slurm.conf.new" "$conf_dir/slurm.conf"
    mv "$conf_dir/gres.conf.new" "$conf_dir/gres.conf"
    return $((1 - changed))  # 0: changed
}

running() { pgrep -x "$1" >/dev/null; }

wait_for_node() {
    local state
    for _ in $(seq 30); do
        state=$(timeout 5 sinfo -h -N -n "$1" -o %t 2>/dev/null || true)
        case "$state" in
            idle* | mix* | alloc*) return 0 ;;
            down* | drain* | inval*) scontrol update NodeName="$1" State=RESUME >/dev/null 2>&1 || true ;;
        esac
        sleep 1
    done
    die "node $1 did not come up (state '${state}'); see $log_dir/slurmd-$1.log and $log_dir/slurmctld.log"
}

start() {
    [ "$(id -u)" = 0 ] || die "run as root: it installs packages and starts daemons"
    install
    fake_gpus 8  # gpu-node declares 8; this machine's node uses the first $gpus
    local changed=0
    write_config && changed=1
    if ((changed)) && running slurmctld; then
        echo "configuration changed: restarting"
        stop_daemons
    fi
    if ! running munged; then
        mkdir -p /run/munge /var/log/munge /var/lib/munge
        chown -R munge:munge /run/munge /var/log/munge /var/lib/munge /etc/munge
        runuser -u munge -- munged
    fi
    running slurmctld || slurmctld
    start_slurmd "$(hostname -s)"
    start_slurmd gpu-node
    wait_for_node "$(hostname -s)"
    wait_for_node gpu-node
    status
}

start_slurmd() {
    # One slurmd per node name (-N), each with its own spool folder, pid file and log (%n in slurm.conf).
    local pid_file=/run/slurmd-$1.pid
    [ -f "$pid_file" ] && kill -0 "$(cat "$pid_file")" 2>/dev/null && return
    mkdir -p "$spool/slurmd/$1"
    slurmd -N "$1"
}

stop_daemons() {
    scontrol shutdown >/dev/null 2>&1 || true
    for _ in $(seq 30); do
        running slurmctld || running slurmd || break
        sleep 1
    done
    stop_process slurmd
    stop_process slurmctld
}

stop_process() {
    pkill -x "$1" || return 0
    for _ in $(seq 30); do
        running "$1" || return 0
        sleep 0.2
    done
    pkill -9 -x "$1" || true
}

stop() {
    if running slurmctld; then
        scancel --full --user "$(id -un)" 2>/dev/null || true
    fi
    stop_daemons
    stop_process munged
    echo "SLURM stopped"
}

status() {
    if ! running slurmctld; then
        echo "SLURM is not running (scripts/slurm_local.sh start)"
        return 1
    fi
    sinfo -N -o "%N %P %t %c %m %G"
    squeue
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    status) status ;;
    *) die "usage: scripts/slurm_local.sh start|stop|status" ;;
esac
