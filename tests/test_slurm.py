"""The pipeline on a real SLURM: `scripts/slurm_local.sh start` (as root; .ci/run does it) runs a one-node cluster
with fake GPUs here. A slice of the minimal profile that crosses every kind of job runs as SLURM jobs through
profiles/slurm-local, on a cold model cache, and its tables equal the local run's; every request of the paper profile
is checked with `sbatch --test-only` against a declared 8-GPU node; and the cluster's faults are tried: a training
job cancelled mid-run, a time limit, a Snakemake killed and started again.

Skipped where no local SLURM runs. About 7 minutes here (2 cores), most of it the slice.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from helpers.pipeline import MINI, ROOT, SNAKEMAKE, snakemake, write_config
from safetensors.torch import load_file


def _local_slurm_runs() -> bool:
    try:
        states = subprocess.run(["sinfo", "--noheader", "--partition", "local", "--format", "%t"],
                                capture_output=True, text=True, timeout=10, check=False).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return False
    return any(state.rstrip("*") in ("idle", "mix", "alloc") for state in states)


pytestmark = [
    pytest.mark.slurm,
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.skipif(not _local_slurm_runs(), reason="no local SLURM: `sudo scripts/slurm_local.sh start` (CI does)"),
]

# The minimal profile cut to one job of each kind the pipeline has (W&B report and notebook included): tokenize,
# centroid training for SmolLM2 and a tiny model, full fine-tune, perplexity, lm-eval, tables, claims, figures.
SLICE = {key: value for key, value in MINI.items() if key not in ("benchmark", "lora", "long_context", "interpret",
                                                                   "study")}
SLICE["harness"] = {**MINI["harness"], "chat_tasks": []}
# What the computation decides (not the wall time) must not depend on where a job ran.
TIMINGS = re.compile(r"seconds|time|per_s|speed")


def slurm_jobs_of(workdir: Path) -> dict[str, list[Path]]:
    """{rule: its SLURM logs}, from the plugin's log folder (one file per SLURM job, named by its job id)."""
    jobs: dict[str, list[Path]] = {}
    for log in (workdir / ".snakemake" / "slurm_logs").rglob("*.log"):
        rule = next(part for part in log.relative_to(workdir).parts if part.startswith("rule_")).removeprefix("rule_")
        jobs.setdefault(rule, []).append(log)
    return jobs


@pytest.fixture(scope="module")
def cluster_and_local_runs(tmp_path_factory):
    """The slice run through SLURM on an empty model cache (the jobs that start together convert SmolLM2 once),
    and locally beside it; returns (cluster workdir, its Snakemake output, local workdir)."""
    cluster, local = tmp_path_factory.mktemp("cluster"), tmp_path_factory.mktemp("local")
    cold_cache = tmp_path_factory.mktemp("cold-focus-cache")
    config = {**SLICE, "name": "slice"}
    result = snakemake(cluster, "--configfile", str(write_config(cluster, config)), cluster=True,
                       env={"FOCUS_CACHE": str(cold_cache)}, timeout=1800)
    snakemake(local, "--configfile", str(write_config(local, config)))
    return cluster, result.stdout + result.stderr, local


def test_every_job_of_the_slice_ran_as_a_slurm_job(cluster_and_local_runs):
    cluster, output, _ = cluster_and_local_runs
    submitted = re.findall(r"Job \d+ has been submitted with SLURM jobid (\d+) \(log: (\S+)\)", output)
    finished = re.findall(r"Finished jobid: \d+ \(Rule: (\w+)\)", output)
    # Every job but `all` (a rule with nothing to run) was submitted, once, and left its SLURM log.
    assert len(submitted) == len([rule for rule in finished if rule != "all"]) >= 20
    assert all(Path(log).is_file() for _, log in submitted)
    assert {rule: len(logs) for rule, logs in slurm_jobs_of(cluster).items()} == {
        "tokenize": 2, "train_focus": 2, "train_full_finetune": 2, "perplexity": 8,
        "benchmarks": 3, "evaluation_tables": 1, "tables": 1, "claims": 1, "figures": 1, "wandb_report": 1,
        "notebook": 1}
    # On the cold cache the first jobs found SmolLM2 unconverted together: one converted it, the others waited.
    logs = (cluster / "results" / "slice" / "logs").rglob("*.log")
    assert sum("de-quantizing GGUF tensors" in log.read_text() for log in logs) == 1


def test_the_slice_computes_the_same_tables_on_the_cluster_as_locally(cluster_and_local_runs):
    cluster, _, local = cluster_and_local_runs
    compared = 0
    for table in sorted((local / "results" / "slice" / "tables").glob("*.csv")):
        if table.name == "claims.csv":
            continue  # its settings column quotes timings
        here, there = pd.read_csv(table), pd.read_csv(cluster / "results" / "slice" / "tables" / table.name)
        columns = [column for column in here.columns if not TIMINGS.search(column)]
        pd.testing.assert_frame_equal(here[columns], there[columns], check_exact=True, obj=table.name)
        compared += 1
    assert compared >= 4  # perplexity, training, benchmarks, prompt lengths
    claims = [pd.read_csv(root / "results" / "slice" / "tables" / "claims.csv") for root in (cluster, local)]
    assert list(claims[0]["verdict"]) == list(claims[1]["verdict"])


def test_paper_profile_requests_fit_a_gpu_node_and_a_bad_one_is_refused(tmp_path):
    check = [sys.executable, str(ROOT / "scripts" / "slurm_check.py"), "--partition", "paper-check", "--snakefile",
             str(ROOT / "Snakefile"), "--configfile", str(ROOT / "configs" / "paper.yaml"), "--workflow-profile",
             str(ROOT / "profiles" / "slurm")]
    online = {**os.environ, "HF_HUB_OFFLINE": "0", "HF_DATASETS_OFFLINE": "0"}  # as on a cluster with hub access
    result = subprocess.run(check, cwd=tmp_path, env=online, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    jobs, requests, refused = map(int, re.search(r"(\d+) jobs, (\d+) distinct requests, (\d+) refused",
                                                 result.stdout).groups())
    assert jobs >= 240 and requests >= 20 and refused == 0
    assert re.search(r"^ok +1 x train_focus .*--gpus=8", result.stdout, flags=re.MULTILINE)  # the 70B model

    too_many = subprocess.run([*check, "--set-resources", "train_focus:gpu=9"], cwd=tmp_path, env=online,
                              capture_output=True, text=True, check=False)
    assert too_many.returncode == 1
    assert re.search(r"^REFUSED +9 x train_focus .*--gpus=9\n +.*Requested node configuration is not available",
                     too_many.stdout, flags=re.MULTILINE)


# ---- faults ------------------------------------------------------------------------------------------------


def training_profile(tmp_path: Path, steps: int) -> tuple[str, Path, str]:
    """A profile that trains one tiny model's centroids for `steps` (about 11 a second), checkpointing every 20;
    returns (its path, the run folder, the summary target)."""
    config = json.loads(json.dumps(SLICE))
    config.update(name="fault", models={"tiny-llama": {"source": "tiny:llama"}})
    config.pop("harness")
    config["train"].update(full_finetune=None, seq_len=64, retrieval_share=0)  # rows of 64: no room for a fact
    config["train"]["centroids"].update(steps=steps, checkpoint_every=20, log_every=10)
    path = str(write_config(tmp_path, config))
    run = tmp_path / "results" / "fault" / "train" / "tiny-llama" / "focus"
    return path, run, str((run / "summary.json").relative_to(tmp_path))


def start_cluster_run(workdir: Path, *args: str) -> subprocess.Popen:
    command = [*SNAKEMAKE, "--workflow-profile", str(ROOT / "profiles" / "slurm-local"), "--max-threads", "1", *args]
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

    local_path, local_run, local_target = training_profile(local, steps=200)
    snakemake(local, local_target, "--configfile", local_path)
    resumed = load_file(run / "adapter" / "focus_centroids.safetensors")
    uninterrupted = load_file(local_run / "adapter" / "focus_centroids.safetensors")
    assert resumed.keys() == uninterrupted.keys()
    assert all(resumed[name].equal(uninterrupted[name]) for name in resumed)


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
