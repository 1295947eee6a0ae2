"""What both forms of the decomposed group part share: segment rows, subset codes and signs, and a masked
attention that returns its log-sum-exp (for devices without PyTorch's fused CPU kernel)."""

from __future__ import annotations

import itertools
from typing import NamedTuple

import torch


class Entries(NamedTuple):
    """The packed rows of every segment, sorted by (batch, head, subset, position)."""

    head: torch.Tensor  # (N,) batch * K + key/value head
    position: torch.Tensor  # (N,) token position
    sign: torch.Tensor  # (N,) +1 or -1: the inclusion-exclusion sign of the row's subset
    member: torch.Tensor  # (N,) bool: the row is a query of the segment, its output merged
    is_key: torch.Tensor  # (N,) bool: the row is a key of the segment (False: a query only, never attended to)
    lengths: list[int]  # segment lengths, in row order


def subset_codes(groups: torch.Tensor, base: int) -> torch.Tensor:
    """Every non-empty subset of each token's k groups as a code: (B, K, L, S).

    A code is the base-(G+1) number of the subset's sorted members plus one, so equal subsets of different tokens (or
    of a query and a key) get equal codes.
    """
    top_k = groups.shape[-1]
    subsets = [c for size in range(1, top_k + 1) for c in itertools.combinations(range(top_k), size)]
    codes = []
    for members in subsets:
        code = torch.zeros(groups.shape[:-1], dtype=torch.long, device=groups.device)
        for slot in members:
            code = code * base + groups[..., slot] + 1
        codes.append(code)
    return torch.stack(codes, dim=-1)


def subset_sign(code: torch.Tensor, base: int) -> torch.Tensor:
    """The inclusion-exclusion sign of the subsets given by `code`: +1 for an odd number of groups, -1 for an even one.
    A code holds one nonzero base-`base` digit per group of its subset."""
    size = torch.zeros_like(code)
    rest = code.clone()
    while bool((rest > 0).any()):
        size += (rest > 0).long()
        rest = rest // base
    return torch.where(size % 2 == 1, 1, -1)


def masked_with_lse(q, k, v, mask, scaling):
    scores = (q.float() @ k.float().transpose(-1, -2)) * scaling + mask.float()
    lse = scores.logsumexp(dim=-1)
    weights = torch.where(torch.isfinite(lse)[..., None], (scores - lse[..., None]).exp(), 0.0)
    return weights @ v.float(), lse


def similar_lengths(lengths: torch.Tensor, fill: float) -> list[torch.Tensor]:
    """The indices of the positive `lengths` in batches, longest first, each batch's lengths at least `fill` times
    its longest (so padding every member to the longest wastes at most 1 - fill)."""
    order = torch.argsort(lengths, descending=True, stable=True)
    order = order[lengths[order] > 0]
    values = lengths[order].tolist()
    batches, first = [], 0
    while first < len(values):
        last = first + 1
        while last < len(values) and values[last] >= fill * values[first]:
            last += 1
        batches.append(order[first:last])
        first = last
    return batches
