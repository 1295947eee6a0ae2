"""A pipeline training job killed mid-run resumes from its checkpoint."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from helpers.pipeline import MINI, SNAKEMAKE, snakemake, write_config

pytestmark = [pytest.mark.e2e, pytest.mark.filterwarnings("ignore::DeprecationWarning")]


# ---- a training job killed mid-run resumes -------------------------------------------------------------------


def one_training_job(tmp_path: Path, name: str) -> tuple[str, Path]:
    """A profile of one centroid training of a tiny Llama (120 steps, a checkpoint every 20, about 11 steps a second
    here) and nothing else; returns its path and the job's folder."""
    config = json.loads(json.dumps(MINI))
    config.update(name=name, models={"tiny-llama": {"source": "tiny:llama"}})
    for section in ("benchmark", "lora", "harness", "long_context", "interpret", "study", "peers"):
        config.pop(section)
    config["train"].update(full_finetune=None, seq_len=64, retrieval_share=0)  # rows of 64: no room for a fact
    config["train"]["centroids"].update(steps=120, checkpoint_every=20, log_every=10)
    return str(write_config(tmp_path, config)), tmp_path / "results" / name / "train" / "tiny-llama" / "focus"


@pytest.mark.slow
def test_killed_training_job_resumes_from_its_checkpoint(tmp_path):
    # The kill lands a second after the checkpoint at step 20, far from the end.
    path, run = one_training_job(tmp_path, "resume")
    target = str((run / "summary.json").relative_to(tmp_path))  # targets are relative to --directory

    environ = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    command = [*SNAKEMAKE, target, "--directory", str(tmp_path), "--cores", "2", "--configfile", path]
    output = open(tmp_path / "first.log", "w")
    first = subprocess.Popen(command, env=environ, stdout=output, stderr=output, start_new_session=True)
    deadline = time.monotonic() + 300
    while not (run / "run" / "checkpoint.pt").exists():
        ended = first.poll() is not None or time.monotonic() > deadline
        assert not ended, f"training ended before its first checkpoint:\n{(tmp_path / 'first.log').read_text()}"
        time.sleep(0.2)
    time.sleep(1.0)
    os.killpg(first.pid, signal.SIGKILL)  # the whole job: snakemake and its script
    first.wait()
    assert not (run / "summary.json").exists()

    snakemake(tmp_path, "--unlock", "--configfile", path)  # a killed snakemake leaves its lock, as documented
    snakemake(tmp_path, target, "--configfile", path)  # the default profile sets rerun-incomplete
    summary = json.loads((run / "summary.json").read_text())
    assert summary["resumed"] is True and summary["final"]["step"] == 120
    log = (tmp_path / "results" / "resume" / "logs" / "train_focus" / "tiny-llama" / "focus.log").read_text()
    assert re.search(r"resuming from .*checkpoint\.pt at step [1-9]\d* of 120", log)
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == sorted(set(steps)) and steps[-1] == 120  # no step logged twice across the kill


# ---- a training job that runs out of space says so in one line, and resumes once there is space -------------


@pytest.mark.slow
def test_a_training_job_on_a_full_disk_ends_its_log_with_one_line_and_resumes(tmp_path):
    path, folder = one_training_job(tmp_path, "full")
    folder.mkdir(parents=True)
    # The job's own folder on a 1 MiB disk of its own (root only), filled up once its first checkpoint is written.
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(folder)], capture_output=True).returncode:
        pytest.skip("cannot mount a small tmpfs here (needs root)")
    try:
        target = str((folder / "summary.json").relative_to(tmp_path))
        environ = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
        command = [*SNAKEMAKE, target, "--directory", str(tmp_path), "--cores", "2", "--configfile", path]
        output = open(tmp_path / "first.log", "w")
        first = subprocess.Popen(command, env=environ, stdout=output, stderr=output)
        deadline = time.monotonic() + 300
        while not (folder / "run" / "checkpoint.pt").exists():
            ended = first.poll() is not None or time.monotonic() > deadline
            assert not ended, f"training ended before its first checkpoint:\n{(tmp_path / 'first.log').read_text()}"
            time.sleep(0.05)
        with open(folder / "filler", "wb", buffering=0) as filler, pytest.raises(OSError):
            while True:
                filler.write(b"\0" * 65536)
        assert first.wait(timeout=300) != 0
        log = tmp_path / "results" / "full" / "logs" / "train_focus" / "tiny-llama" / "focus.log"
        last = log.read_text().splitlines()[-1]
        where = folder.relative_to(tmp_path)  # the rule's paths, relative to --directory
        assert re.fullmatch(rf"error: no space left to write {where}/run/(checkpoint\.pt|metrics\.jsonl) .*", last)
        assert torch_step(folder / "run" / "checkpoint.pt") >= 20  # the failed job's state survives Snakemake
        made_before = {p: p.stat().st_mtime_ns for p in (tmp_path / "results" / "full").rglob("*.safetensors")
                       if folder not in p.parents}
        assert made_before  # the token caches a successful job made, kept through the failure

        (folder / "filler").unlink()
        snakemake(tmp_path, target, "--configfile", path)
        summary = json.loads((folder / "summary.json").read_text())
        assert summary["resumed"] is True and summary["final"]["step"] == 120
        steps = [json.loads(line)["step"] for line in (folder / "metrics.jsonl").read_text().splitlines()]
        assert steps == sorted(set(steps)) and steps[-1] == 120
        assert {p: p.stat().st_mtime_ns for p in made_before} == made_before  # not re-made either
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def torch_step(checkpoint):
    import torch

    return torch.load(checkpoint, weights_only=True)["step"]
