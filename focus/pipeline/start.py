"""The first call of every pipeline job: where its output goes and how many threads it uses.

Kept free of torch so that a job that only reads CSV and JSON files (tables, claims, the W&B report) starts in a
fraction of a second instead of the seconds torch and transformers take to import.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path


def start_job(log: str | Path, threads: int) -> None:
    """Send this job's stdout, stderr (progress bars) and logging to `log`, and use `threads` torch threads."""
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
