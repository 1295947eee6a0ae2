"""The query-routed prefill as native calls (`csrc/rectangle.cpp`, `csrc/segments.cpp`, `csrc/merge.cpp`): what a
`FocusCache(model)` prefill runs on the CPU instead of the eager parts of `focus.attention.kernels.decomposed`, with the
same pairs, the same (output, log-sum-exp) and the same merge. `native_routed_prefill` is the whole of it, four calls;
the plan (`focus.attention.dispatch.planning`) sends it the calls it takes (group ids below `GROUP_BITS`, padding only
on the left).

Each query row reads one contiguous run of keys in place: its segment's keys at least a window before it (the
rectangles), or its key/value head's keys within the window (the band). The eager parts gather keys into padded
batches for many fused-kernel calls, or mask a block of keys wider than the window.
"""

from __future__ import annotations

import torch

from focus.attention.labels import label
from focus.attention.native.build import MAX_DIM, kernels
from focus.attention.pattern.rule import GROUP_BITS


def native_routed_prefill(query, key, value, groups_q, groups_k, window: int, valid, sinks, scaling: float,
                          matrix_units: bool = True):
    """The query-routed decomposition (`decomposed.decomposed_hard_attention` with `query_groups`) in four native calls:
    the band, the segments (`csrc/segments.cpp`: single groups, each kept pair once, as
    `rectangle_entries(once=True)`), their rectangles and the merge. No repeated keys, no sorts, no searches.

    Args:
        query (B, H, L, D); key, value (B, K, L, D); groups_q (B, Hq, L, k): each query head's groups (Hq = H), or
        those its key/value head's query heads share (Hq = K); groups_k (B, K, L, k); valid, sinks (B, L) bool;
        matrix_units: bfloat16 rectangles on the CPU's matrix units (AMX) where it has them, else its vector units.
    Returns:
        (B, H, L, D) float32.
    Raises:
        ValueError where the kernels do not apply: group ids from `GROUP_BITS` on (they do not fit the segments' group
        bits), padding not only on the left (a row's keys in the window would not be one run), heads over `MAX_DIM`.
    """
    b, h, length, d = query.shape
    q_heads = groups_q.shape[1]
    r = h // q_heads
    if d > MAX_DIM:
        raise ValueError(f"the native prefill takes heads of at most {MAX_DIM}, not {d}")
    if groups_q.numel() and max(int(groups_q.max()), int(groups_k.max())) >= GROUP_BITS:
        raise ValueError(f"the native prefill takes group ids below {GROUP_BITS}")
    with label("focus/native_band"):  # (labels for torch.profiler: benchmarks/profile_focus.py)
        band = native_band_part(query, key, value, window, valid, scaling, matrix_units)
    ext = kernels()
    with label("focus/native_segments"):
        query_rows, first, count, skip, key_rows, bits = ext.segment_rows(
            groups_q.contiguous(), groups_k.contiguous(), valid.contiguous(), sinks.contiguous(), window)
    with label("focus/native_rectangles"):
        grouped = query.view(b, q_heads, r, length, d).transpose(2, 3).reshape(b * q_heads * length, r, d).contiguous()
        out, lse = ext.rectangles(grouped, key.reshape(-1, d).contiguous(), value.reshape(-1, d).contiguous(), first,
                                  count, scaling, query_rows, key_rows, skip, bits, matrix_units)
    with label("focus/native_merge"):
        band_out, band_lse = band
        merged = ext.merge_parts(band_out.view(b, q_heads, r, length, d), band_lse.view(b, q_heads, r, length), out,
                                 lse, query_rows, torch.ones_like(query_rows), valid.contiguous())
    return merged.view(b, h, length, d)


def native_band_part(query, key, value, window: int, valid: torch.Tensor, scaling: float, matrix_units: bool = True):
    """`band.band_part` as one native call: every pair with 0 <= i - j < window (j a real token), outputs
    (B, H, L, D) fp32 and log-sum-exp (B, H, L) (-inf where a query sees no key); padding only on the left (else
    ValueError: a row's keys would not be one run)."""
    b, h, length, d = query.shape
    k_heads = key.shape[1]
    r = h // k_heads
    padding = (~valid).sum(dim=1)  # (B,) leading padding tokens, if the padding is only leading
    position = torch.arange(length, device=query.device)
    if not torch.equal(valid, position[None] >= padding[:, None]):
        raise ValueError("the native band takes padding only on the left")
    start = torch.maximum(position[None] - window + 1, padding[:, None])  # (B, L) each query's first key
    count = (position[None] + 1 - start).clamp_min(0)  # a padding query reads nothing
    rows = torch.arange(b * k_heads, device=query.device).view(b, k_heads, 1) * length  # (B, K, 1) head offsets
    first = (rows + start[:, None]).flatten()  # rows in (batch, kv head, position) order
    count = count[:, None].expand(b, k_heads, length).flatten()
    grouped = query.view(b, k_heads, r, length, d).transpose(2, 3).reshape(b * k_heads * length, r, d).contiguous()
    out, lse = kernels().rectangles(grouped, key.reshape(-1, d).contiguous(), value.reshape(-1, d).contiguous(),
                                        first, count, scaling, None, None, None, None, matrix_units)
    out = out.view(b, k_heads, length, r, d).transpose(2, 3).reshape(b, h, length, d)
    return out, lse.view(b, k_heads, length, r).transpose(2, 3).reshape(b, h, length)
