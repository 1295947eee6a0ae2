"""The native kernels' build: one extension compiled from `csrc/` by torch's extension builder on first use (then
loaded from its cache under ~/.cache/torch_extensions), and the one place a failed build is handled
(`kernels_built`)."""

from __future__ import annotations

import functools
import hashlib
import logging
import platform
import time
import warnings
from pathlib import Path

from focus.attention.pattern.rule import GROUP_BITS

_log = logging.getLogger(__name__)

CSRC = Path(__file__).parent / "csrc"
"""The C++ sources and the headers they share."""

SOURCES = ("bindings", "step", "indexer_step", "route", "rectangle", "rectangle_amx", "segments", "merge", "pattern")
"""The translation units of the extension, `csrc/<name>.cpp`."""

MAX_DIM = 256
"""The largest head size the prompt kernels take (`csrc/rectangle.cpp`); larger heads run eagerly."""

ROUTE_QUERIES = {"key": 0, "query": 1, "kv_head": 2}
"""`FocusConfig.route_queries` as the native step's code."""

DEFINES = {
    "FOCUS_GROUP_BITS": GROUP_BITS,
    "FOCUS_MAX_DIM": MAX_DIM,
    **{f"FOCUS_ROUTE_BY_{name.upper()}": code for name, code in ROUTE_QUERIES.items()},
}
"""The values the C++ shares with Python, defined here once and handed to the compiler (`csrc/kernels.h` names them)."""


def build_settings() -> tuple[str, list[str], list[str]]:
    """(extension name, compiler flags, source paths).

    On x86-64 the loops are compiled for this CPU's vector units (-march=native: AVX-512 where it has it, where the
    default target is SSE2; docs/decoding.md has the timings). Such a build crashes on an older CPU, and torch's
    extension cache may be shared between machines (a home folder on a cluster), so the name carries the CPU's
    feature flags. It also carries the headers' text: torch's extension cache rebuilds when a source changes, not
    when a header does."""
    # -fno-trapping-math: floating-point exceptions are never read, so loops with selects (the softmax weights)
    # vectorize; the values stay IEEE arithmetic (no reassociation).
    # -fopenmp: ATen's parallel_for is an inline OpenMP region, serial in a translation unit built without it.
    flags = ["-O3", "-fopenmp", "-fno-trapping-math", *define_flags()]
    sources = [str(CSRC / f"{name}.cpp") for name in SOURCES]
    headers = sorted(CSRC.glob("*.h"))
    header = hashlib.sha1(b"".join(path.read_bytes() for path in headers)).hexdigest()[:8]
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return f"focus_native_{header}", flags, sources
    cpu = platform.processor()
    try:
        cpu = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
    except (OSError, StopIteration):
        pass
    return f"focus_native_{hashlib.sha1(cpu.encode()).hexdigest()[:10]}_{header}", flags + ["-march=native"], sources


def define_flags() -> list[str]:
    """`DEFINES` as compiler flags (a build of other flags needs them too: `benchmarks/native_step_builds.py`)."""
    return [f"-D{name}={value}" for name, value in DEFINES.items()]


@functools.cache
def kernels():
    """The compiled extension (built once per machine, then loaded from torch's extension cache). Raises
    RuntimeError, in one line, where it cannot be built."""
    from torch.utils.cpp_extension import load

    _log.info("building Focus's native CPU kernels (once per machine, about a minute)")
    name, flags, sources = build_settings()
    clear_stale_lock(name)
    try:
        return load(name=name, sources=sources, extra_cflags=flags, extra_ldflags=["-fopenmp"], verbose=False)
    except (RuntimeError, OSError, ImportError) as error:  # no compiler or ninja, or a failed build
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise RuntimeError(f"Focus's native CPU kernels could not be built ({first}); they need a C++ compiler and "
                           "ninja (pip install ninja)") from error


STALE_LOCK_SECONDS = 900
"""A build lock older than this was left by a build that died: a build takes about a minute on 2 cores."""


def clear_stale_lock(name: str) -> bool:
    """Remove the build lock of extension `name` where a killed build left it; returns whether one was removed.

    torch's extension builder guards a build with a `lock` file in its build folder and waits for it to go, with no
    time limit: a build stopped midway (Ctrl-C, a job's time limit) leaves it, and every later process would hang at
    its first native call, silently. A lock older than `STALE_LOCK_SECONDS` is no live build's."""
    from torch.utils.cpp_extension import _get_build_directory  # private, but the builder's own rule for the folder

    lock = Path(_get_build_directory(name, verbose=False)) / "lock"
    try:
        age = time.time() - lock.stat().st_mtime
    except OSError:  # no lock: the usual case
        return False
    if age < STALE_LOCK_SECONDS:
        _log.info("another process is building the native kernels (%s); waiting for it", lock)
        return False
    _log.warning("removing the lock a killed build left %.0f min ago (%s)", age / 60, lock)
    lock.unlink(missing_ok=True)
    return True


_BUILD_FAILED: list[str] = []
"""Why the native kernels could not be built in this process, once it is known: neither rebuilt nor warned again."""


def kernels_built(required: bool) -> bool:
    """Whether the native kernels are built (or load) in this process. Where they cannot be: `required` raises the
    build's one-line error; otherwise the failure is remembered for the process, warned of once (a FocusCache then
    runs the eager PyTorch path) and False returned, without a second try."""
    if _BUILD_FAILED and not required:
        return False
    try:
        kernels()
    except RuntimeError as error:
        if required:
            raise
        _BUILD_FAILED.append(str(error).splitlines()[0])
        # stacklevel: the warning points at the line that made the FocusCache (this, the cache's check, its __init__).
        warnings.warn(f"{_BUILD_FAILED[0]}; FocusCache runs the eager PyTorch path (slower)", RuntimeWarning,
                      stacklevel=4)
        return False
    return True
