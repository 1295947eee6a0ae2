"""The group part of query-routed hard Focus as rectangles: each segment's queries attend to its keys.

With `route_queries="query"` a segment of subset T has two sides, the queries holding T and the keys holding T. Its
queries go in chunks; a chunk sees the segment's keys at least a window before its first query (all of them: no
mask, and chunks whose prefixes are equally long share one fused kernel call, unpadded) and a thin band of keys up to
a window before its last query (that cut as an additive mask); the pairs nearer than the window are the band's
(`band.band_part`). Every part returns its log-sum-exp, so `decomposed._merge` sums them exactly.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from focus.attention.kernels.segments import Entries, masked_with_lse, similar_lengths, subset_codes, subset_sign
from focus.attention.pattern.rule import GROUP_BITS, group_bits


class KeyRows(NamedTuple):
    """The key rows of every segment of the rectangle form, sorted by (segment, position)."""

    head: torch.Tensor  # (N,) batch * K + key/value head
    position: torch.Tensor  # (N,)
    order: torch.Tensor  # (N,) segment * L + position, sorted: what a query's visible keys are searched by
    query_order: torch.Tensor  # (M,) the same key of each query row of the entries
    # Segments of single groups, each pair once (`rectangle_entries(once=True)`): every key row's group bits (a sink's
    # all set), and every query row's bits of its groups below its segment's, the keys it skips there. Else None.
    bits: torch.Tensor | None = None  # (N,) int64
    query_skip: torch.Tensor | None = None  # (M,) int64



def rectangle_entries(groups_q, groups_k, valid, sinks, once: bool = False) -> tuple[Entries, KeyRows]:
    """Segments as (queries holding subset T) x (keys holding T) instead of their union: the query rows (entries,
    each a query of its segment) and the key rows, both sorted by (head, subset, position).

    `once`: segments of single groups only, every kept pair counted once, in the segment of the smallest group its
    query and key share; a query row skips the keys that hold one of its groups below the segment's (`KeyRows.bits`,
    `KeyRows.query_skip` are set: the native kernel's test). Taken at top-k > 1 with group ids below `GROUP_BITS` (else
    the bits stay None). Without it, with top-k > 1, a pair sharing m groups is counted in every subset of them, with
    the inclusion-exclusion sign: at top-2, three times.
    """
    b, k_heads, length, top_k = groups_k.shape
    device = groups_k.device
    base = max(int(groups_k.max()), int(groups_q.max())) + 2 if groups_k.numel() else 2
    code_span = base**top_k
    once = once and top_k > 1 and base - 2 < GROUP_BITS  # at top-1 every pair is counted once anyway
    head = torch.arange(b * k_heads, device=device).view(b, k_heads, 1, 1)
    position = torch.arange(length, device=device).view(1, 1, length, 1)

    def rows(groups, keep, extra):
        code = groups + 1 if once else subset_codes(groups, base)
        keep = keep[:, None, :, None].expand_as(code)
        segment = (head * code_span + code).expand_as(code)
        return segment[keep], position.expand_as(code)[keep], extra.expand_as(code)[keep]

    bits_q = bits_k = skip = torch.zeros((), dtype=torch.long, device=device)
    if once:
        groups_q, groups_k = groups_q.clamp_min(0), groups_k.clamp_min(0)  # (padding's ids, if any, are never read)
        bits_q, bits_k = (group_bits(g, keepdim=True) for g in (groups_q, groups_k))  # (B, K, L, 1)
        skip = bits_q & ((1 << groups_q) - 1)  # (B, K, L, k): the row's groups below its segment's
    q_segment, q_position, q_skip = rows(groups_q, valid, skip)
    k_segment, k_position, k_bits = rows(groups_k, valid & ~sinks, bits_k)
    if sinks.any():  # sink keys join every segment of their sequence that has a query
        present = torch.unique(q_segment)
        sink_b, sink_pos = sinks.nonzero(as_tuple=True)
        pair_seg, pair_sink = ((present // code_span)[:, None] // k_heads == sink_b[None, :]).nonzero(as_tuple=True)
        k_segment = torch.cat([k_segment, present[pair_seg]])
        k_position = torch.cat([k_position, sink_pos[pair_sink]])
        k_bits = torch.cat([k_bits, torch.full_like(pair_seg, -1)])  # a sink holds every group
    q_order, q_sort = (q_segment * length + q_position).sort()
    k_order, k_sort = (k_segment * length + k_position).sort()
    q_segment, q_position, k_segment = q_segment[q_sort], q_position[q_sort], k_segment[k_sort]
    _, lengths = torch.unique_consecutive(q_segment, return_counts=True)
    sign = torch.ones_like(q_position) if once else subset_sign(q_segment % code_span, base)
    entries = Entries(q_segment // code_span, q_position, sign, torch.ones_like(q_position, dtype=torch.bool),
                      torch.zeros_like(q_position, dtype=torch.bool), lengths.tolist())
    keys = KeyRows(k_segment // code_span, k_position[k_sort], k_order, q_order)
    if once:
        keys = keys._replace(bits=k_bits[k_sort], query_skip=q_skip[q_sort])
    return entries, keys


def rectangle_part(q, key, value, entries: Entries, keys: KeyRows, scaling: float, chunk: int, window: int,
                    quantum: int = 16, fill: float = 0.8):
    """Each segment's queries attend to its keys at least `window` positions before them (the decomposition's band
    takes the nearer pairs). Returns one row per part a query row of
    `entries` was attended in (its entry, fp32 output (P, R, D), log-sum-exp (P, R)); a query row that sees none of
    its segment's keys has none.

    A segment's queries go in chunks of `chunk`. A chunk sees a prefix of its segment's keys, in two calls merged by
    log-sum-exp: the keys before its first query that fill whole multiples of `quantum` (every query sees all of them:
    no mask, and chunks with prefixes of equal length share one fused kernel call, unpadded), then the rest up to its
    last query's reach (a thin band with the cut as an additive mask).
    """
    b, k_heads, r, length, d = q.shape
    device = q.device
    n = entries.position.numel()
    parts = []  # (query rows, output, log-sum-exp) of every call
    if n and keys.position.numel():
        # One gather of the rows by a flat (head, position) index; keys and values side by side.
        flat_q = q.permute(0, 1, 3, 2, 4).reshape(b * k_heads * length, r, d)
        flat_kv = torch.cat([key, value], dim=-1).reshape(b * k_heads * length, 2 * d)
        packed_q = flat_q.index_select(0, entries.head * length + entries.position)  # (N, R, D)
        packed_kv = flat_kv.index_select(0, keys.head * length + keys.position)  # (Nk, 2D)

        # Chunks: consecutive rows of one segment, at most `chunk` of them.
        sizes = torch.tensor(entries.lengths, device=device)
        seg_of_row = torch.repeat_interleave(torch.arange(sizes.numel(), device=device), sizes)
        rank = torch.arange(n, device=device) - (sizes.cumsum(0) - sizes)[seg_of_row]
        _, chunk_sizes = torch.unique_consecutive(seg_of_row * (n + 1) + rank // chunk, return_counts=True)
        chunk_start = chunk_sizes.cumsum(0) - chunk_sizes
        base = keys.query_order[chunk_start] - entries.position[chunk_start]  # segment * L: its keys' order from here
        key_first = torch.searchsorted(keys.order, base)  # the segment's first key
        # A query sees its segment's keys at least `window` before it: those at positions <= its own - window (-1:
        # none, which also keeps the search inside the segment).
        reach_first = torch.clamp_min(entries.position[chunk_start] - window, -1)
        reach_last = torch.clamp_min(entries.position[chunk_start + chunk_sizes - 1] - window, -1)
        before = torch.searchsorted(keys.order, base + reach_first, right=True) - key_first  # every query sees these
        full = before // quantum * quantum
        key_end = torch.searchsorted(keys.order, base + reach_last, right=True)

        def attend(items, k_first, k_count, masked):
            """Chunks `items` against `k_count` keys from `k_first`: an int (all equal, no mask) or one per chunk."""
            width = int(chunk_sizes[items].max())
            q_rows = (chunk_start[items, None] + torch.arange(width, device=device)).clamp_max(n - 1)  # (S, w)
            q_real = torch.arange(width, device=device) < chunk_sizes[items, None]
            span = int(k_count.max()) if masked else k_count
            k_rows = (k_first[:, None] + torch.arange(span, device=device)).clamp_max(keys.position.numel() - 1)
            kv = packed_kv.index_select(0, k_rows.flatten()).view(len(items), 1, span, 2 * d).expand(-1, r, -1, -1)
            qb = packed_q.index_select(0, q_rows.flatten()).view(len(items), width, r, d).transpose(1, 2)
            mask = None
            if masked:
                allowed = (torch.arange(span, device=device) < k_count[:, None])[:, None, :] & (
                    keys.position[k_rows][:, None, :] <= entries.position[q_rows][:, :, None] - window)  # (S, w, span)
                mask = torch.where(allowed, 0.0, float("-inf")).to(q.dtype)[:, None]
            if device.type == "cpu":
                blk_out, blk_lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                    qb, kv[..., :d], kv[..., d:], 0.0, False, attn_mask=mask, scale=scaling)
            else:
                no_mask = torch.zeros((), device=device)
                blk_out, blk_lse = masked_with_lse(qb, kv[..., :d], kv[..., d:], no_mask if mask is None else mask,
                                                   scaling)
            if masked:  # a row with no allowed key here has no part (the kernel's output there is not a softmax)
                q_real = q_real & allowed.any(dim=-1)
            parts.append((q_rows[q_real], blk_out.transpose(1, 2)[q_real], blk_lse.float().transpose(1, 2)[q_real]))

        for count in torch.unique(full[full > 0]).tolist():  # whole prefixes: one unmasked call per length
            items = (full == count).nonzero().squeeze(1)
            attend(items, key_first[items], count, masked=False)
        rest = key_end - key_first - full  # the band up to each chunk's last query
        for items in similar_lengths(rest, fill):
            attend(items, (key_first + full)[items], rest[items], masked=True)
    if not parts:
        parts.append((torch.zeros(0, dtype=torch.long, device=device), q.new_zeros(0, r, d), q.new_zeros(0, r)))
    rows, out, lse = (torch.cat(column) for column in zip(*parts))
    # One row per contribution: the merge sums every part of a query (its signs and log-sum-exps) as it does for
    # the other form's segments.
    return (Entries(entries.head[rows], entries.position[rows], entries.sign[rows], entries.member[rows],
                    entries.is_key[rows], []), out.float(), lse.float())
