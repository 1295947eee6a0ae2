"""Writing files and folders so that a killed process never leaves a half-written one behind."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
import uuid
from pathlib import Path
from typing import Callable

_STALE_TEMP_SECONDS = 3600  # temp folders older than this were left by a killed writer


def atomic_write(path: Path, write: Callable[[Path], object]) -> None:
    """Call `write(tmp)` on `<path>.tmp` beside `path`, flush it to disk, then rename it over `path`, creating the
    parent folder if needed.

    `path` is either the old file or the complete new one; a failed write removes the temp file.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp")
    try:
        write(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_text(path: str | os.PathLike, text: str) -> None:
    """Write `text` to `path` atomically, creating the parent folder if needed."""
    path = Path(path)
    atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def write_json(path: str | os.PathLike, record: dict) -> None:
    """Write `record` as indented JSON with sorted keys, atomically (a diff-friendly, self-describing record)."""
    write_text(path, json.dumps(record, indent=2, sort_keys=True) + "\n")


def write_folder_atomically(target: Path, write: Callable[[Path], None]) -> None:
    """Run `write(tmp)` on a fresh temporary sibling folder of `target`, then rename it to `target`.

    A failure (or a killed process) leaves `target` as it was: never half written. An existing `target` is
    replaced. If another process renamed its own complete copy into place first, that copy is kept.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_temps(target)
    # Not tempfile.mkdtemp: that makes the folder private (0700); mkdir honours the umask like any cache.
    tmp = target.parent / f".tmp-{target.name}-{uuid.uuid4().hex}"
    tmp.mkdir()
    try:
        write(tmp)
        if target.exists():
            # A rename cannot replace a non-empty folder: move the old one aside first, drop it after.
            old = Path(tempfile.mkdtemp(prefix=f".tmp-{target.name}-old-", dir=target.parent))
            os.rename(target, old / target.name)
            shutil.rmtree(old, ignore_errors=True)
        try:
            os.rename(tmp, target)
        except OSError:
            if not target.is_dir():
                raise
            # Lost a race with a concurrent conversion: its folder is equally complete.
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _remove_stale_temps(target: Path) -> None:
    """Delete temp folders of `target` left behind by a writer that was killed an hour or more ago."""
    now = time.time()
    for stale in target.parent.glob(f".tmp-{target.name}-*"):
        try:
            if now - stale.stat().st_mtime > _STALE_TEMP_SECONDS:
                shutil.rmtree(stale, ignore_errors=True)
        except OSError:
            pass  # removed by someone else meanwhile
