"""The pipeline on a local SLURM in tests (tests/test_slurm.py, test_slurm_faults.py): whether one runs, the slice
of the minimal profile they run, and the SLURM jobs a run left."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from helpers.pipeline import MINI


def local_slurm_runs() -> bool:
    """Whether a local SLURM (`scripts/slurm_local.sh start`) answers with its partition up."""
    try:
        states = subprocess.run(["sinfo", "--noheader", "--partition", "local", "--format", "%t"],
                                capture_output=True, text=True, timeout=10, check=False).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return False
    return any(state.rstrip("*") in ("idle", "mix", "alloc") for state in states)


SLURM_TESTS = [
    pytest.mark.e2e,
    pytest.mark.slurm,
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.skipif(not local_slurm_runs(), reason="no local SLURM: `sudo scripts/slurm_local.sh start` (CI does)"),
]
"""The marks of a SLURM test file: skipped where no local SLURM runs."""

# The minimal profile cut to one job of each kind the pipeline has (W&B report and notebook included), on its tiny
# model: tokenize, centroid training, full fine-tune, a training-free peer, perplexity, lm-eval, tables, the peers
# table, claims, figures. SmolLM2 is left to the local run: on the cluster it would cost a third of the slice's time and
# cross no other kind of job (jobs converting it together on a cold cache: tests/test_models.py).
SLICE = {key: value for key, value in MINI.items() if key not in ("benchmark", "lora", "long_context", "interpret",
                                                                   "study")}
SLICE["models"] = {"tiny-qwen2": MINI["models"]["tiny-qwen2"]}
SLICE["harness"] = {**MINI["harness"], "chat_tasks": []}
# The recall screen, which no minimal run has: its cells are jobs of their own (and the gathering one more), the
# shape of a screen of hours that a cluster runs side by side.
SLICE["recall_screen"] = {"model": "tiny-qwen2", "domains": ["books"], "lengths": [64, 128], "rows": 1,
                          "shares": [0.5], "routers": {"groups": "centroids", "quest": "quest"}}

def slurm_jobs_of(workdir: Path) -> dict[str, list[Path]]:
    """{rule: its SLURM logs}, from the plugin's log folder (one file per SLURM job, named by its job id)."""
    jobs: dict[str, list[Path]] = {}
    for log in (workdir / ".snakemake" / "slurm_logs").rglob("*.log"):
        rule = next(part for part in log.relative_to(workdir).parts if part.startswith("rule_")).removeprefix("rule_")
        jobs.setdefault(rule, []).append(log)
    return jobs
