"""A `DynamicCache` whose layers append in place, so that a decoding step does not copy the whole cache.

transformers' `DynamicLayer.update` concatenates: every step copies every cached key and value of every layer, a
cost that grows with the cache like attention itself (at 16K cached tokens on a CPU it is of the order of the
attention over them). A sparse decoding step reads a fraction of the cache and would still pay the full copy, so
`FocusCache` builds on this one; the unmodified model can use it too, which is how the decode benchmark separates
what Focus saves from what appending in place saves.

    cache = GrowingCache(config=model.config)
    model.generate(**inputs, past_key_values=cache, max_new_tokens=200)
"""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer


class GrowingLayer(DynamicLayer):
    """A `DynamicLayer` that keeps its keys and values as the first L positions of buffers with room to spare.

    The buffers grow by an eighth (64 positions at least) when full: appending costs O(1) amortised, and at most an
    eighth of the cache is kept spare. `keys` and `values` are views of them, as wide as the cache: everything
    `DynamicLayer` does (crop, batch selection, beam reordering) keeps working on them, and a layer whose tensors
    were replaced by such an operation moves them back into a buffer at its next update.
    """

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        self.key_buffer = self.value_buffer = None

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        length = self.get_seq_length()
        self.key_buffer, self.keys = _append(self.key_buffer, self.keys if length else None, key_states)
        self.value_buffer, self.values = _append(self.value_buffer, self.values if length else None, value_states)
        return self.keys, self.values


def _append(buffer: torch.Tensor | None, held: torch.Tensor | None, new: torch.Tensor):
    """(buffer, view of its first L + n positions) after writing `new` (B, K, n, D) after `held` (B, K, L, D)."""
    length = 0 if held is None else held.shape[-2]
    needed = length + new.shape[-2]
    if not _is_prefix_of(held, buffer) or buffer.shape[-2] < needed or buffer.shape[:2] != new.shape[:2]:
        have = 0 if buffer is None else buffer.shape[-2]
        room = max(needed, have + max(have // 8, 64))
        grown = new.new_empty(*new.shape[:2], room, new.shape[-1])
        if length:
            grown[:, :, :length] = held
        buffer = grown
    buffer[:, :, length:needed] = new
    return buffer, buffer[:, :, :needed]


def _is_prefix_of(held: torch.Tensor | None, buffer: torch.Tensor | None) -> bool:
    """Whether `held` is the buffer's first positions in place (None: nothing held yet, any buffer will do)."""
    if buffer is None:
        return False
    if held is None:
        return True
    return held.data_ptr() == buffer.data_ptr() and held.stride() == buffer.stride()


class GrowingCache(DynamicCache):
    """A `DynamicCache` whose full-attention layers are `GrowingLayer`s (sliding-window layers are kept: they
    already stay small)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.layers = [GrowingLayer() if type(layer) is DynamicLayer else layer for layer in self.layers]
        if self.layer_class_to_replicate is DynamicLayer:  # built without a config: layers are made as they come
            self.layer_class_to_replicate = GrowingLayer
