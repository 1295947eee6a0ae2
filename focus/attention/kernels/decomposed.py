"""Hard top-k Focus attention as standard causal attention calls merged by log-sum-exp (no custom kernel).

The hard pattern (reference.hard_allowed) keeps a pair (i, j <= i) of real tokens when i - j < window, or when
the two share a group (sink keys share every group). It is computed as two parts whose pairs never overlap:

- **group part**: tokens stably sorted by group; each group is one causal segment, attended with an unmasked
  causal kernel that returns its log-sum-exp. With top-k > 1 a pair sharing m groups would be counted m times,
  so segments are formed for every non-empty subset T of a token's groups (the tokens holding all of T) and
  merged with sign (-1)^(|T|+1): by inclusion-exclusion each pair sharing a group counts exactly once. Top-1
  needs only the group segments. Sink keys join every segment (as keys; as queries only where they belong).
- **local part**: the pairs within the window that share no group (and are not sink keys), a band of width
  `window` computed blockwise with an explicit mask: thin, so its mask is cheap, and the big group part stays
  mask-free (a mask there costs most of the speed).

Every allowed pair is counted exactly once, so merging both parts' (output, log-sum-exp) gives the dense
masked reference. Forward only: hard mode is for inference (training uses the soft pattern).

**Query-side routing** (`query_groups`: each query head has groups of its own, a key its key's groups): a pair is kept
when the query's groups meet the key's. Every query head then runs as a key/value head of its own (keys repeated),
and a segment of subset T has two sides: the queries holding T and the keys holding T. On the "torch" backend the
queries attend to the keys (a rectangle, `focus.attention.kernels.rectangle`): in chunks of queries, each against the
keys before it (unmasked) and a thin band up to its last query (masked). The union form (below) would run the
position-sorted union of both as one causal call: about four times the pairs when a segment's queries and keys are as
many and distinct. There the two parts split by distance instead of by group: the **band** (`band.band_part`) takes every
pair within the window, whatever its groups, so one band mask serves all heads and the query heads of a key/value head
share its keys; the rectangles take only the pairs at least `window` apart (their band masks cut there), which costs
less than a group-bit mask per head and block (docs/decomposition.md has the timings).

"flash" backend, union form: a row that is only a query is never attended to because its key gets an extra head
dimension that puts its logit at -1e4 / scale below everything (exp(-1e4) is 0 in float32) while queries get a 1
there. Still standard causal kernels, no mask; the cost is the union's length instead of the keys'.

Backends: "flash" (flash-attn `flash_attn_varlen_func`, all segments in one call; CUDA), "torch" (one
`_scaled_dot_product_flash_attention_for_cpu`-style call per segment: PyTorch's fused causal kernel that also returns
the log-sum-exp) and "native" (query-routed, CPU: the band, the segments, the rectangles and the merge as four native
calls, `focus.attention.native.native_routed_prefill`). A model's calls take the backend of their plan
(`focus.attention.dispatch.planning`); a direct call without one runs "torch", which every device has.
"""

from __future__ import annotations

import math

import torch

from focus.attention.kernels.band import band_part, local_part
from focus.attention.kernels.rectangle import rectangle_entries, rectangle_part
from focus.attention.kernels.segments import Entries, similar_lengths, subset_codes, subset_sign
from focus.attention.labels import label
from focus.attention.native import native_routed_prefill

BACKENDS = ("flash", "torch", "native")



def decomposed_hard_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    groups: torch.Tensor,
    window: int,
    valid: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
    scaling: float | None = None,
    backend: str = "torch",
    block: int = 64,
    query_groups: torch.Tensor | None = None,
    chunk: int = 64,
    matrix_units: bool = True,
) -> torch.Tensor:
    """Hard Focus attention of a full sequence (queries = keys, causal), decomposed.

    Args:
        query: (B, H, L, D); key, value: (B, K, L, D), H = K * R (grouped-query heads share their key's pattern).
        groups: (B, K, L, k) long, the top-k group ids of every token (distinct per token).
        window: local window w >= 1: pairs with i - j < w are kept.
        valid: (B, L) bool, False for padding; None when nothing is padded.
        sinks: (B or 1, L) bool sink keys (every group holds them); None for none.
        scaling: softmax scale (default D ** -0.5).
        backend: "flash", "torch" or "native" (with `query_groups`: see the module docstring); a model's
            plan chooses it (`focus.attention.dispatch.facts.decomposition_backend`).
        block: query block length of the local part.
        query_groups: (B, H, L, k) long, each query head's own groups (`route_queries="query"`), or (B, K, L, k),
            the groups that the query heads of each key/value head share (`"kv_head"`); None: a query takes its
            token's key groups, `groups`.
        chunk: queries per kernel row block of the group part when `query_groups` is given ("torch" backend).
        matrix_units: "native", bfloat16: its rectangles on the CPU's matrix units (AMX) where it has them, else its
            vector units.

    Returns:
        (B, H, L, D) in the dtype of `query`; rows of padding queries are zero.
    """
    b, h, length, d = query.shape
    scaling = d**-0.5 if scaling is None else scaling
    if valid is None:
        valid = torch.ones(b, length, dtype=torch.bool, device=query.device)
    sinks = torch.zeros_like(valid) if sinks is None else sinks.expand(b, length) & valid
    if backend == "native":
        if query_groups is None:
            raise ValueError("the native decomposition takes query-routed calls (query_groups)")
        with label("focus/decomposed_native"):
            out = native_routed_prefill(query, key, value, query_groups, groups, window, valid, sinks, scaling,
                                        matrix_units)
        return out.to(query.dtype)
    key_band, value_band = key, value
    if query_groups is not None and query_groups.shape[1] != key.shape[1]:
        # Each query head has a pattern of its own: run it as a key/value head of its own, keys repeated.
        repeat = h // key.shape[1]
        key, value, groups = (t.repeat_interleave(repeat, dim=1) for t in (key, value, groups))
    k_heads = key.shape[1]
    r = h // k_heads
    groups, _ = groups.sort(dim=-1)  # subsets are keyed by their sorted members
    groups_q = groups if query_groups is None else query_groups.sort(dim=-1)[0]

    q = query.view(b, k_heads, r, length, d)  # (B, K, R, L, D)
    if query_groups is not None and backend == "torch":
        # Queries and keys of a segment differ: attend queries to keys (a rectangle), not their union to itself.
        # The window's pairs all go to the band (no group test there); the rectangles take the distant ones, a pair
        # sharing two groups three times, signed (inclusion-exclusion).
        with label("focus/decomposed_local"):
            local_out, local_lse = band_part(query, key_band, value_band, window, valid, block, scaling)
            local_out = local_out.view(b, k_heads, r, length, d)
            local_lse = local_lse.view(b, k_heads, r, length)
        with label("focus/decomposed_sort"):
            entries, key_rows = rectangle_entries(groups_q, groups, valid, sinks)
        with label("focus/decomposed_groups"):
            entries, seg_out, seg_lse = rectangle_part(q, key, value, entries, key_rows, scaling, chunk, window)
    else:
        with label("focus/decomposed_local"):
            local_out, local_lse = local_part(q, key, value, groups_q, groups, window, valid, sinks, scaling, block)
        with label("focus/decomposed_sort"):
            entries = _group_entries(groups_q, groups, valid, sinks)
        with label("focus/decomposed_groups"):
            seg_out, seg_lse = _group_part(q, key, value, entries, scaling, backend)
    with label("focus/decomposed_merge"):
        out = _merge(local_out, local_lse, seg_out, seg_lse, entries, valid)  # (B, K, R, L, D)
    return out.reshape(b, h, length, d).to(query.dtype)


# ---- group part ------------------------------------------------------------------------------------------------


def _group_entries(groups_q: torch.Tensor, groups_k: torch.Tensor, valid: torch.Tensor, sinks: torch.Tensor) -> Entries:
    b, k_heads, length, top_k = groups_k.shape
    device = groups_k.device
    highest = max(int(groups_k.max()), int(groups_q.max())) if groups_k.numel() else 0
    base = highest + 2
    code_span = base**top_k
    head = torch.arange(b * k_heads, device=device).view(b, k_heads, 1, 1)
    position = torch.arange(length, device=device).view(1, 1, length, 1)
    keep = valid[:, None, :, None]

    def rows(groups, is_query, is_key):
        code = subset_codes(groups, base)
        mask = keep.expand_as(code)
        count = int(mask.sum())
        return (head.expand_as(code)[mask], code[mask], position.expand_as(code)[mask],
                torch.full((count,), is_query, device=device), torch.full((count,), is_key, device=device))

    if groups_q is groups_k:  # one group set per token: every row is a query and a key of its segment
        parts = [rows(groups_k, True, True)]
    else:
        parts = [rows(groups_q, True, False), rows(groups_k, False, True)]
    head, code, position, member, is_key = (torch.cat(column) for column in zip(*parts))

    if sinks.any():
        # Sink keys join, as keys, every segment of their sequence.
        segment = torch.unique(head * code_span + code)  # (S,) one key per (head, subset) present
        seg_head, seg_code = segment // code_span, segment % code_span
        sink_b, sink_pos = sinks.nonzero(as_tuple=True)
        pair_seg, pair_sink = (seg_head[:, None] // k_heads == sink_b[None, :]).nonzero(as_tuple=True)
        count = pair_seg.numel()
        head, code = torch.cat([head, seg_head[pair_seg]]), torch.cat([code, seg_code[pair_seg]])
        position = torch.cat([position, sink_pos[pair_sink]])
        member = torch.cat([member, torch.zeros(count, dtype=torch.bool, device=device)])
        is_key = torch.cat([is_key, torch.ones(count, dtype=torch.bool, device=device)])

    # One row per (head, subset, position): a token that is a query and a key of a segment (or a sink that is
    # also a member) is one row with both roles.
    keys = _row_keys(head, code, position, code_span, length)
    unique, inverse = torch.unique(keys, return_inverse=True)
    member = torch.zeros(unique.numel(), dtype=torch.long, device=device).index_add_(0, inverse, member.long()) > 0
    is_key = torch.zeros(unique.numel(), dtype=torch.long, device=device).index_add_(0, inverse, is_key.long()) > 0
    segment = unique // length
    # A segment without a query merges nothing and one without a key attends to nothing: drop both.
    _, seg_index, sizes = torch.unique_consecutive(segment, return_inverse=True, return_counts=True)
    has = torch.zeros(sizes.numel(), 2, dtype=torch.long, device=device)
    has.index_add_(0, seg_index, torch.stack([member, is_key], dim=1).long())
    useful = (has > 0).all(dim=1)[seg_index]
    unique, member, is_key, segment = unique[useful], member[useful], is_key[useful], segment[useful]
    _, lengths = torch.unique_consecutive(segment, return_counts=True)
    head, position = unique // length // code_span, unique % length
    return Entries(head, position, subset_sign(segment % code_span, base), member, is_key, lengths.tolist())


def _row_keys(head, code, position, code_span: int, length: int):
    """A sortable int64 key per row: (head, code, position) lexicographically."""
    return (head * code_span + code) * length + position


def _group_part(q, key, value, entries: Entries, scaling: float, backend: str):
    """Causal attention within every segment of `entries`: outputs (N, R, D) fp32 and log-sum-exp (N, R)."""
    b, k_heads, r, length, d = q.shape
    batch_of, head_of = entries.head // k_heads, entries.head % k_heads
    packed_q = q[batch_of, head_of, :, entries.position]  # (N, R, D)
    packed_k = key[batch_of, head_of, entries.position]  # (N, D)
    packed_v = value[batch_of, head_of, entries.position]  # (N, D)
    if not bool(entries.is_key.all()):
        packed_q, packed_k, packed_v = _hide_query_only_rows(packed_q, packed_k, packed_v, entries.is_key, scaling,
                                                             backend)
    if backend == "flash":
        out, lse = _segments_flash(packed_q, packed_k, packed_v, entries.lengths, scaling)
    else:
        out, lse = _segments_torch(packed_q, packed_k, packed_v, entries.lengths, scaling)
    return out[..., :d], lse


def _hide_query_only_rows(packed_q, packed_k, packed_v, is_key, scaling: float, backend: str):
    """Extra head dimensions so that a row that is not a key gets logit -1e4 from every query (exactly, whatever the
    query: its key is zero elsewhere) and a key row gets 0 there: q' = [q, 1], k' = [k, 0] or [0, -1e4 / scale].
    Values get a zero column to match (flash-attn: padded to a multiple of 8 dimensions)."""
    n, r, d = packed_q.shape
    extra = 8 - d % 8 if backend == "flash" else 1
    flag = torch.zeros(n, extra, dtype=packed_q.dtype, device=packed_q.device)
    query_flag = flag.clone()
    query_flag[:, 0] = 1
    key_flag = flag.clone()
    key_flag[:, 0] = torch.where(is_key, 0.0, -1e4 / scaling)
    packed_q = torch.cat([packed_q, query_flag[:, None].expand(n, r, extra)], dim=-1)
    packed_k = torch.cat([packed_k * is_key[:, None].to(packed_k.dtype), key_flag], dim=-1)
    packed_v = torch.cat([packed_v * is_key[:, None].to(packed_v.dtype), flag], dim=-1)
    return packed_q, packed_k, packed_v


def _segments_torch(packed_q, packed_k, packed_v, lengths: list[int], scaling: float, fill: float = 0.8):
    """Causal attention within each segment, segments of similar length batched into one fused kernel call.

    Segments are taken longest first; a batch holds segments at least `fill` times its longest, each padded at
    its end to that length (padding is never seen by real queries: causal), so padding costs at most 1 - fill.
    Batching matters: a fused kernel call per segment costs more than the same segments as one batch.
    """
    n, r, d = packed_q.shape
    device = packed_q.device
    out = torch.empty(n, r, d, dtype=torch.float32, device=device)
    lse = torch.empty(n, r, dtype=torch.float32, device=device)
    sizes = torch.tensor(lengths)
    starts = sizes.cumsum(0) - sizes
    attend = _cpu_causal if device.type == "cpu" else _causal_with_lse
    for batch in similar_lengths(sizes, fill):
        longest = int(sizes[batch[0]])
        offsets = torch.arange(longest)
        rows = (starts[batch, None] + offsets).clamp_max(n - 1).to(device)  # (S, longest); tails read junk rows
        real = (offsets < sizes[batch, None]).to(device)  # (S, longest)
        q = packed_q[rows].permute(0, 2, 1, 3)  # (S, R, longest, D)
        k = packed_k[rows][:, None].expand(-1, r, -1, -1)  # (S, R, longest, D), no copy per query head
        v = packed_v[rows][:, None].expand(-1, r, -1, -1)
        seg_out, seg_lse = attend(q, k, v, scaling)
        out[rows[real]] = seg_out.permute(0, 2, 1, 3)[real].float()
        lse[rows[real]] = seg_lse.permute(0, 2, 1)[real].float()
    return out, lse


def _cpu_causal(q, k, v, scaling):
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, True, scale=scaling)


def _causal_with_lse(q, k, v, scaling):
    scores = (q.float() @ k.float().transpose(-1, -2)) * scaling
    size = q.shape[-2]
    scores.masked_fill_(torch.ones(size, size, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    lse = scores.logsumexp(dim=-1)
    return (scores - lse[..., None]).exp() @ v.float(), lse


def _segments_flash(packed_q, packed_k, packed_v, lengths: list[int], scaling: float):
    """All segments in one flash-attn varlen call (CUDA only).

    flash-attn takes (total, heads, D) rows with cumulative segment offsets, handles the R query heads per key
    head itself, and returns the log-sum-exp as (heads, total).
    """
    from flash_attn import flash_attn_varlen_func  # (the plan asks for "flash" only where it imports)

    offsets = torch.tensor([0] + lengths, device=packed_q.device).cumsum(0).to(torch.int32)
    dtype = packed_q.dtype if packed_q.dtype in (torch.float16, torch.bfloat16) else torch.bfloat16
    out, lse, _ = flash_attn_varlen_func(
        packed_q.to(dtype), packed_k[:, None].to(dtype), packed_v[:, None].to(dtype), offsets, offsets,
        max(lengths), max(lengths), dropout_p=0.0, softmax_scale=scaling, causal=True, return_attn_probs=True,
    )
    return out.float(), lse.transpose(0, 1).float()  # (N, R, D), (N, R)


# ---- merge -----------------------------------------------------------------------------------------------------


def _merge(local_out, local_lse, seg_out, seg_lse, entries: Entries, valid):
    """Sum of every part's (signed) softmax mass per query, normalised: exact because no pair repeats."""
    b, k_heads, r, length, d = local_out.shape
    rows = entries.member
    head, position = entries.head[rows], entries.position[rows]
    sign = entries.sign[rows].to(torch.float32)[:, None]  # (M, 1)
    seg_out, seg_lse = seg_out[rows], seg_lse[rows]  # (M, R, D), (M, R)
    flat = head * length + position  # (M,) index into (B*K*L)

    local_out = local_out.permute(0, 1, 3, 2, 4).reshape(b * k_heads * length, r, d)
    local_lse = local_lse.permute(0, 1, 3, 2).reshape(b * k_heads * length, r)
    peak = local_lse.clone()
    peak.scatter_reduce_(0, flat[:, None].expand(-1, r), seg_lse, "amax")  # (B*K*L, R)
    peak = torch.where(torch.isfinite(peak), peak, 0.0)
    local_weight = (local_lse - peak).exp()  # exp(-inf) = 0 where the local part is empty
    seg_weight = sign * (seg_lse - peak[flat]).exp()  # (M, R)
    numerator = local_out * local_weight[..., None]
    numerator.index_add_(0, flat, seg_out * seg_weight[..., None])
    denominator = local_weight.clone()
    denominator.index_add_(0, flat, seg_weight)
    out = numerator / denominator[..., None].clamp_min(torch.finfo(torch.float32).tiny)
    out = out.view(b, k_heads, length, r, d).permute(0, 1, 3, 2, 4)  # (B, K, R, L, D)
    return out * valid[:, None, None, :, None]


def pair_counts(
    length: int, window: int, groups: torch.Tensor, sink_tokens: int = 0, query_groups: torch.Tensor | None = None
) -> tuple[int, int]:
    """(full causal pairs, pairs the hard Focus pattern keeps) for one head of one sequence.

    Args:
        groups: (L, k) group ids per token; query_groups: (L, k) the queries' own (query-side routing), or None.
    """
    full = length * (length + 1) // 2
    query_groups = groups if query_groups is None else query_groups
    width = int(max(groups.max(), query_groups.max())) + 1
    members = torch.zeros(length, width, dtype=torch.bool).scatter_(1, groups, True)
    members_q = torch.zeros(length, width, dtype=torch.bool).scatter_(1, query_groups, True)
    kept = 0
    for start in range(0, length, 4096):  # blocks keep the (block, L) mask small at 64K tokens
        i = torch.arange(start, min(start + 4096, length))[:, None]
        j = torch.arange(length)[None, :]
        shared = (members_q[start : start + 4096].float() @ members.float().T) > 0
        allowed = (j <= i) & ((i - j < window) | shared | (j < sink_tokens))
        kept += int(allowed.sum())
    return full, kept


def theoretical_ratio(length: int, window: int, num_groups: int, top_k: int = 1) -> float:
    """Full causal pairs over the expected pairs of Focus with balanced, independent top-k groups (no sinks)."""
    full = length * (length + 1) / 2
    local = window * length - window * (window - 1) / 2
    share = 1 - math.comb(num_groups - top_k, top_k) / math.comb(num_groups, top_k)  # P(two tokens share a group)
    distant = (full - local) * share
    return full / (local + distant)
