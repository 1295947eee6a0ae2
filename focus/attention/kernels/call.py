"""One attention call as a kernel receives it: the tensors transformers passed (`AttentionCall`) and what the plan's
router made of them (`CallState`), both frozen and passed in, so that no kernel reads the call from the module."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from focus.attention.cache.group_index import GroupIndex
from focus.attention.cache.key_codes import KeyCodes
from focus.attention.pattern.reference import unmodified_attention
from focus.attention.routers.routing import Routed


@dataclass(frozen=True)
class AttentionCall:
    """One attention call as transformers made it: query (B, H, Q, D), key and value (B, K, L, D), the boolean
    mask of the pairs the model allows (B, 1, Q, L) or None (plainly causal), and the call's options."""

    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    base_mask: torch.Tensor | None
    scaling: float | None
    dropout: float
    softcap: float | None
    sliding_window: int | None

    def unmodified(self) -> torch.Tensor:
        """The unmodified model's attention (B, H, Q, D)."""
        return unmodified_attention(self.query, self.key, self.value, self.base_mask, self.scaling, self.dropout,
                                    self.softcap)


@dataclass(frozen=True)
class CallState:
    """What a kernel of the plan reads besides the call's tensors.

    module: the Focus layer (its `FocusConfig`, centroids, indexer weights); index: a `FocusCache`'s group index or
    key codes of this layer, up to date with the call's keys, or None; position_ids: the call's positions or None;
    routed: the groups of a whole call's queries and keys (`routing.Routed`), or None; step_groups: a decoding step's
    query-head groups (B, H, top_k), or None; selected: a selector's pairs (B, H, Q, L), or None.
    """

    module: nn.Module
    index: GroupIndex | KeyCodes | None = None
    position_ids: torch.Tensor | None = None
    routed: Routed | None = None
    step_groups: torch.Tensor | None = None
    selected: torch.Tensor | None = None

    @property
    def config(self):
        return self.module.focus_config
