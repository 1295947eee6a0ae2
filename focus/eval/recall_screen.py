"""Recall as the screen: how much of full attention's distant mass a router keeps at a budget, beside the oracle.

A router that keeps the distant keys full attention weighs loses nothing by dropping the rest: the oracle that keeps
each query's heaviest distant keys is within 0.1% of the dense model on WikiText-2 at 10-30% of the pairs
(docs/study.md). So a router is screened, before any long training or scoring, by the mass it keeps.
`routing_recall` runs the model with its own, unmodified attention and, in every layer and query row, ranks the
distant keys (beyond the window, sinks and the model's own masking excluded) by the router's score, and sums the true
attention weights of the best n of them for n at each budget; the oracle ranks them by those weights themselves. Per
budget, layer and key/value head it reports the distant mass kept (recall), the oracle's at the same count (its
ceiling) and the share of the distant pairs kept.

The routers' scores of key j for query i (`ROUTERS`):
- "indexer": the layer's per-key indexer (`focus.attention.routers.indexer`; untrained, the keys' principal directions:
  Loki);
- "centroids": Focus's groups ranked per query, the best of the key's top-k groups by the query's log-assignment: the
  groups kept best first until the budget (a per-query budget instead of a fixed top-k);
- "quest": Quest's bound on the logits of the key's page of 16;
- "streaming": recency.
A unit router (groups, pages) is read at exactly the budget, the last unit cut, so within one unit of what it keeps.
`routing_recalls` screens several routers in one forward pass per row: each layer takes each router's state
(`router_state`) in turn, and the attention weights and the oracle's ranking are computed once for all.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence

import torch
from torch import nn
from transformers import PreTrainedModel

from focus.attention.pattern.reference import local_pairs, model_allowed, unmodified_attention
from focus.attention.routers.centroids import top_k_groups
from focus.attention.routers.indexer import KEY_WEIGHTS, QUERY_WEIGHTS, indexer_scores
from focus.attention.routers.routing import key_positions, route_call, routing_vectors, sink_keys
from focus.attention.routers.selectors import QUEST_PAGE, page_extremes, quest_bound
from focus.eval.diagnostics import _attending
from focus.models import input_device
from focus.retrofit import attention_modules, has_focus

ROUTERS = ("indexer", "centroids", "quest", "streaming")
_SCREEN = "focus_recall_screen"
_STATE = "_focus_recall_screen"
_ROUTER_STATE = ("focus_config", "focus_centroids", "focus_group_bias", QUERY_WEIGHTS, KEY_WEIGHTS, "focus_inv_freq")
"""What a layer's router is made of (`focus.retrofit.apply_focus` sets them)."""


def routing_recall(
    model: PreTrainedModel,
    rows: torch.Tensor,
    router: str,
    budgets: Sequence[float | int],
    last_queries: int | None = None,
    query_chunk: int = 512,
) -> dict:
    """The distant attention mass `router` keeps in `model` (Focus applied) on `rows`, at each budget.

    Args:
        rows: (N, L) token ids, unpadded; one row per forward pass.
        router: one of `ROUTERS`; the model's Focus layers supply its parameters (indexer weights, centroids).
        budgets: per query, a float in (0, 1] keeps that share of its distant keys (rounded up), an int that many
            (all where it has fewer).
        last_queries: measure only the last this many queries of each row (long rows: where the context is long).
        query_chunk: queries ranked at a time (memory: heads x chunk x L floats, a few times over).
    Returns:
        {"budgets": [...], "overall": [shares per budget], "layers": [[shares per budget] per layer],
         "heads": [[[shares per budget] per key/value head] per layer]}, shares as `_shares` makes them: "recall",
        "oracle_recall", "of_oracle" (recall / oracle recall), "kept" (share of the distant pairs), "distant_mass"
        (share of all attention mass on distant pairs).
    """
    if not has_focus(model):
        raise ValueError("routing_recall needs a model with Focus applied (its layers hold the router)")
    return routing_recalls(model, rows, {router: (router, router_state(model))}, budgets, last_queries,
                           query_chunk)[router]


def router_state(model: PreTrainedModel) -> list[dict]:
    """The router Focus's layers hold now, one dict per layer (its config, centroids, indexer weights): what
    `routing_recalls` screens it by once `remove_focus` has taken it off and another router is on."""
    return [{name: getattr(module, name) for name in _ROUTER_STATE if hasattr(module, name)}
            for module in attention_modules(model)]


def routing_recalls(
    model: PreTrainedModel,
    rows: torch.Tensor,
    routers: Mapping[str, tuple[str, list[dict]]],
    budgets: Sequence[float | int],
    last_queries: int | None = None,
    query_chunk: int = 512,
) -> dict[str, dict]:
    """`routing_recall` of several routers in one forward pass per row: {name: its result}. `routers`: {name: (one of
    `ROUTERS`, its `router_state`)}, all of one window and one count of sinks, those of the Focus `model` holds (any
    router: its layers carry the screen). The model's attention, the distant keys' weights and the oracle's ranking
    are computed once for every router (at 8K most of a router's screen was its own forward pass)."""
    if not has_focus(model):
        raise ValueError("routing_recall needs a model with Focus applied (its layers hold the router)")
    modules = attention_modules(model)
    for name, (router, layers) in routers.items():
        if router not in ROUTERS:
            raise ValueError(f"routing_recall: unknown router {router!r}; known: {list(ROUTERS)}")
        for module, state in zip(modules, layers):
            if _distant_keys(state["focus_config"]) != _distant_keys(module.focus_config):
                raise ValueError(f"routing_recalls: router {name!r} has another window or sinks than the model's "
                                 f"Focus {_distant_keys(module.focus_config)}; screen it apart")
    for budget in budgets:
        if isinstance(budget, float) and not 0 < budget <= 1 or isinstance(budget, int) and budget < 1:
            raise ValueError(f"routing_recall: a budget is a share in (0, 1] or a count >= 1, got {budget!r}")
    for index, module in enumerate(modules):
        own = {name: (router, layers[index]) for name, (router, layers) in routers.items()}  # (this layer's)
        setattr(module, _STATE, {"routers": own,
                                 "budgets": list(budgets), "last": last_queries, "chunk": query_chunk,
                                 "tally": dict.fromkeys(routers, 0)})
    try:
        with torch.no_grad(), _attending(model, _SCREEN, _screen_attention):
            for row in rows:
                model(input_ids=row[None].to(input_device(model)), use_cache=False)
        tallies = [getattr(module, _STATE)["tally"] for module in modules]  # {name: (K, budgets, 6)} each
    finally:
        for module in modules:
            delattr(module, _STATE)
    return {name: _result(list(budgets), [tally[name] for tally in tallies]) for name in routers}


def _result(budgets: list, tallies: list[torch.Tensor]) -> dict:
    total = sum(t.sum(dim=0) for t in tallies)
    return {"budgets": budgets, "overall": [_shares(b) for b in total],
            "layers": [[_shares(b) for b in t.sum(dim=0)] for t in tallies],
            "heads": [[[_shares(b) for b in head] for head in t] for t in tallies]}


def _distant_keys(config) -> tuple[int, int]:
    """What makes a key distant: beyond the window, and not a sink."""
    return config.window, config.sink_tokens


@contextlib.contextmanager
def _router_of(module: nn.Module, state: dict) -> Iterator[None]:
    """`module` holds the router `state` (`router_state`'s entry for it) within the block, its own after: where its
    own were (parameters, buffers, plain attributes) and as they were (a buffer stays out of a state dict it was out
    of)."""
    places = (module._parameters, module._buffers, module.__dict__)
    own = [{name: place.pop(name) for name in _ROUTER_STATE if name in place} for place in places]
    module.__dict__.update(state)  # (plain attributes: read, never saved)
    try:
        yield
    finally:
        for name in state:
            module.__dict__.pop(name)
        for place, values in zip(places, own):
            place.update(values)


def _shares(tally: torch.Tensor) -> dict[str, float]:
    kept, oracle, distant_mass, kept_pairs, distant_pairs, all_mass = tally.tolist()
    recall = kept / max(distant_mass, 1e-30)
    oracle_recall = oracle / max(distant_mass, 1e-30)
    return {"recall": recall, "oracle_recall": oracle_recall, "of_oracle": recall / max(oracle_recall, 1e-30),
            "kept": kept_pairs / max(distant_pairs, 1), "distant_mass": distant_mass / max(all_mass, 1e-30)}


def _screen_attention(module: nn.Module, query, key, value, attention_mask, scaling=None, dropout=0.0, softcap=None,
                      **kwargs):
    """The unmodified attention, tallying per key/value head and budget what the router keeps of its distant mass."""
    state = getattr(module, _STATE)
    config = module.focus_config
    heads, q_len, d = query.shape[1:]
    k_heads, k_len = key.shape[1], key.shape[2]
    base_mask = None if attention_mask is None else attention_mask[..., :k_len]
    positions = key_positions(kwargs.get("position_ids"), k_len, key.device)
    valid = None if base_mask is None else base_mask.any(dim=-2)[:, 0]
    sinks = sink_keys(valid, k_len, config.sink_tokens, key.device) if config.sink_tokens else None
    first = 0 if state["last"] is None else max(q_len - state["last"], 0)
    tally = {name: torch.zeros(k_heads, len(state["budgets"]), 6, dtype=torch.float64) for name in state["routers"]}
    for start in range(first, q_len, state["chunk"]):
        stop = min(start + state["chunk"], q_len)
        rows = slice(start, stop)
        logits = torch.einsum("bhqd,bhld->bhql", query[:, :, rows].float(),
                              key.float().repeat_interleave(heads // k_heads, dim=1))
        logits = logits * (d**-0.5 if scaling is None else scaling)
        if softcap is not None:
            logits = softcap * torch.tanh(logits / softcap)
        allowed = model_allowed(base_mask, q_len, k_len, query.device)[:, :, rows]  # (B or 1, 1, c, L)
        weights = torch.softmax(logits.masked_fill(~allowed, float("-inf")), dim=-1).nan_to_num(0.0)  # (B, H, c, L)
        distant = allowed & ~local_pairs(q_len, k_len, config.window, query.device)[rows]
        if sinks is not None:
            distant = distant & ~sinks[:, None, None, :]
        distant = distant.expand_as(weights)
        on_distant = weights * distant
        count = distant.sum(dim=-1, keepdim=True)  # (B, H, c, 1)
        needs = [torch.ceil(budget * count.double()).long() if isinstance(budget, float) else count.clamp_max(budget)
                 for budget in state["budgets"]]
        # Both rankings only as far as the most any budget keeps here: a top-k of 2,048 of 8K keys takes a third of
        # a sort of them all (an 8K row's screen 1.34x faster; ties, within a group or a page, fall in an order of
        # torch's choosing either way).
        top = max(1, _most_kept(needs))
        by_weight = on_distant.topk(top, dim=-1).values.cumsum(dim=-1)  # the oracle's: every router's ceiling
        for name, (router, layer_state) in state["routers"].items():
            with _router_of(module, layer_state):
                scores = _scorer(module, router, query, key, value, base_mask, positions, valid)(rows)
            order = scores.expand_as(weights).masked_fill(~distant, float("-inf")).topk(top, dim=-1).indices
            by_router = on_distant.gather(-1, order).cumsum(dim=-1)  # mass of the n best keys by the router's score
            for i, need in enumerate(needs):
                at = (need - 1).clamp_min(0)
                some = need > 0
                kept = by_router.gather(-1, at) * some
                oracle = by_weight.gather(-1, at) * some
                parts = [kept, oracle, on_distant.sum(dim=-1, keepdim=True), need.to(weights.dtype),
                         count.to(weights.dtype), weights.sum(dim=-1, keepdim=True)]
                tally[name][:, i] += torch.stack([_per_kv_head(p, k_heads) for p in parts], dim=-1)
    state["tally"] = {name: state["tally"][name] + tally[name] for name in tally}
    out = unmodified_attention(query, key, value, base_mask, scaling, dropout, softcap)
    return out.transpose(1, 2).contiguous(), None


def _most_kept(needs: list[torch.Tensor]) -> int:
    """The most distant keys any budget keeps in any query (`needs`: per budget, the count each query keeps)."""
    return max(int(need.max()) for need in needs)


def _per_kv_head(x: torch.Tensor, k_heads: int) -> torch.Tensor:
    """(B, H, c, 1) -> (K,) float64 sums over the batch, the key/value head's query heads and the queries."""
    return x.double().unflatten(1, (k_heads, -1)).transpose(0, 1).reshape(k_heads, -1).sum(dim=-1)


def _scorer(module: nn.Module, router: str, query, key, value, base_mask, positions, valid):
    """A function of a slice of the queries -> their scores of every key, broadcastable to (B, H, c, L)."""
    config = module.focus_config
    heads, k_heads, k_len = query.shape[1], key.shape[1], key.shape[2]
    if router == "indexer":
        def indexer(rows):
            scores = indexer_scores(module, query[:, :, rows], key, stored=True)  # as a selection scores them
            return scores if scores.shape[1] == heads else scores.repeat_interleave(heads // k_heads, dim=1)
        return indexer
    if router == "streaming":
        return lambda rows: torch.arange(k_len, device=key.device, dtype=torch.float32)
    if router == "quest":
        return _quest_scorer(query, key, valid)
    routed = route_call(module, query, routing_vectors(module, key if config.route_on == "key" else value, positions),
                        base_mask, positions)
    key_groups = top_k_groups(routed.key_log_assign, config.top_k)  # (B, K, L, k)
    query_log_assign = routed.query_log_assign  # (B, K or H, Q, G)
    r = heads // query_log_assign.shape[1]

    def centroids(rows):
        assign = query_log_assign[:, :, rows]  # (B, K or H, c, G)
        groups = key_groups.repeat_interleave(assign.shape[1] // k_heads, dim=1)  # (B, K or H, L, k)
        best = None
        for t in range(groups.shape[-1]):
            index = groups[..., t][:, :, None, :].expand(-1, -1, assign.shape[2], -1)  # (B, ., c, L)
            score = assign.gather(-1, index)
            best = score if best is None else torch.maximum(best, score)
        return best if r == 1 else best.repeat_interleave(r, dim=1)
    return centroids


def _quest_scorer(query, key, valid):
    """Quest's bound of each key's page, per query head (`focus.attention.routers.selectors.quest_bound`)."""
    k_len = key.shape[2]
    extremes = page_extremes(key, valid)  # once per call: the pages do not depend on the queries
    return lambda rows: quest_bound(query[:, :, rows], *extremes).repeat_interleave(QUEST_PAGE, dim=-1)[..., :k_len]
