"""Check every job's SLURM request before a day in a queue: `sbatch --test-only` for each job of a run.

    python scripts/slurm_check.py --configfile configs/paper.yaml --workflow-profile profiles/slurm
    python scripts/slurm_check.py --partition paper-check -- --configfile configs/paper.yaml \
        --workflow-profile profiles/slurm      # against the GPU node scripts/slurm_local.sh declares

Snakemake plans the run as a dry run would (every job, whether or not its outputs exist), and for each job the
SLURM executor plugin builds the sbatch command it would submit; SLURM then answers, without running anything,
whether some node of the partition could ever run it. Prints one line per distinct request and exits 1 when a
request is refused (the sbatch error and the jobs that ask it), so a request no node can meet is found here.
Arguments after the options (or after `--`) go to Snakemake unchanged.
"""

from __future__ import annotations

import argparse
import re
import shlex
import subprocess
import sys
from collections import defaultdict

import snakemake.cli
from snakemake.executors import dryrun
from snakemake_executor_plugin_slurm.submit_string import get_submit_command
from snakemake_executor_plugin_slurm.utils import set_gres_string

# A cluster run has no --cores, so a rule's threads are not lowered to it; a dry run sets cores=1 unless told.
UNBOUNDED_CORES = "100000"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--partition", help="check against this partition instead of each job's slurm_partition")
    options, snakemake_args = parser.parse_known_args(argv)
    snakemake_args = [arg for arg in snakemake_args if arg != "--"]

    requests: dict[str, list[str]] = defaultdict(list)  # sbatch flags -> jobs asking them

    def record(executor, job):
        if job.is_norun:  # a rule without an action (`all`): never submitted
            return original_run_job(executor, job)
        partition = f" -p {shlex.quote(options.partition)}" if options.partition else None
        if partition is None:
            partition = f" -p {shlex.quote(job.resources.slurm_partition)}" if job.resources.get("slurm_partition") else ""
        params = {"run_uuid": "check", "slurm_logfile": "/dev/null", "comment_str": f"rule_{job.name}",
                  "account": "", "partition": partition, "workdir": None}
        call = get_submit_command(job, params, settings=executor.workflow.executor_settings) + set_gres_string(job)
        requests[call].append(f"{job.name}({', '.join(f'{k}={v}' for k, v in job.wildcards_dict.items())})")
        original_run_job(executor, job)

    original_run_job = dryrun.Executor.run_job
    dryrun.Executor.run_job = record
    try:
        snakemake.cli.main(["all", *snakemake_args, "--dry-run", "--forceall", "--cores", UNBOUNDED_CORES, "--quiet", "all"])
    except SystemExit as exit:
        if exit.code:
            print(f"slurm_check: snakemake could not plan the run (exit {exit.code})", file=sys.stderr)
            return 2
    finally:
        dryrun.Executor.run_job = original_run_job

    refused = 0
    for call, jobs in sorted(requests.items(), key=lambda item: item[1][0]):
        flags = re.sub(r"^sbatch --parsable --job-name \S+ --output \S+ --export=ALL --comment \S+ *", "", call)
        answer = subprocess.run(f"{call} --test-only --wrap=true", shell=True, capture_output=True, text=True, check=False)
        refused += answer.returncode != 0
        print(f"{'ok' if answer.returncode == 0 else 'REFUSED':<8} {len(jobs):>3} x {jobs[0].split('(')[0]:<24} {flags}")
        if answer.returncode != 0:
            print(f"{'':13}{answer.stderr.strip().splitlines()[-1]}\n{'':13}e.g. {', '.join(jobs[:3])}")
    print(f"{sum(map(len, requests.values()))} jobs, {len(requests)} distinct requests, {refused} refused")
    return 1 if refused else 0


if __name__ == "__main__":
    sys.exit(main())
