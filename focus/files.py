"""Writing files so that a killed process never leaves a half-written one behind."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable


def atomic_write(path: Path, write: Callable[[Path], object]) -> None:
    """Call `write(tmp)` on `<path>.tmp` beside `path`, flush it to disk, then rename it over `path`.

    `path` is either the old file or the complete new one; a failed write removes the temp file.
    """
    path = Path(path)
    tmp = path.with_name(f"{path.name}.tmp")
    try:
        write(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
