"""Focus's native CPU kernels: a decoding step, a prompt's routing and the query-routed prefill's parts, each one C++
call (`csrc/`), built on first use (`build`) with Python bindings for the prefill (`prefill`).

A decoding step's arithmetic is small at the lengths models run, and its eager cost is the number of tensor ops: one
layer's eager step routes the new key and the query heads (rotary undone, cosine against the centroids, top-k),
writes the key's groups and group bits into the index, builds the hard mask from the bits and calls the fused
attention kernel over every key. The native step routes in plain loops, then attends over the keys its mask keeps and
only those (one AND of group bits per key, then blocks of kept keys: their scores, one rescale and a vectorised exp
per query head, the weighted values summed in registers; an online softmax in float32, the cache cut into chunks over
the cores). docs/decoding.md has its measurements, and those of what was tried instead.

A `FocusCache(model)` of a model on the CPU runs these kernels (`native=False` does not); where they cannot be built,
`kernels_built` decides once per process what happens (an error when they were asked for, else one warning and the
eager path). From `focus.attention.dispatch.step_cost.NATIVE_STEP_BELOW` keys on, where the sparse step pays, the sparse
step (through the group lists) runs instead; steps before every row has its sink tokens and any other device stay eager.
Their routing is the eager routing's, their outputs the dense reference's within float32 rounding
(`tests/test_native_step.py`, `tests/test_decomposed.py`).

The names below are the room's entry points; nothing outside it imports its modules (`tests/test_layout.py`).
"""

from focus.attention.native.build import MAX_DIM, ROUTE_QUERIES, build_settings, define_flags, kernels, kernels_built
from focus.attention.native.prefill import native_routed_prefill

__all__ = [
    "MAX_DIM",
    "ROUTE_QUERIES",
    "build_settings",
    "define_flags",
    "kernels",
    "kernels_built",
    "native_routed_prefill",
]
