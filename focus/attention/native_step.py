"""A decoding step as one native call: routing, index upkeep and the hard attention itself (`native_step.cpp`).

At the lengths models run, a Focus decoding step's arithmetic is small and its cost is the number of tensor ops: one
layer's eager step routes the new key and the query heads (rotary undone, cosine against the centroids, top-k),
writes the key's groups and group bits into the index, builds the hard mask from the bits and calls the fused
attention kernel over every key; some 70 ops and their Python, about 0.4 ms a layer on 2 CPU cores where the
unmodified attention over 1K keys takes 0.08 ms. The native step routes in plain loops, then attends over the keys
its mask keeps and only those (one AND of group bits per key, then blocks of 64 kept keys: their scores, one rescale
and a vectorised exp per query head, the weighted values summed in registers; an online softmax in float32, the cache
cut into chunks over the cores). With a trained adapter's uneven groups this beats the fused kernel over every key
under the mask at top-2 too, where the first, per-key version did not (docs/decoding.md). `torch.compile` of the
eager step fused it into 2 kernels of 30 us but kept 110 us of guard and wrapper overhead per call, and was slower
than eager inside the model.

It is compiled with the C++ compiler on first use (about a minute, then cached by torch under
~/.cache/torch_extensions); a `FocusCache(model)` of a model on the CPU runs it (`native=False` does not). From
`NATIVE_STEP_BELOW` keys on, where the sparse step pays, the sparse step (through the group lists) runs instead;
steps before every row has its sink tokens and any other device stay eager. Its routing is the eager step's, its
output the dense reference's within float32 rounding (`tests/test_native_step.py`).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import platform
from pathlib import Path

_log = logging.getLogger(__name__)

HEADERS = ("native_aten.h", "native_math.h")
"""The headers the native sources share (their text names the build)."""

ROUTE_QUERIES = {"key": 0, "query": 1, "kv_head": 2}
"""`FocusConfig.route_queries` as the native step's code."""


def _build() -> tuple[str, list[str]]:
    """(extension name, compiler flags). On x86-64 the loops are compiled for this CPU's vector units (-march=native:
    AVX-512 where it has it, where the default target is SSE2). With random keys, one layer, 9/3 heads, 2 EPYC cores,
    this build with its inlined exp reads top-1 at 1/2/4/8K keys in 55/71/125/246 us, the SSE2 build with std::exp in
    50/78/137/289 us, and top-2 (its loop) in 80/140/258/694 against 96/173/362/781 us. Such a build crashes on an
    older CPU, and torch's extension cache may be shared between machines (a home folder on a cluster), so the name
    carries the CPU's feature flags. It also carries the shared headers' text: torch's extension cache
    rebuilds when a source changes, not when a header does."""
    # -fno-trapping-math: floating-point exceptions are never read, so loops with selects (the softmax weights) vectorize;
    # the values are IEEE arithmetic as before (no reassociation).
    # -fopenmp: ATen's parallel_for is an inline OpenMP region, serial in a translation unit built without it (the
    # native parts then ran on one core).
    flags = ["-O3", "-fopenmp", "-fno-trapping-math"]
    here = Path(__file__).parent
    header = hashlib.sha1(b"".join((here / name).read_bytes() for name in HEADERS)).hexdigest()[:8]
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return f"focus_native_step_{header}", flags
    cpu = platform.processor()
    try:
        cpu = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
    except (OSError, StopIteration):
        pass
    return f"focus_native_step_{hashlib.sha1(cpu.encode()).hexdigest()[:10]}_{header}", flags + ["-march=native"]


@functools.cache
def native_step():
    """The compiled extension (built once per machine, then loaded from torch's extension cache)."""
    from torch.utils.cpp_extension import load

    _log.info("building Focus's native decoding step (once per machine, about a minute)")
    name, flags = _build()
    try:
        here = Path(__file__).parent
        parts = ("bindings", "step", "route", "rectangle", "segments", "merge")
        sources = [str(here / f"native_{part}.cpp") for part in parts]
        return load(name=name, sources=sources,
                    extra_cflags=flags, extra_ldflags=["-fopenmp"], verbose=False)
    except (RuntimeError, OSError, ImportError) as error:  # no compiler or ninja, or a failed build
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise RuntimeError(f"Focus's native CPU kernels could not be built ({first}); they need a C++ compiler and "
                           "ninja (pip install ninja)") from error
