"""The pipeline's faults on a real SLURM (`scripts/slurm_local.sh start`; see test_slurm.py): a training job cancelled
mid-run, a time limit, a Snakemake killed and started again. Skipped where no local SLURM runs. About 8 minutes here.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

from helpers.pipeline import ROOT, SNAKEMAKE, snakemake, write_config
from helpers.slurm import SLICE, SLURM_TESTS, slurm_jobs_of
from safetensors.torch import load_file

pytestmark = SLURM_TESTS


# ---- faults ------------------------------------------------------------------------------------------------


def training_profile(tmp_path: Path, steps: int) -> tuple[str, Path, str]:
    """A profile that trains one tiny model's centroids for `steps` (about 11 a second), checkpointing every 20;
    returns (its path, the run folder, the summary target)."""
    config = json.loads(json.dumps(SLICE))
    config.update(name="fault", models={"tiny-llama": {"source": "tiny:llama"}})
    config.pop("harness")
    config.pop("peers")  # its selector sits on tiny-qwen2, which this profile leaves out
    config.pop("recall_screen")  # (so does the recall screen)
    config["train"].update(full_finetune=None, seq_len=64, retrieval_share=0)  # rows of 64: no room for a fact
    config["train"]["centroids"].update(steps=steps, checkpoint_every=20, log_every=10)
    path = str(write_config(tmp_path, config))
    run = tmp_path / "results" / "fault" / "train" / "tiny-llama" / "focus"
    return path, run, str((run / "summary.json").relative_to(tmp_path))


def start_cluster_run(workdir: Path, *args: str) -> subprocess.Popen:
    """Snakemake on the local SLURM in the background (its output in workdir/snakemake.log)."""
    return _start(workdir, "--workflow-profile", str(ROOT / "profiles" / "slurm-local"), *args)


def start_local_run(workdir: Path, *args: str) -> subprocess.Popen:
    """Snakemake on this machine, one core, in the background (its output in workdir/snakemake.log)."""
    return _start(workdir, "--cores", "1", *args)


def _start(workdir: Path, *args: str) -> subprocess.Popen:
    command = [*SNAKEMAKE, "--max-threads", "1", *args]
    environ = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    log = open(workdir / "snakemake.log", "w")  # noqa: SIM115 (the child writes it; closed with the process)
    return subprocess.Popen(command, cwd=workdir, env=environ, stdout=log, stderr=log, start_new_session=True)


def wait_for(condition, what: str, seconds: float = 300, process: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert process is None or process.poll() is None, f"Snakemake ended before {what}"
        assert time.monotonic() < deadline, f"no {what} after {seconds} s"
        time.sleep(0.5)


def slurm_job_id(comment: str) -> str | None:
    """The queued or running SLURM job submitted with `comment` (rule_<rule>_wildcards_<values>), if any."""
    queue = subprocess.run(["squeue", "--noheader", "--format=%i %T %k"], capture_output=True, text=True,
                           check=True).stdout
    return next((line.split()[0] for line in queue.splitlines()
                 if line.endswith(f" {comment}") and line.split()[1] in ("PENDING", "RUNNING")), None)


TRAINING = "rule_train_focus_wildcards_tiny-llama_focus"


def test_a_cancelled_training_job_is_retried_and_resumes_bit_exact(tmp_path):
    cluster, local = tmp_path / "cluster", tmp_path / "local"
    cluster.mkdir()
    path, run, target = training_profile(cluster, steps=200)
    local_path, local_run, local_target = training_profile(local, steps=200)
    # The uninterrupted run to compare with, locally, beside the cluster's (one thread each: 2 cores hold both).
    uninterrupted = start_local_run(local, local_target, "--configfile", local_path)
    first = start_cluster_run(cluster, target, "--configfile", path)
    wait_for(lambda: (run / "run" / "checkpoint.pt").exists(), "first checkpoint", process=first)
    subprocess.run(["scancel", slurm_job_id(TRAINING)], check=True)  # a preemption, as the scheduler does it
    assert first.wait(timeout=600) == 0, (cluster / "snakemake.log").read_text()[-3000:]

    output = (cluster / "snakemake.log").read_text()
    assert "SLURM status is: 'CANCELLED'" in output and "Trying to restart job" in output  # retries: 1
    assert re.search(r"SLURM job \d+ \(train_focus\) was stopped after", output)  # the job's own last word
    assert len(slurm_jobs_of(cluster)["train_focus"]) == 2
    summary = json.loads((run / "summary.json").read_text())
    assert summary["resumed"] is True and summary["final"]["step"] == 200

    assert uninterrupted.wait(timeout=600) == 0, (local / "snakemake.log").read_text()[-3000:]
    resumed = load_file(run / "adapter" / "focus_centroids.safetensors")
    whole = load_file(local_run / "adapter" / "focus_centroids.safetensors")
    assert resumed.keys() == whole.keys()
    assert all(resumed[name].equal(whole[name]) for name in resumed)


def test_a_job_past_its_time_limit_says_so(tmp_path):
    path, _, target = training_profile(tmp_path, steps=1_000_000)
    result = snakemake(tmp_path, target, "--configfile", path, "--set-resources", "train_focus:runtime=1",
                       "--retries", "0", cluster=True, check=False, timeout=600)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert "Error in rule train_focus" in output and "SLURM status is: 'TIMEOUT'" in output
    assert re.search(r"SLURM job \d+ \(train_focus\) reached its time limit of 00:01:00: ask for more "
                     r"\(runtime, in minutes, under set-resources: train_focus: in the execution profile\)", output)


def test_a_restarted_snakemake_waits_for_its_predecessors_jobs_instead_of_resubmitting(tmp_path):
    path, run, target = training_profile(tmp_path, steps=300)
    first = start_cluster_run(tmp_path, target, "--configfile", path)
    wait_for(lambda: (run / "run" / "checkpoint.pt").exists(), "first checkpoint", process=first)
    os.killpg(first.pid, signal.SIGKILL)  # Snakemake alone: its SLURM job runs on under slurmd
    first.wait()
    assert slurm_job_id(TRAINING) is not None

    snakemake(tmp_path, "--unlock", "--configfile", path, cluster=True)
    again = snakemake(tmp_path, target, "--configfile", path, cluster=True)
    assert re.search(r"waiting for 1 SLURM job\(s\) an earlier Snakemake left in this folder: \d+ "
                     r"\(train_focus_wildcards_tiny-llama_focus, running\)", again.stderr)
    assert "Nothing to be done" in again.stdout + again.stderr  # its job finished the training
    assert len(slurm_jobs_of(tmp_path)["train_focus"]) == 1  # never submitted twice
    summary = json.loads((run / "summary.json").read_text())
    assert summary["resumed"] is False and summary["final"]["step"] == 300
