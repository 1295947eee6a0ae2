"""A decoding step as one native call: routing, index upkeep and the hard attention itself (`native_step.cpp`).

At the lengths models run, a Focus decoding step's arithmetic is small and its cost is the number of tensor ops: one
layer's eager step routes the new key and the query heads (rotary undone, cosine against the centroids, top-k),
writes the key's groups and group bits into the index, builds the hard mask from the bits and calls the fused
attention kernel over every key; some 70 ops and their Python, about 0.4 ms a layer on 2 CPU cores where the
unmodified attention over 1K keys takes 0.08 ms. The native step routes in plain loops, then attends over the keys
its mask keeps and only those (one AND of group bits per key, an online softmax per query head in float32, the cache
cut into chunks over the cores). `torch.compile` of the eager step fused it into 2 kernels of 30 us but kept 110 us
of guard and wrapper overhead per call, and was slower than eager inside the model (docs/decoding.md).

It is compiled with the C++ compiler on first use (about a minute, then cached by torch under
~/.cache/torch_extensions), so it is opt-in: `FocusCache(model, compile_step=True)`. CPU tensors only. From
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

ROUTE_QUERIES = {"key": 0, "query": 1, "kv_head": 2}
"""`FocusConfig.route_queries` as the native step's code."""

READ_KEPT_BELOW = 0.3
"""The native step reads only the keys its mask keeps when a routing head keeps fewer than this share of the distant
keys (`step_cost.distant_share`: top-1 of 16 groups 6%, top-2 24%); above it (top-3 of 16: 49%) it builds the mask
and calls the fused kernel over every key instead. One layer, 9/3 heads, window 64, float32, 2 EPYC cores, random
keys in 2 of 16 groups, loops built for the CPU (`_build`): the loop 80/140/258/694 us at 1/2/4/8K keys, the fused
kernel under the mask 117/190/342/694 us, SDPA over every key without a mask 81/156/273/566 us."""


def _build() -> tuple[str, list[str]]:
    """(extension name, compiler flags). On x86-64 the loops are compiled for this CPU's vector units (-march=native:
    AVX-512 where it has it, where the default target is SSE2): the top-2 step 1.0-1.1x of SDPA at 1-4K keys against
    0.8x (one layer, 9/3 heads, 2 EPYC cores). Such a build crashes on an older CPU, and torch's extension cache may
    be shared between machines (a home folder on a cluster), so the name carries the CPU's feature flags."""
    flags = ["-O3", "-fopenmp-simd"]
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return "focus_native_step", flags
    cpu = platform.processor()
    try:
        cpu = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
    except (OSError, StopIteration):
        pass
    return f"focus_native_step_{hashlib.sha1(cpu.encode()).hexdigest()[:10]}", flags + ["-march=native"]


@functools.cache
def native_step():
    """The compiled extension (built once per machine, then loaded from torch's extension cache)."""
    from torch.utils.cpp_extension import load

    _log.info("building Focus's native decoding step (once per machine, about a minute)")
    name, flags = _build()
    try:
        return load(name=name, sources=[str(Path(__file__).with_name("native_step.cpp"))], extra_cflags=flags,
                    verbose=False)
    except (RuntimeError, OSError, ImportError) as error:  # no compiler or ninja, or a failed build
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise RuntimeError(f"FocusCache(compile_step=True) could not build its native step ({first}); it needs a "
                           "C++ compiler and ninja (pip install ninja); without them use FocusCache(model)") from error
