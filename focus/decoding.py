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

The pattern is the dense reference's (`focus.reference.hard_allowed`): a step keeps key j when it is local
(i - j < window), a sink, or in one of the query's groups; the tests hold the two equal.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers import DynamicCache

from .routing import group_membership, inference_log_assign, routing_logits, top_k_groups

CACHE_INDEX_ATTRIBUTE = "focus_cache_index"
"""A `GroupIndex` set under this name on a Focus attention module by `FocusCache.update`, taken by the next call."""


class GroupIndex:
    """One layer's cached keys by group, per (batch row, key/value head).

    key_groups: (B, K, capacity, top_k) int8 (int16 beyond 127 groups), each indexed key's groups (-1 for padding).
    members: (B, K, G, capacity) int32, the positions of each group's keys in cache order; `counts` (B, K, G)
        of them are filled. Padding keys are in no group.
    sinks: (B, S) int64, the positions of the first S real keys of each row (-1 until seen).
    Buffers grow by an eighth of their size when full: appending a token costs O(1) amortised, and the index stays
    small beside the KV cache (measured: 2.0% of a float32 cache at head size 64, top-2, so about 4% of a bfloat16
    one, plus at most an eighth of headroom).
    """

    def __init__(self, batch: int, k_heads: int, num_groups: int, top_k: int, sink_tokens: int, device):
        self.num_groups, self.top_k, self.length = num_groups, top_k, 0
        group_dtype = torch.int8 if num_groups <= 127 else torch.int16  # a byte per group id where it fits
        self.key_groups = torch.full((batch, k_heads, 0, top_k), -1, dtype=group_dtype, device=device)
        self.members = torch.zeros(batch, k_heads, num_groups, 0, dtype=torch.int32, device=device)
        self.counts = torch.zeros(batch, k_heads, num_groups, dtype=torch.int64, device=device)
        self.sinks = torch.full((batch, sink_tokens), -1, dtype=torch.int64, device=device)
        self._real = torch.zeros(batch, dtype=torch.int64, device=device)  # real keys seen per row

    def extend(self, groups: torch.Tensor, valid: torch.Tensor | None) -> None:
        """Index the next keys: `groups` (B, K, n, top_k) their group ids, `valid` (B, n) False for padding."""
        b, k_heads, n, _ = groups.shape
        start = self.length
        valid = torch.ones(b, n, dtype=torch.bool, device=groups.device) if valid is None else valid
        self.key_groups = _reserve(self.key_groups, 2, start + n)
        groups_or_padding = groups.masked_fill(~valid[:, None, :, None], -1)
        self.key_groups[:, :, start : start + n] = groups_or_padding.to(self.key_groups.dtype)

        member = group_membership(groups, self.num_groups) & valid[:, None, :, None]  # (B, K, n, G)
        slots = self.counts[:, :, None, :] + member.long().cumsum(dim=2) - 1  # (B, K, n, G) where each one lands
        self.counts += member.sum(dim=2)
        self.members = _reserve(self.members, 3, int(self.counts.max()) if self.counts.numel() else 0)
        bi, ki, ni, gi = member.nonzero(as_tuple=True)
        self.members[bi, ki, gi, slots[bi, ki, ni, gi]] = (start + ni).to(torch.int32)

        order = self._real[:, None] + valid.long().cumsum(dim=1)  # (B, n): 1-based rank among the row's real keys
        is_sink = valid & (order <= self.sinks.shape[1])
        rows, cols = is_sink.nonzero(as_tuple=True)
        self.sinks[rows, order[rows, cols] - 1] = start + cols
        self._real += valid.sum(dim=1)
        self.length = start + n

    @property
    def sink_last(self) -> torch.Tensor:
        """(B,) the last sink's position (-1 before any): a real key is a sink exactly when its position <= it."""
        if self.sinks.shape[1] == 0:
            return torch.full(self.sinks.shape[:1], -1, dtype=torch.int64, device=self.sinks.device)
        return self.sinks.amax(dim=1)

    def groups(self, length: int | None = None) -> torch.Tensor:
        """(B, K, L, top_k) int64 group ids of the first `length` indexed keys (padding keys: -1)."""
        return self.key_groups[:, :, : self.length if length is None else length].long()

    def truncate(self, length: int) -> None:
        """Keep the first `length` keys (the cache was cropped or reset): the index rebuilt from their groups."""
        kept = self.key_groups[:, :, :length].long()
        valid = (kept[:, 0, :, 0] >= 0) if length else None
        b, k_heads = self.counts.shape[:2]
        self.__init__(b, k_heads, self.num_groups, self.top_k, self.sinks.shape[1], self.counts.device)
        if length:
            self.extend(kept.clamp_min(0), valid)

    def select_rows(self, rows: torch.Tensor) -> None:
        """Keep batch rows `rows` (beam search reordering, batch selection or repetition)."""
        for name in ("key_groups", "members", "counts", "sinks", "_real"):
            setattr(self, name, getattr(self, name).index_select(0, rows.to(self.counts.device)))

    def nbytes(self) -> int:
        """Bytes the index holds (allocated, growth headroom included)."""
        tensors = (self.key_groups, self.members, self.counts, self.sinks, self._real)
        return sum(t.numel() * t.element_size() for t in tensors)


def _reserve(buffer: torch.Tensor, dim: int, needed: int) -> torch.Tensor:
    """`buffer` with room for `needed` entries along `dim`: itself, or a copy grown by an eighth (new room -1)."""
    have = buffer.shape[dim]
    if needed <= have:
        return buffer
    shape = list(buffer.shape)
    shape[dim] = max(needed, have + have // 8, 64)
    grown = torch.full(shape, -1, dtype=buffer.dtype, device=buffer.device)
    grown.narrow(dim, 0, have).copy_(buffer)
    return grown


class FocusCache(DynamicCache):
    """A `DynamicCache` that keeps a `GroupIndex` per Focus layer and hands it to that layer's attention call.

    Sliding-window cache layers (their old keys leave the cache) are not indexed: they take the dense path.
    """

    def __init__(self, model: nn.Module, **kwargs):
        super().__init__(config=model.config, **kwargs)
        self.focus_modules = {m.layer_idx: m for m in model.modules() if hasattr(m, "focus_config")}
        if not self.focus_modules:
            raise ValueError("FocusCache needs a model with Focus; call apply_focus first")
        self.indexes: dict[int, GroupIndex] = {}

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        keys, values = super().update(key_states, value_states, layer_idx, *args, **kwargs)
        module = self.focus_modules.get(layer_idx)
        if module is not None and not self.layers[layer_idx].is_sliding:
            if layer_idx not in self.indexes:
                config = module.focus_config
                self.indexes[layer_idx] = GroupIndex(
                    keys.shape[0], keys.shape[1], config.num_groups, config.top_k, config.sink_tokens, keys.device
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
            rows = torch.arange(index.counts.shape[0], device=index.counts.device).repeat_interleave(repeats)
            index.select_rows(rows)

    def reset(self):
        super().reset()
        self.indexes.clear()

    def index_nbytes(self) -> int:
        """Bytes of every layer's group index (compare with the KV cache's)."""
        return sum(index.nbytes() for index in self.indexes.values())


def take_cache_index(module: nn.Module) -> GroupIndex | None:
    """The index `FocusCache.update` handed to this call, removed from the module so no later call reuses it."""
    index = getattr(module, CACHE_INDEX_ATTRIBUTE, None)
    if index is not None:
        setattr(module, CACHE_INDEX_ATTRIBUTE, None)
    return index


def index_new_keys(
    module: nn.Module, index: GroupIndex, key_vectors: torch.Tensor, past: int, valid: torch.Tensor | None
) -> None:
    """Bring `index` to the cache: route the keys after the first `past` (their routing vectors `key_vectors`,
    (B, K, n, D)) causally, as inference routes, and index them; `valid` (B, n) or None."""
    if index.length != past:
        if index.length < past:
            raise RuntimeError(f"the Focus group index holds {index.length} keys but the cache {past}: "
                               "a FocusCache must see every key from the first")
        index.truncate(past)  # the cache was cropped
    logits = routing_logits(key_vectors.detach(), module.focus_centroids, module.focus_config.temperature)
    groups = top_k_groups(inference_log_assign(logits, module.focus_group_bias), module.focus_config.top_k)
    index.extend(groups, valid)


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

    The keys a query head reads (its window, the sinks before it, the distant keys of its groups, each once) are
    gathered by one flat index into the cache and attended by one SDPA call, masked where the lists are padded.

    Args:
        query: (B, H, 1, D); key, value: (B, K, L, D), the cache with the query's own key last.
        index: the cache's `GroupIndex`, holding all L keys.
        query_groups: (B, H, top_k) int64, the groups of each query head.
        key_valid: (B, w) bool, which of the last w = min(window, L) keys are real, or None (all).
    Returns:
        (B, H, 1, D).
    """
    b, h, _, d = query.shape
    k_heads, length = key.shape[1], key.shape[2]
    device = key.device
    start = max(length - window, 0)  # keys before `start` are distant
    kv_rows = torch.arange(b, device=device)[:, None] * k_heads + torch.arange(h, device=device) // (h // k_heads)

    # The distant keys of the query's groups, from the index. Every gather is an index_select of whole rows by a
    # flat index: advanced indexing with broadcast index tensors copies element by element, 8x slower on a CPU.
    group_rows = (kv_rows[..., None] * index.num_groups + query_groups).flatten()  # (B * H * top_k,)
    selected = index.counts.flatten().index_select(0, group_rows).view(b, h, -1)  # (B, H, top_k)
    width = int(selected.max()) if selected.numel() else 0
    members = index.members.flatten(0, 2).index_select(0, group_rows)[:, :width]
    distant = members.view(b, h, -1, width).long().clamp_min(0)  # (B, H, top_k, C)
    keep = torch.arange(width, device=device) < selected[..., None]
    keep &= (distant < start) & (distant > index.sink_last[:, None, None, None])  # the window and sinks come apart
    if query_groups.shape[-1] > 1:  # a key listed under an earlier selected group is counted there
        capacity = index.key_groups.shape[2]
        key_groups = _select_rows(index.key_groups.flatten(0, 2), kv_rows[..., None, None] * capacity + distant)
        for s in range(1, query_groups.shape[-1]):
            earlier = query_groups[:, :, None, None, :s]  # (B, H, 1, 1, s)
            keep[:, :, s] &= ~(key_groups[:, :, s, :, :, None] == earlier).any(dim=(-1, -2))

    local = torch.arange(start, length, device=device).expand(b, h, -1)
    local_keep = (torch.ones(b, length - start, dtype=torch.bool, device=device) if key_valid is None
                  else key_valid)[:, None, :].expand(b, h, -1)
    sinks = index.sinks[:, None, :].expand(b, h, -1)
    positions = torch.cat([local, sinks.clamp_min(0), distant.flatten(2)], dim=-1)  # (B, H, n)
    keep = torch.cat([local_keep, (sinks >= 0) & (sinks < start), keep.flatten(2)], dim=-1)
    cache_rows = kv_rows[..., None] * length + positions  # rows of the cache flattened to (B * K * L, D)
    keys = _select_rows(key.reshape(-1, d), cache_rows)  # (B, H, n, D)
    values = _select_rows(value.reshape(-1, d), cache_rows)
    return F.scaled_dot_product_attention(query, keys, values, attn_mask=keep[:, :, None], scale=scaling)


def _select_rows(rows: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """rows (N, D) at `index` (any shape) -> (*index.shape, D): only those rows are read (no per-query-head copy
    of the cache is made)."""
    return rows.index_select(0, index.flatten()).view(*index.shape, rows.shape[-1])
