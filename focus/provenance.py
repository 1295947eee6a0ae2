"""Where an artifact came from: library version, git commit, package versions, device."""

from __future__ import annotations

import platform
import subprocess
from importlib import metadata
from pathlib import Path

from focus.version import __version__

_PACKAGES = ("torch", "transformers", "accelerate", "safetensors", "datasets", "peft", "lm_eval", "wandb", "snakemake")


def git_commit(path: Path | None = None) -> str:
    """The commit of the checkout holding this package (with "-dirty" if it has changes), or "unknown"."""
    where = path or Path(__file__).resolve().parent
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=where, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], cwd=where, capture_output=True, text=True, timeout=10
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{commit}-dirty" if dirty else commit


def package_versions() -> dict[str, str]:
    versions = {}
    for name in _PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return versions


def device_info() -> dict[str, str | int]:
    import torch  # (here: the tables' jobs read provenance without importing torch)

    info: dict[str, str | int] = {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpu": cpu_name(),
        "cpu_threads": torch.get_num_threads(),
    }
    if torch.cuda.is_available():
        info["cuda_device"] = torch.cuda.get_device_name(0)
        info["cuda_devices"] = torch.cuda.device_count()
    return info


def cpu_name() -> str:
    """The CPU's model name and logical cores (Linux), without torch."""
    try:
        with open("/proc/cpuinfo") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
    except OSError:
        names = []
    return f"{names[0]} ({len(names)} logical cores)" if names else platform.processor() or platform.machine()


CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")
"""The CPU features that change what a timing or a bfloat16 run measures here (the native kernels' vector and matrix
paths, FACTS.md)."""


def cpu_flags() -> list[str]:
    """Which of `CPU_FLAGS` this CPU has (Linux), without torch."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        flags = []
    return [flag for flag in CPU_FLAGS if flag in flags]


def provenance() -> dict:
    return {
        "focus_version": __version__,
        "git_commit": git_commit(),
        "packages": package_versions(),
        "device": device_info(),
    }


def short_commit(commit: str) -> str:
    """A commit as a line names it: 12 digits, and `-dirty` where the checkout had changes."""
    return commit[:12] + ("-dirty" if commit.endswith("-dirty") else "")


def machine_name() -> str:
    """What computed here, in a few words: the GPU when there is one, else the CPU model."""
    device = device_info()
    return str(device.get("cuda_device", device["cpu"]))


def provenance_line(command: str, commit: str | None = None) -> str:
    """One Markdown line saying where a table came from: the commit (`commit`, taken when the run started: the checkout
    may move on while it runs; default now), the machine, torch, the date and the command that re-makes it (put at the
    top of a result a reader may meet without its folder)."""
    import datetime

    import torch

    where = machine_name()
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    return (f"*Made at commit {short_commit(commit or git_commit())} on {where}, torch {torch.__version__}, {date}; "
            f"re-make: `{command}`.*")
