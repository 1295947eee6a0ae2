"""Which decoding step a cache length calls for: the masked step (every key read in place under the hard mask), the
sparse step (the keys of the query's groups, read through the group lists) or the native step (one C++ call).

The three give the same output (`focus.attention.cache.decoding`, `focus.attention.native`); what differs is their
cost, modelled here from one-layer measurements on 2 CPU cores (bench_decode's `decode_step` tables; the numbers behind
each constant and the builds that measured them are in docs/decoding.md, "Where the step constants come from").
"""

from __future__ import annotations

import functools
import math

SPARSE_KEY_COST = 3.0
"""A key a sparse step reads (gathered, scored by a small GEMM, its value summed by a bag) costs about this many keys
that a masked step reads in place (fitted on the one-layer key/value-head step table of commit ecf8a37, an AMD EPYC;
docs/decoding.md)."""

SPARSE_STEP_FIXED_KEYS = 2800
"""The fixed cost of a sparse step (selecting its keys through the group lists, keeping the lists up to date), in keys
a masked step reads in place: the sparse step pays once the keys it skips outweigh it. Fitted on one SmolLM2-shaped
layer (9/3 heads), 16 groups, window 64, float32."""

NATIVE_STEP_BELOW = 131072
"""Below this many cached keys a step runs native (`focus.attention.native`) even where the sparse step beats the
eager masked one: the native step has no op overhead and reads only the keys its mask keeps. The longest cache
measured: it beat the sparse step by 1.2x or more at every length from 1K to 128K keys, top-1 and top-2, 1/1 and 9/3
heads, windows 64 and 256, query and kv_head routing (`benchmarks/results/speed/bench/decode_step.md`, a Xeon with AMX;
32K on an AVX2 EPYC); beyond what was measured, the cost model decides."""


def distant_share(num_groups: int, top_k: int) -> float:
    """The share of distant keys a routing head keeps with balanced groups, top-k of G on both sides:
    1 - C(G - k, k) / C(G, k) (top-1 of 16: 6%; top-2: 24%)."""
    return 1 - math.comb(num_groups - top_k, top_k) / math.comb(num_groups, top_k)


def sparse_step_pays(num_groups: int, top_k: int, routing_heads: int, k_heads: int, length: int) -> bool:
    """Whether a decoding step over `length` cached keys should read its groups' keys through the lists (sparse)
    rather than every key under the hard mask (masked; the same output).

    Each of the `routing_heads` (the query heads, or the `k_heads` key/value heads when their query heads share
    groups) reads the distant keys sharing a group with its own: with balanced groups, a share 1 - C(G - k, k) / C(G, k)
    of them (top-k of G groups on both sides). Counted at `SPARSE_KEY_COST` each, against the masked step's
    `k_heads` reads of every key, plus the sparse step's fixed cost (`SPARSE_STEP_FIXED_KEYS`)."""
    return length >= _sparse_from(num_groups, top_k, routing_heads, k_heads)


@functools.cache
def _sparse_from(num_groups: int, top_k: int, routing_heads: int, k_heads: int) -> float:
    """The cache length from which `sparse_step_pays` (found once per layout: a step asks at every layer)."""
    share = distant_share(num_groups, top_k)
    relative = SPARSE_KEY_COST * routing_heads * share / k_heads  # the sparse step's reads over the masked step's
    return SPARSE_STEP_FIXED_KEYS / (1 - relative) if relative < 1 else math.inf
