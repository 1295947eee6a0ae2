"""Running the pipeline in tests: the minimal profile, Snakemake on the repository's Snakefile, dry-run counts."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent.parent
SNAKEMAKE = [sys.executable, "-m", "snakemake", "--snakefile", str(ROOT / "Snakefile")]

MINI = {
    "name": "mini",
    "models": {"smollm2": {"source": "smollm2-135m-instruct"}, "tiny-qwen2": {"source": "tiny:qwen2"}},
    "data": {"domains": {"books": ["train", "validation", "test"]}},
    "focus": {"num_groups": 4, "window": 32, "top_k": 1},
    "train": {
        "domain": "books",
        "seq_len": 128,
        "calibration_rows": 2,
        "eval_rows": 2,
        "centroids": {"steps": 4, "batch_size": 2, "lr": 1e-2, "log_every": 1, "checkpoint_every": 2,
                      "eval_batch_size": 2},
        "full_finetune": {"lr": 3e-5, "checkpoint_every": 0},
    },
    "perplexity": {"domains": ["books"], "splits": ["validation", "test"], "context_length": 128, "max_tokens": 1024,
                   "batch_size": 4},
    "benchmark": {"lengths": [256, 512], "settings": [[4, 32, 1], [4, 32, 2]], "repeats": 1, "model": "tiny-qwen2",
                  "prefill_lengths": [256], "prefill_settings": [[4, 32, 1]]},
    # The evaluation stages on the tiny model only (seconds each): a 1-cell LoRA grid, lm-eval on 3 documents per
    # task (hellaswag is skipped offline), and the long-context checks at lengths beyond the window of 32.
    "lora": {"models": ["tiny-qwen2"], "ranks": [2], "lrs": [1e-3]},
    "harness": {"models": ["tiny-qwen2"], "tasks": ["arc_easy", "hellaswag"], "chat_tasks": ["truthfulqa_mc1", "truthfulqa_mc2"],
                "limit": 3, "batch_size": 4},
    "long_context": {"models": ["tiny-qwen2"], "domain": "books", "context_lengths": [64, 128], "max_tokens": 512,
                     "needle": {"lengths": [96], "depths": [0.5], "trials": 2},
                     "ruler": {"tasks": ["niah_single_1", "niah_single_2"], "lengths": [256], "limit": 1}},
    "interpret": {"models": ["tiny-qwen2"], "tokens": 256, "layers": [0, 1], "top_tokens": 3},
    # One training-free peer beside the trained router, through every stage a Focus method goes through but lm-eval.
    "peers": {"models": ["tiny-qwen2"], "selectors": ["quest@0.5"]},
    # The design study's table on the tiny model (its long context, needle and groups are measured above).
    "study": {"model": "tiny-qwen2", "baseline": "focus", "domain": "books"},
}


def snakemake(workdir: Path, *args: str, env: dict | None = None, check: bool = True, cluster: bool = False,
              timeout: float = 900) -> subprocess.CompletedProcess:
    """Run snakemake on the repository's Snakefile in `workdir` (offline unless `env` says otherwise), 1 thread per
    job: locally on 2 cores, or with `cluster` as SLURM jobs through profiles/slurm-local (scripts/slurm_local.sh)."""
    environ = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", **(env or {})}
    environ.pop("WANDB_MODE", None)
    # One thread per job, two jobs at a time: the mini jobs are mostly start-up (imports, model loading), which a
    # second thread does not speed up, so two jobs side by side finish sooner than one 2-thread job after another.
    where = ["--workflow-profile", str(ROOT / "profiles" / "slurm-local")] if cluster else ["--cores", "2"]
    command = [*SNAKEMAKE, "--directory", str(workdir), *where, "--max-threads", "1", *args]
    # A cluster job runs in the folder Snakemake was started in: start it in `workdir` itself.
    result = subprocess.run(command, env=environ, cwd=workdir if cluster else None, capture_output=True, text=True,
                            timeout=timeout, check=False)
    if check and result.returncode != 0:
        raise AssertionError(f"snakemake {' '.join(args)} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return result


def write_config(workdir: Path, config: dict) -> Path:
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def job_counts(dry_run_output: str) -> dict[str, int]:
    """{rule: count} from the "Job stats" table of a dry run."""
    table = dry_run_output.split("Job stats:")[1].split("total")[0]
    return {m[1]: int(m[2]) for m in re.finditer(r"^(\w+)\s+(\d+)$", table, flags=re.MULTILINE)}
