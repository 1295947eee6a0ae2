"""Hard Focus's pattern, stated once: which (query, key) pairs a layer keeps.

    kept(i, j) = allowed(i, j) and (0 <= pos(i) - pos(j) < window  or  j is a sink  or  the groups of i and j meet)

`allowed` is the model's own mask (causal, padding, its sliding window); the window keeps every recent key at full
resolution; a sink belongs to every group. Each rule is a small pure function of tensors that broadcast, so the dense
reference builds its mask from them (`reference.hard_allowed`), FlexAttention's `mask_mod` calls them on indices
(`flex`), and the band, the rectangles and the decoding steps on their slices. A token's groups are the bits of one
int64 (bit g for group g), so whether a query and a key share a group is one AND. The native kernels state the same
rules in `focus/attention/native/csrc/pattern.h`; `tests/test_pattern.py` holds the two together.
"""

from __future__ import annotations

import torch

GROUP_BITS = 63
"""Group ids below this fit as bits of one int64: bits 0 to 62. The sign bit is left out, because `1 << 63` overflows
a signed shift in the C++ kernels (which take this limit from here, `focus.attention.native.build`); a sink, in every
group, has all bits set (`SINK_BITS`). Where a group id reaches it, the paths that need bits do without them."""

SINK_BITS = -1
"""A sink's group bits: every group (two's complement -1 has every bit set)."""


def group_bits(groups: torch.Tensor, keepdim: bool = False) -> torch.Tensor:
    """(...) int64: the bits of each token's groups (..., top_k), ids in [0, GROUP_BITS) and distinct per token, so
    that their sum is their OR."""
    return (1 << groups.long()).sum(dim=-1, keepdim=keepdim)


def group_membership(groups: torch.Tensor, num_groups: int) -> torch.Tensor:
    """(..., L, k) group ids -> (..., L, G) bool: which groups each token belongs to."""
    member = torch.zeros(*groups.shape[:-1], num_groups, dtype=torch.bool, device=groups.device)
    return member.scatter_(-1, groups, True)


def groups_meet(query_bits: torch.Tensor, key_bits: torch.Tensor) -> torch.Tensor:
    """Whether a query's and a key's groups share one (their bits broadcast): one AND."""
    return (query_bits & key_bits) != 0


def within_window(query_position: torch.Tensor, key_position: torch.Tensor, window: int) -> torch.Tensor:
    """Whether the key is one of the query's `window` most recent keys, itself included: 0 <= i - j < window."""
    distance = query_position - key_position
    return (distance >= 0) & (distance < window)


def kept(
    query_position: torch.Tensor, key_position: torch.Tensor, window: int, meet: torch.Tensor,
    allowed: torch.Tensor | None = None, sink: torch.Tensor | None = None,
) -> torch.Tensor:
    """The pattern: `allowed` (None: causal) and (within the window, a sink key or groups that `meet`), every
    argument broadcast against the others."""
    keep = within_window(query_position, key_position, window) | meet
    if sink is not None:
        keep = keep | sink
    return keep & (query_position >= key_position if allowed is None else allowed)
