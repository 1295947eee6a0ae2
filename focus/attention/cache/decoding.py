"""Sparse decoding: a group index beside the KV cache, so a decoding step reads its window, its sinks and the
keys of its own groups, not the whole cache.

Under causal routing a key's groups depend on that key alone, so they are computed once, when the key enters
the cache, and never change. `FocusCache` (a `DynamicCache`) keeps, per Focus layer, a `GroupIndex`: each cached
key's groups and, per (batch row, key/value head, group), the positions of its keys. Its `update` hands the
layer's index to the layer's attention call that follows (transformers calls `past_key_values.update` just
before attention), which indexes the keys that just arrived and, for a one-token step in hard mode, attends
through `sparse_decode_attention`. Everything else (prompt chunks, soft mode) takes the dense masked path,
with the index's groups: one assignment per token for the whole generation.

    cache = FocusCache(model)
    model.generate(**inputs, past_key_values=cache, max_new_tokens=200)

The pattern is the dense reference's (`focus.attention.pattern.reference.hard_allowed`): a step keeps key j when it is
local (i - j < window), a sink, or in one of the query's groups; the tests hold the two equal.
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from torch import nn

from focus.attention.cache.group_index import GroupIndex, ScratchRows
from focus.attention.cache.growing_cache import GrowingCache
from focus.attention.cache.key_codes import KeyCodes
from focus.attention.labels import label
from focus.attention.native import kernels_built
from focus.attention.pattern.rule import group_bits, groups_meet

CACHE_INDEX_ATTRIBUTE = "focus_cache_index"
"""A `GroupIndex` set under this name on a Focus attention module by `FocusCache.update`, taken by the next call."""


def _native_kernels(model: nn.Module, wanted: bool | None) -> bool:
    """Whether a FocusCache of `model` runs the native kernels: `wanted` True or False decides (True on another device
    than the CPU, or without a build, is an error); None takes them where the model is on the CPU and they build,
    else warns once per process and takes the eager path."""
    if wanted is False:
        return False
    device = next(model.parameters()).device
    if device.type != "cpu":
        if wanted:
            raise ValueError(f"FocusCache(native=True): the native kernels run on the CPU, the model is on {device}")
        return False
    return kernels_built(required=bool(wanted))


class FocusCache(GrowingCache):
    """A `DynamicCache` (appending in place: `GrowingCache`) that keeps a `GroupIndex` per Focus layer (the per-key
    indexer's layers: their keys' codes, `KeyCodes`) and hands it
    to that layer's attention call.

    Sliding-window cache layers (their old keys leave the cache) are not indexed: they take the dense path.

    `native`: whether the prompt and the decoding steps run as native CPU calls (`focus.attention.native`; the same
    outputs within float32 rounding, built with the C++ compiler on first use, then cached). None (the default):
    wherever they apply, a model on the CPU, falling back to the eager PyTorch path with one warning when they cannot
    be built; True: they must (an error otherwise); False: the eager path. `compile_step` is its former name, deprecated.
    """

    def __init__(self, model: nn.Module, native: bool | None = None, compile_step: bool | None = None, **kwargs):
        super().__init__(config=model.config, **kwargs)
        if compile_step is not None:
            warnings.warn("FocusCache(compile_step=...) is deprecated: it is FocusCache(native=...), and native kernels "
                          "are the default on the CPU", FutureWarning, stacklevel=2)
            native = compile_step if native is None else native
        self.native = _native_kernels(model, native)
        self.focus_modules = {m.layer_idx: m for m in model.modules() if hasattr(m, "focus_config")}
        if not self.focus_modules:
            raise ValueError("FocusCache needs a model with Focus; call apply_focus first")
        self.indexes: dict[int, GroupIndex | KeyCodes] = {}
        self.scratch = ScratchRows()  # the layers attend one after another: one gather buffer serves them all

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        keys, values = super().update(key_states, value_states, layer_idx, *args, **kwargs)
        module = self.focus_modules.get(layer_idx)
        if module is not None and not self.layers[layer_idx].is_sliding:
            if layer_idx not in self.indexes:
                config = module.focus_config
                if config.selector == "indexer":  # its keys' codes, not groups
                    self.indexes[layer_idx] = KeyCodes(keys.shape[0], keys.shape[1], config.indexer_rank, keys.device,
                                                       self.native)
                else:
                    self.indexes[layer_idx] = GroupIndex(
                        keys.shape[0], keys.shape[1], config.num_groups, config.top_k, config.sink_tokens,
                        keys.device, self.scratch, self.native,
                    )
            setattr(module, CACHE_INDEX_ATTRIBUTE, self.indexes[layer_idx])
        return keys, values

    def reorder_cache(self, beam_idx: torch.LongTensor):
        super().reorder_cache(beam_idx)
        for index in self.indexes.values():
            index.select_rows(beam_idx)

    def batch_select_indices(self, indices: torch.Tensor):
        super().batch_select_indices(indices)
        for index in self.indexes.values():
            index.select_rows(indices)

    def batch_repeat_interleave(self, repeats: int):
        super().batch_repeat_interleave(repeats)
        for index in self.indexes.values():
            rows = torch.arange(index.batch, device=index.device).repeat_interleave(repeats)
            index.select_rows(rows)

    def reset(self):
        super().reset()
        self.indexes.clear()

    def crop(self, max_length: int):
        """`DynamicCache.crop`, with every layer's index cut to the cache at once (not at the layer's next step)."""
        super().crop(max_length)
        length = self.get_seq_length()
        for index in self.indexes.values():
            if index.length > length:
                index.truncate(length)

    def index_nbytes(self) -> int:
        """Bytes of every layer's group index (compare with the KV cache's)."""
        return sum(index.nbytes() for index in self.indexes.values())


def take_cache_index(module: nn.Module) -> GroupIndex | KeyCodes | None:
    """The index `FocusCache.update` handed to this call, removed from the module so no later call reuses it."""
    index = getattr(module, CACHE_INDEX_ATTRIBUTE, None)
    if index is not None:
        setattr(module, CACHE_INDEX_ATTRIBUTE, None)
    return index


def index_new_keys(index: GroupIndex, groups: torch.Tensor, past: int, valid: torch.Tensor | None) -> None:
    """Bring `index` to the cache: index the keys after the first `past`, `groups` (B, K, n, top_k) their groups as
    inference routes them (`routing.cache_key_groups`, `routing.step_groups`); `valid` (B, n) or None."""
    if index.length != past:
        if index.length < past:
            raise RuntimeError(f"the Focus group index holds {index.length} keys but the cache {past}: "
                               "a FocusCache must see every key from the first")
        index.truncate(past)  # the cache was cropped
    index.extend(groups, valid)


def masked_decode_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    index: GroupIndex,
    query_groups: torch.Tensor,
    window: int,
    base_mask: torch.Tensor | None,
    scaling: float | None,
    dense: torch.Tensor | None = None,
) -> torch.Tensor:
    """Hard Focus for one query token per row over a cache of L keys, every key read in place under the hard mask:
    one AND of group bits per key (`GroupIndex.key_bits`), then the fused attention kernel. No gathers and no list
    upkeep: at the lengths models run, cheaper than reading fewer keys through the lists.

    Args:
        query: (B, H, 1, D); key, value: (B, K, L, D), the cache with the query's own key last.
        query_groups: (B, H, top_k) int64, the groups of each query head.
        base_mask: (B, 1, 1, L) bool, the model's mask of this step, or None.
        dense: (K,) bool, key/value heads that attend as the model does, or None.
    Returns:
        (B, H, 1, D).
    """
    b, h, _, d = query.shape
    k_heads, length = key.shape[1], key.shape[2]
    query_bits = group_bits(query_groups)  # (B, H)
    allowed = groups_meet(index.key_bits[:, :, None, :length], query_bits.view(b, k_heads, h // k_heads, 1))  # B,K,R,L
    allowed[..., max(length - window, 0) :] = True  # the sinks have every bit (`GroupIndex.key_bits`)
    if dense is not None:
        allowed[:, dense] = True
    if base_mask is not None:
        allowed &= base_mask.view(b, 1, 1, length)
    # An additive mask: SDPA would convert a boolean one at every call. -inf is safe: the own key is always allowed
    # (window >= 1, or key routing, where the query holds its own key's groups).
    zero, blocked = _mask_values(query.dtype, query.device)
    mask = torch.where(allowed, zero, blocked)
    # The R query heads of a key/value head as R queries of it: keys and values are read once, not copied per head.
    out = F.scaled_dot_product_attention(query.view(b, k_heads, h // k_heads, d), key, value, attn_mask=mask,
                                         scale=scaling)
    return out.view(b, h, 1, d)


_MASK_VALUES: dict = {}


def _mask_values(dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """0 and -inf as 0-d tensors of `dtype` on `device`, made once: `torch.where` with Python scalars would wrap them
    into fresh tensors at every step of every layer."""
    key = (dtype, device)
    if key not in _MASK_VALUES:
        _MASK_VALUES[key] = (torch.zeros((), dtype=dtype, device=device),
                             torch.full((), float("-inf"), dtype=dtype, device=device))
    return _MASK_VALUES[key]


def sparse_decode_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    index: GroupIndex,
    query_groups: torch.Tensor,
    window: int,
    key_valid: torch.Tensor | None,
    scaling: float | None,
) -> torch.Tensor:
    """Hard Focus for one query token per row over a cache of L keys, reading window + sinks + its groups' keys.

    On a CPU a step is bound by the bytes it moves, so nothing is copied that need not be: the window is a slice of
    the cache, read in place by the query heads that share it; the distant keys (the sinks, then each selected
    group's keys, each once) are gathered into a reused buffer; and their values are never gathered at all: one
    `embedding_bag` sums them weighted by their probabilities as it reads them. Scores and softmax are float32.

    Args:
        query: (B, H, 1, D); key, value: (B, K, L, D), the cache with the query's own key last.
        index: the cache's `GroupIndex`, holding all L keys.
        query_groups: (B, H, top_k) int64, the groups of each query head; or (B, K, top_k), those of each key/value
            head, which its query heads share (`route_queries="kv_head"`): their distant keys are then read once.
        key_valid: (B, w) bool, which of the last w = min(window, L) keys are real, or None (all).
    Returns:
        (B, H, 1, D).
    """
    b, h, _, d = query.shape
    k_heads, length = key.shape[1], key.shape[2]
    r = h // k_heads
    g = query_groups.shape[1]  # routing rows: H, or K when query heads share their key/value head's groups
    start = max(length - window, 0)  # keys before `start` are distant
    w = length - start
    # A step's arithmetic takes a few hundred microseconds and every op's dispatch a few more: each line below is
    # one bmm, gather or elementwise op on views, with no broadcasting helpers between them.
    kv_rows = index.query_head_rows(g)  # (B, g) each routing row's row of the (B * K) key/value heads
    with label("focus/step_select"):
        positions, drop = _distant_keys(index, query_groups, start, kv_rows)  # (B, g, n)
    key_rows, span = _as_rows(key)
    value_rows, _ = _as_rows(value)
    rows = (kv_rows[..., None] * span + positions).view(b * g, -1)  # into key_rows and value_rows
    q = query.float() * (d**-0.5 if scaling is None else scaling)

    window_keys = key.reshape(b * k_heads, length, d)[:, start:].float()
    near = torch.bmm(q.view(b * k_heads, r, d), window_keys.transpose(1, 2))  # (B*K, R, w)
    if key_valid is not None:
        near.masked_fill_(~key_valid.repeat_interleave(k_heads, dim=0)[:, None], float("-inf"))
    far_keys = index.scratch.select_rows(key_rows, rows)  # (B*g, n, D), valid until the next call
    # (1, D) x (D, n) per head, not (n, D) x (D, 1): the same product, in the shape a CPU GEMM runs fastest.
    far = torch.bmm(q.view(b * g, h // g, d), far_keys.float().transpose(1, 2)).view(b, g, h // g, -1)
    far.masked_fill_(drop[:, :, None], float("-inf"))
    probs = torch.softmax(torch.cat([near.view(b, h, w), far.view(b, h, -1)], dim=-1), dim=-1).to(value.dtype)
    probs = probs.view(b * h, -1)

    out = torch.bmm(probs[:, :w].reshape(b * k_heads, r, w), value.reshape(b * k_heads, length, d)[:, start:])
    out = out.view(b * h, d)
    n = rows.shape[-1]
    if n:  # one bag of n rows per query head (1-D with offsets: faster than 2-D bags)
        if g != h:
            rows = rows.view(b * g, 1, n).expand(-1, h // g, -1)
        offsets = torch.arange(0, b * h * n, n, device=rows.device)
        far_weights = probs[:, w:].reshape(-1)
        out = out + F.embedding_bag(rows.reshape(-1), value_rows, offsets, per_sample_weights=far_weights, mode="sum")
    return out.view(b, h, 1, d).to(query.dtype)


def _as_rows(cache: torch.Tensor) -> tuple[torch.Tensor, int]:
    """(rows (N, D), span): the cache (B, K, L, D) as rows, position p of key/value head row i at row i * span + p.
    No copy when the cache is contiguous, or the first L positions of a larger buffer (`GrowingLayer`)."""
    b, k_heads, length, d = cache.shape
    batch_stride, head_stride, position_stride, last_stride = cache.stride()
    if last_stride == 1 and position_stride == d and head_stride % d == 0 and batch_stride == k_heads * head_stride:
        span = head_stride // d
        storage = cache.untyped_storage().nbytes() // cache.element_size()
        if cache.storage_offset() + b * k_heads * span * d <= storage:  # the last row's spare room is there too
            return cache.as_strided((b * k_heads * span, d), (d, 1)), span
    return cache.reshape(-1, d), length


def _distant_keys(
    index: GroupIndex, query_groups: torch.Tensor, start: int, kv_rows: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(positions, drop), both (B, H, S + top_k * C): the sinks, then the keys of each query head's groups; `drop`
    marks the entries not attended here (local keys, sinks under each group, list padding, a key of two selected
    groups under the second). Every position is valid to gather."""
    b, h, top_k = query_groups.shape
    # Every gather is an index_select by a flat index: advanced indexing with broadcast index tensors copies element
    # by element, several times slower on a CPU.
    group_rows = (kv_rows[..., None] * index.num_groups + query_groups).view(-1)  # (B * H * top_k,)
    width = int(index.counts.view(-1).index_select(0, group_rows).max()) if group_rows.numel() else 0
    members = index.members(group_rows, width).view(b, h, top_k, width)  # (B, H, top_k, C), -1 past each count
    drop = (members >= start) | (members <= index.sink_last[:, None, None, None])  # -1 <= every sink_last
    if top_k > 1:
        later = members[:, :, 1:].clamp_min(0)  # keys listed under a second or later selected group
        first_id = (kv_rows[:, :, None, None] * index.key_groups.shape[2] + later) * top_k
        ids = index.key_groups.view(-1)
        for j in range(top_k):  # the later keys' j-th group
            group_j = ids.index_select(0, (first_id + j).view(-1)).view_as(later)
            for s in range(1, top_k):
                drop[:, :, s] |= (group_j[:, :, s - 1, :, None] == query_groups[:, :, None, :s]).any(dim=-1)
    positions, drop = members.view(b, h, -1).clamp_min(0), drop.view(b, h, -1)
    if index.sinks.shape[1]:
        sinks = index.sinks[:, None, :].expand(b, h, -1)
        positions = torch.cat([sinks.clamp_min(0), positions], dim=-1)
        drop = torch.cat([(sinks < 0) | (sinks >= start), drop], dim=-1)
    return positions, drop
