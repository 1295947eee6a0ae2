"""The per-key indexer's side of a `FocusCache`: each cached key's code, kept beside the KV cache so that a decoding
step scores every distant key at the indexer's rank r instead of recomputing r numbers per key from its D (DSA keeps
its indexer's keys in the cache the same way)."""

from __future__ import annotations

import torch

from focus.attention.cache.group_index import with_room
from focus.attention.routers.indexer import CODE_DTYPE


class KeyCodes:
    """One indexer layer's cached key codes: `codes[:, :, :length]` (B, K, length, r) in `indexer.CODE_DTYPE`,
    `k W_k[kv]` of each cached key as the layer attends with it (`focus.attention.routers.indexer.key_codes`). Grows by
    an eighth when full.

    Answers what the plan asks of a cache's index (`length`, `native`, `sinks_found`): the indexer needs no sinks
    seen before it steps; `native`: its steps may run the native kernel (the cache's choice, `FocusCache(native=)`).
    """

    sinks_found = True

    def __init__(self, batch: int, k_heads: int, rank: int, device, native: bool = False):
        self._codes = torch.zeros(batch, k_heads, 0, rank, dtype=CODE_DTYPE, device=device)
        self.length = 0
        self.native = native

    @property
    def batch(self) -> int:
        return self._codes.shape[0]

    @property
    def device(self) -> torch.device:
        return self._codes.device

    @property
    def codes(self) -> torch.Tensor:
        return self._codes[:, :, : self.length]

    def extend(self, codes: torch.Tensor, past: int) -> None:
        """Add the codes (B, K, n, r) of the keys after the first `past` (the cache cropped back to `past` first)."""
        if self.length < past:
            raise RuntimeError(f"the indexer's key codes hold {self.length} keys but the cache {past}: a FocusCache "
                               "must see every key from the first")
        self.length = past
        self._codes = with_room(self._codes, 2, past + codes.shape[2], fill=0)
        self._codes[:, :, past : past + codes.shape[2]] = codes
        self.length = past + codes.shape[2]

    def truncate(self, length: int) -> None:
        self.length = min(self.length, length)

    def select_rows(self, rows: torch.Tensor) -> None:
        self._codes = self._codes[rows]

    def nbytes(self) -> int:
        return self.codes.numel() * self.codes.element_size()
