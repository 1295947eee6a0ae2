"""The pipeline on a real SLURM: `scripts/slurm_local.sh start` (as root; .ci/run does it) runs a one-node cluster
with fake GPUs here. A slice of the minimal profile that crosses every kind of job runs as SLURM jobs through
profiles/slurm-local, and its tables equal the local run of the whole minimal profile row for row (the mini_run
fixture, tests/conftest.py); every request of the paper profile
is checked with `sbatch --test-only` against a declared 8-GPU node. The cluster's faults are in
test_slurm_faults.py.

Skipped where no local SLURM runs. About 6 minutes here (2 cores of a Xeon with AMX): the local minimal run 201 s,
the slice 144 s (224 s with SmolLM2 in it), before its recall screen joined it; 13 min 22 s with it, beside a
training run, on 2 cores of an AVX-512 EPYC.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from helpers.pipeline import ROOT, snakemake, write_config
from helpers.slurm import SLICE, SLURM_TESTS, slurm_jobs_of

pytestmark = SLURM_TESTS

# What the computation decides (not the wall time) must not depend on where a job ran.
TIMINGS = re.compile(r"seconds|time|per_s|speed")


@pytest.fixture(scope="module")
def cluster_run(tmp_path_factory):
    """The slice run through SLURM; returns (its workdir, its Snakemake output)."""
    cluster = tmp_path_factory.mktemp("cluster")
    config = {**SLICE, "name": "slice"}
    result = snakemake(cluster, "--configfile", str(write_config(cluster, config)), cluster=True, timeout=1800)
    return cluster, result.stdout + result.stderr


def test_every_job_of_the_slice_ran_as_a_slurm_job(cluster_run):
    cluster, output = cluster_run
    submitted = re.findall(r"Job \d+ has been submitted with SLURM jobid (\d+) \(log: (\S+)\)", output)
    finished = re.findall(r"Finished jobid: \d+ \(Rule: (\w+)\)", output)
    # Every job but `all` (a rule with nothing to run) was submitted, once, and left its SLURM log.
    assert len(submitted) == len([rule for rule in finished if rule != "all"]) >= 19
    assert all(Path(log).is_file() for _, log in submitted)
    assert {rule: len(logs) for rule, logs in slurm_jobs_of(cluster).items()} == {
        "tokenize": 1, "train_focus": 1, "train_full_finetune": 1, "peer": 1, "perplexity": 5,
        "benchmarks": 3, "peers_table": 1, "evaluation_tables": 1, "tables": 1, "claims": 1, "figures": 1, "provenance": 1,
        "wandb_report": 1, "notebook": 1, "recall_screen_cell": 2, "recall_screen": 1}


def test_the_slice_computes_the_same_tables_on_the_cluster_as_locally(cluster_run, mini_run):
    """Each row of the cluster's tables equals the local minimal run's row of the same keys (the slice's rows are a
    subset: it leaves out the LoRA cell and the chat tasks), every column but timings, exactly."""
    cluster, _ = cluster_run
    _, local = mini_run
    compared = 0
    for table in sorted((cluster / "results" / "slice" / "tables").glob("*.csv")):
        if table.name in ("claims.csv", "provenance.csv") or table.name.startswith("recall_screen"):
            continue  # claims: its settings column quotes timings, and the minimal run has more stages to judge;
            # provenance: each run's paths and dates; the recall screen: no minimal run has one (its cells against
            # one process: tests/test_indexer.py)
        there, here = pd.read_csv(table), pd.read_csv(local / "tables" / table.name)
        columns = [column for column in there.columns if not TIMINGS.search(column)]
        keys = [column for column in there.select_dtypes(exclude=["number", "bool"]) if column in columns]
        keys += [column for column in ("context_length",) if column in columns]  # (a key, though a number: peers)
        here = there[keys].merge(here[columns], on=keys, how="left")[columns]  # the local rows of the slice's keys
        pd.testing.assert_frame_equal(here, there[columns], check_exact=True, obj=table.name)
        compared += 1
    assert compared >= 4  # perplexity, training, benchmarks, prompt lengths


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
    # A job asks SLURM for the CPUs its torch threads use: the profile's set-threads, not a default cpus_per_task.
    assert re.search(r"^ok +\d+ x perplexity .*--cpus-per-task=8 ", result.stdout, flags=re.MULTILINE)
    assert re.search(r"^ok +1 x claims .*--cpus-per-task=1\b", result.stdout, flags=re.MULTILINE)

    too_many = subprocess.run([*check, "--set-resources", "train_focus:gpu=9"], cwd=tmp_path, env=online,
                              capture_output=True, text=True, check=False)
    assert too_many.returncode == 1
    assert re.search(r"^REFUSED +9 x train_focus .*--gpus=9\n +.*Requested node configuration is not available",
                     too_many.stdout, flags=re.MULTILINE)
