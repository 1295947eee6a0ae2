"""Training-free selectors of distant keys: the peers a learned router must beat at the same budget (issue 47).

Each keeps what hard Focus keeps for free (the window, the sink tokens, the model's own mask) and, of a query's
distant keys (allowed, beyond the window, not sinks), as many as `FocusConfig.budget` of them, rounded up; where a
selector keeps whole units (pages, clusters) it takes them best first until the budget is met, so it may keep up to
one unit more. Per query, so every query pays the same share whatever the selector:

- "streaming": the most recent distant keys (the window grown to the budget; budget 0 is StreamingLLM's window +
  sinks);
- "quest": whole pages of `QUEST_PAGE` keys, ranked per query head by Quest's upper bound of the page's logits,
  sum_d max(q_d min_d, q_d max_d) over the page's key minimum and maximum per channel (Tang et al., 2024);
- "clusters": whole key clusters, each key in the cluster of its nearest centroid (the layer's, as `apply_focus`'s
  k-means leaves them or as trained), ranked per query by its routing logit to them, as ClusterKV selects.

A selector's keys differ per query and fit no group index, so the dense masked kernel computes them
(`focus.attention.dispatch.planning`); they are for measuring quality at a budget, not speed.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from focus.attention.pattern.reference import local_pairs, model_allowed, per_head
from focus.attention.routers.indexer import distant_need, indexer_scores, top_scored
from focus.attention.routers.routing import dense_heads, key_positions, route_call, routing_vectors, sink_keys

SELECTORS = {
    "streaming": "the most recent distant keys, as many as the budget (budget 0: StreamingLLM, window + sinks)",
    "quest": "whole pages of 16 keys, best first by Quest's bound on the page's logits, until the budget",
    "clusters": "whole clusters of keys (nearest centroid), best first by the query's routing logit, until the budget",
}
"""The training-free selectors (`FocusConfig.selector`, besides "centroids": Focus's own top-k groups)."""

QUEST_PAGE = 16


def selected_pairs(
    module: nn.Module, query: torch.Tensor, key: torch.Tensor, base_mask: torch.Tensor | None,
    position_ids: torch.Tensor | None,
) -> torch.Tensor:
    """(B, H, Q, L) bool the pairs a Focus layer's selector keeps (`FocusConfig.selector`: a training-free one, or the
    per-key indexer of `focus.attention.routers.indexer`) for query (B, H, Q, D) and
    key (B, K, L, D), the queries the last Q keys; `base_mask` (B, 1, Q, L) the pairs the model allows, or None."""
    config = module.focus_config
    b, heads, q_len, _ = query.shape
    k_heads, k_len = key.shape[1], key.shape[2]
    allowed = model_allowed(base_mask, q_len, k_len, query.device)  # (B or 1, 1, Q, L)
    valid = None if base_mask is None else base_mask.any(dim=-2)[:, 0]
    sinks = sink_keys(valid, k_len, config.sink_tokens, key.device) if config.sink_tokens else None
    free = local_pairs(q_len, k_len, config.window, query.device)[None, None]
    if sinks is not None:
        free = free | sinks[:, None, None, :]
    distant = allowed & ~free
    need = distant_need(config, distant.sum(dim=-1, keepdim=True))  # (B or 1, 1, Q, 1)
    if config.selector == "streaming":
        kept = recent_keys(distant, need)
    elif config.selector == "quest":
        kept = quest_keys(query, key, distant, need, valid)
    elif config.selector == "indexer":
        kept = top_scored(indexer_scores(module, query, key, stored=True), distant, need)
    elif config.selector == "clusters":
        positions = key_positions(position_ids, k_len, key.device)
        routed = route_call(module, query, routing_vectors(module, key, positions), base_mask, positions)
        kept = cluster_keys(routed.query_log_assign, routed.key_log_assign, distant, need)
    else:
        raise ValueError(f"selected_pairs: {config.selector!r} is not a selector ({sorted(SELECTORS)} or 'indexer')")
    pairs = (free | kept) & allowed
    if pairs.shape[1] != heads:  # one pattern per key/value head, or for all: each query head gets its own copy
        pairs = pairs.repeat_interleave(heads // pairs.shape[1], dim=1)
    dense = dense_heads(module, k_heads, key.device)
    if dense is not None:
        pairs = pairs | (per_head(dense, heads) & allowed)
    return pairs.expand(b, heads, q_len, k_len)


def recent_keys(distant: torch.Tensor, need: torch.Tensor) -> torch.Tensor:
    """The `need` (.., Q, 1) most recent of each query's `distant` (.., Q, L) keys."""
    from_the_end = distant.flip(-1).long().cumsum(dim=-1).flip(-1)  # distant keys at or after each key
    return distant & (from_the_end <= need)


def quest_keys(
    query: torch.Tensor, key: torch.Tensor, distant: torch.Tensor, need: torch.Tensor, valid: torch.Tensor | None,
) -> torch.Tensor:
    """(B, H, Q, L) the distant keys of each query head's best pages of `QUEST_PAGE` keys, best first by Quest's
    bound until `need` distant keys are kept. Padding keys count in no page's minimum or maximum."""
    k_len = key.shape[2]
    pages = -(-k_len // QUEST_PAGE)
    pad = pages * QUEST_PAGE - k_len
    bound = quest_bound(query, *page_extremes(key, valid))  # (B, H, Q, P)
    counts = F.pad(distant, (0, pad)).view(*distant.shape[:-1], pages, QUEST_PAGE).sum(dim=-1)  # (B or 1, 1, Q, P)
    keep = best_units_until(bound, counts, need)  # (B, H, Q, P)
    return keep.repeat_interleave(QUEST_PAGE, dim=-1)[..., :k_len] & distant


def page_extremes(key: torch.Tensor, valid: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(low, high) (B, K, P, D): each page of `QUEST_PAGE` keys' minimum and maximum per channel, float32 (the last
    page padded); padding keys (`valid` (B, L) False) count in neither."""
    b, k_heads, k_len, d = key.shape
    pages = -(-k_len // QUEST_PAGE)
    pad = pages * QUEST_PAGE - k_len
    paged = F.pad(key.float(), (0, 0, 0, pad)).view(b, k_heads, pages, QUEST_PAGE, d)
    real = torch.ones(b, k_len, dtype=torch.bool, device=key.device) if valid is None else valid
    real = F.pad(real, (0, pad)).view(b, 1, pages, QUEST_PAGE, 1)
    high = paged.masked_fill(~real, float("-inf")).amax(dim=3).nan_to_num(0.0, neginf=0.0)
    low = paged.masked_fill(~real, float("inf")).amin(dim=3).nan_to_num(0.0, posinf=0.0)
    return low, high


def quest_bound(query: torch.Tensor, low: torch.Tensor, high: torch.Tensor) -> torch.Tensor:
    """(B, H, Q, P) Quest's bound sum_d max(q_d low_d, q_d high_d) of every query head's logits on every page, from
    `page_extremes` (B, K, P, D); query (B, H, Q, D)."""
    b, heads, q_len, d = query.shape
    k_heads = low.shape[1]
    q = query.float().view(b, k_heads, heads // k_heads, q_len, d)
    # max(q_d lo_d, q_d hi_d) = relu(q_d) hi_d - relu(-q_d) lo_d: two products instead of a (Q, P, D) maximum.
    bound = q.clamp_min(0) @ high[:, :, None].transpose(-1, -2) + q.clamp_max(0) @ low[:, :, None].transpose(-1, -2)
    return bound.flatten(1, 2)


def cluster_keys(
    query_log_assign: torch.Tensor, key_log_assign: torch.Tensor, distant: torch.Tensor, need: torch.Tensor,
) -> torch.Tensor:
    """(B, K or H, Q, L) the distant keys of each query's best clusters, best first by its log-assignment
    (B, K or H, Q, G), until `need` distant keys are kept; a key's cluster is its best group in `key_log_assign`
    (B, K, L, G)."""
    groups = key_log_assign.shape[-1]
    members = F.one_hot(key_log_assign.argmax(dim=-1), groups).float()  # (B, K, L, G)
    r = query_log_assign.shape[1] // members.shape[1]
    members = members.repeat_interleave(r, dim=1)  # (B, K or H, L, G)
    counts = (distant.float() @ members).round().long()  # (B, K or H, Q, G)
    keep = best_units_until(query_log_assign.float(), counts, need)
    return (keep.float() @ members.transpose(-1, -2) > 0) & distant


def best_units_until(scores: torch.Tensor, counts: torch.Tensor, need: torch.Tensor) -> torch.Tensor:
    """(.., Q, U) bool: the units (pages, clusters) each query keeps, best `scores` (.., Q, U) first, until their
    distant keys `counts` (broadcast to scores) reach `need` (.., Q, 1); units without a distant key are never kept."""
    counts = counts.expand_as(scores)
    order = scores.masked_fill(counts == 0, float("-inf")).argsort(dim=-1, descending=True)
    ranked = counts.gather(-1, order)
    before = ranked.cumsum(dim=-1) - ranked  # distant keys the better units already keep
    take = (before < need) & (ranked > 0)
    return torch.zeros_like(take).scatter_(-1, order, take)
