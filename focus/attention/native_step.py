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
import logging
from pathlib import Path

_log = logging.getLogger(__name__)

ROUTE_QUERIES = {"key": 0, "query": 1, "kv_head": 2}
"""`FocusConfig.route_queries` as the native step's code."""

READ_KEPT_BELOW = 0.15
"""The native step reads only the keys its mask keeps when a routing head keeps fewer than this share of the distant
keys (`step_cost.distant_share`: top-1 of 16 groups, 6%); above it (top-2 of 16, 24%) it builds the mask and calls the
fused kernel over every key, which reads a key faster than its per-key loop. One layer, 9/3 heads, window 64, float32,
2 cores, query heads routed apart (`decode_step_native_fp32.md` and an earlier run of the loop): top-1 at 8K keys, the
loop 0.45-0.54 ms against SDPA over the whole cache 0.87-1.21 ms; top-2 at 16K and 32K keys, the loop 3.0 and 6.5 ms,
the fused kernel under the mask 2.2 and 4.8 ms. In generate() (1-8K prompts) the two were within the noise at top-2."""


@functools.cache
def native_step():
    """The compiled extension (built once per machine, then loaded from torch's extension cache)."""
    from torch.utils.cpp_extension import load

    _log.info("building Focus's native decoding step (once per machine, about a minute)")
    try:
        return load(name="focus_native_step", sources=[str(Path(__file__).with_name("native_step.cpp"))],
                    extra_cflags=["-O3", "-fopenmp-simd"], verbose=False)
    except (RuntimeError, OSError, ImportError) as error:  # no compiler or ninja, or a failed build
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise RuntimeError(f"FocusCache(compile_step=True) could not build its native step ({first}); it needs a "
                           "C++ compiler and ninja (pip install ninja); without them use FocusCache(model)") from error
