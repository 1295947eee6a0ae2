"""Writing files and folders so that a killed process never leaves a half-written one behind."""

from __future__ import annotations

import errno
import json
import os
import shutil
import tempfile
import time
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

_STALE_TEMP_SECONDS = 3600  # temp folders older than this were left by a killed writer


class DiskFullError(OSError):
    """A write ran out of space (or quota). The message is one line: the file, how much of it was written, where."""

    def __str__(self) -> str:
        return self.strerror  # without OSError's "[Errno 28] " before the line


def atomic_write(path: Path, write: Callable[[Path], object]) -> None:
    """Call `write(tmp)` on `<path>.tmp` beside `path`, flush it to disk, then rename it over `path`, creating the
    parent folder if needed. The file gets the mode a plain `open()` gives under the user's umask, whatever mode the
    writer gave its temp file (safetensors' is private), so a folder a team shares stays readable to it.

    `path` is either the old file or the complete new one; a failed write removes the temp file.

    Raises:
        DiskFullError: the disk (or quota) filled up while writing: one line naming `path`; the old file is intact.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp")
    try:
        write(tmp)
        os.chmod(tmp, 0o666 & ~_umask())
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except Exception as err:
        if _out_of_space(err):
            written = tmp.stat().st_size if tmp.exists() else 0
            free = shutil.disk_usage(path.parent).free
            raise DiskFullError(errno.ENOSPC, f"no space left to write {path} ({_size(written)} of it written, "
                                f"{_size(free)} free in {path.parent})") from None
        raise
    finally:
        tmp.unlink(missing_ok=True)


@contextmanager
def naming_a_full_disk(path: Path) -> Iterator[None]:
    """Turn a full disk inside the block (appends to `path`, such as a metrics log) into one `DiskFullError` line
    naming `path`."""
    try:
        yield
    except OSError as err:
        if not _out_of_space(err):
            raise
        path = Path(path)
        free = shutil.disk_usage(path.parent).free
        raise DiskFullError(errno.ENOSPC, f"no space left to write {path} ({_size(free)} free in {path.parent})") \
            from None


def _out_of_space(err: BaseException) -> bool:
    """Whether `err` is a full disk or quota: an OSError, a writer's own error that carries the OS's text (safetensors
    raises its own type) or one raised while handling such an OSError."""
    if isinstance(err, DiskFullError):
        return False  # already one line, from a nested write
    while err is not None:  # torch.save's error on a Python file is raised while handling the OSError
        if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if any(text in str(err) for text in ("No space left on device", "Disk quota exceeded")):
            return True
        err = err.__cause__ or err.__context__
    return False


def _size(count: int) -> str:
    return f"{count / 2**20:.1f} MiB" if count >= 2**20 else f"{count:,} bytes"


def _umask() -> int:
    """The process's umask, read without changing it where Linux says it (/proc), else by setting it back at once."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


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
        try:
            write(tmp)
        except Exception as err:
            if _out_of_space(err):
                free = shutil.disk_usage(target.parent).free
                raise DiskFullError(errno.ENOSPC, f"no space left to write {target} ({_size(_tree_size(tmp))} of it "
                                    f"written, {_size(free)} free in {target.parent})") from None
            raise
        _follow_umask(tmp)
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


def _follow_umask(folder: Path) -> None:
    """Give every file and folder under `folder` the mode plain `open()` and `mkdir` give under the umask (writers such
    as safetensors make their files private)."""
    mask = _umask()
    for path in [folder, *folder.rglob("*")]:
        if not path.is_symlink():
            os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~mask)


def _tree_size(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())


def _remove_stale_temps(target: Path) -> None:
    """Delete temp folders of `target` left behind by a writer that was killed an hour or more ago."""
    now = time.time()
    for stale in target.parent.glob(f".tmp-{target.name}-*"):
        try:
            if now - stale.stat().st_mtime > _STALE_TEMP_SECONDS:
                shutil.rmtree(stale, ignore_errors=True)
        except OSError:
            pass  # removed by someone else meanwhile
