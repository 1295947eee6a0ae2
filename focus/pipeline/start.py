"""The first call of every pipeline job: where its output goes, how many threads it uses, and a last word in its
log when SLURM stops it.

Kept free of torch so that a job that only reads CSV and JSON files (tables, claims, the W&B report) starts in a
fraction of a second instead of the seconds torch and transformers take to import.
"""

from __future__ import annotations

import atexit
import logging
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Iterable

from focus.files import DiskFullError  # torch-free, as this module must stay

_FULL_DISK: list[str] = []  # the line a job that ran out of space ends its log with
_FAILED: list[str] = []  # the exception that ended the job, if one did


def start_job(log: str | Path, threads: int, stamp: Iterable[str | Path] = (), rule: str | None = None) -> None:
    """Send this job's stdout, stderr (progress bars) and logging to `log`, and use `threads` torch threads; when
    the job ends without an error, `stamp` its outputs as made by `rule` (tables and figures: where they came from,
    `focus.pipeline.stamp`).

    Under SLURM, a job stopped by SIGTERM (its time limit, scancel, a preemption) first says which in its log.
    """
    stream = open(log, "w", buffering=1)  # line-buffered: `tail -f` shows progress as it happens
    # The file descriptors too: output from C++ (NCCL) and from the processes of a multi-GPU job goes there as well.
    os.dup2(stream.fileno(), 1)
    os.dup2(stream.fileno(), 2)
    sys.stdout = sys.stderr = stream
    logging.basicConfig(level=logging.INFO, stream=stream, format="%(asctime)s %(name)s: %(message)s", force=True)
    # torch takes its thread count from OMP_NUM_THREADS when it is first imported; one imported already is told.
    os.environ["OMP_NUM_THREADS"] = str(threads)
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(threads)
    sys.excepthook = _remember_a_full_disk
    atexit.register(_say_it_last)
    if stamp:
        atexit.register(_stamp_unless_failed, [str(path) for path in stamp], rule)
    if "SLURM_JOB_ID" in os.environ:
        signal.signal(signal.SIGTERM, _report_slurm_stop)


def _remember_a_full_disk(kind, error, traceback) -> None:
    """A job that ran out of space ends its log with the line that says which file and where (`_say_it_last`), not
    with a traceback (the disk is full, the code is fine); any other failure prints its traceback. W&B's own hook,
    set over this one by a live run, prints every traceback first."""
    _FAILED.append(kind.__name__)
    if issubclass(kind, DiskFullError):
        _FULL_DISK.append(str(error))
    else:
        sys.__excepthook__(kind, error, traceback)


def _stamp_unless_failed(outputs: list[str], rule: str | None) -> None:
    if not _FAILED:  # (a failed job's outputs are Snakemake's to remove)
        from focus.pipeline.stamp import stamp_outputs

        stamp_outputs(outputs, rule)


def _say_it_last() -> None:
    # An exit hook registered before W&B's: it runs after them, so the line comes after W&B's goodbye.
    for line in _FULL_DISK:
        print(f"error: {line}", file=sys.stderr, flush=True)


def _report_slurm_stop(signum, frame) -> None:
    """SIGTERM under SLURM: write why the job is stopping (the time limit it asked for, or a cancellation), then die
    of SIGTERM as if nothing had been caught (Snakemake and SLURM see the same exit)."""
    job_id = os.environ["SLURM_JOB_ID"]
    try:
        record = subprocess.run(["scontrol", "show", "job", "--oneliner", job_id], capture_output=True, text=True,
                                timeout=5, check=False).stdout
        fields = dict(re.findall(r"(\w+)=(\S*)", record))
    except (OSError, subprocess.SubprocessError):
        fields = {}
    rule = re.sub(r"_wildcards_.*", "", fields.get("Comment", "")).removeprefix("rule_") or "this rule"
    limit, ran = fields.get("TimeLimit", "?"), fields.get("RunTime", "?")
    if limit not in ("?", "UNLIMITED") and _seconds(ran) >= _seconds(limit):
        print(f"SLURM job {job_id} ({rule}) reached its time limit of {limit}: ask for more (runtime, in minutes, "
              f"under set-resources: {rule}: in the execution profile); a training job resumes from its last "
              "checkpoint", flush=True)
    else:
        print(f"SLURM job {job_id} ({rule}) was stopped after {ran} of its {limit} (scancel, a preemption or the "
              "Snakemake run ending); a training job resumes from its last checkpoint when it runs again", flush=True)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


def _seconds(duration: str) -> int:
    """SLURM's [days-]hours:minutes:seconds (or minutes:seconds) in seconds; -1 where it is not a duration."""
    match = re.fullmatch(r"(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+)", duration)
    if match is None:
        return -1
    days, hours, minutes, seconds = (int(part or 0) for part in match.groups())
    return ((days * 24 + hours) * 60 + minutes) * 60 + seconds
