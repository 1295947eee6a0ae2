"""A per-key indexer: the router that picks a query's distant keys one by one, by a cheap estimate of their logits.

Focus's groups keep about 70% of the distant attention mass that full attention puts where they keep a third of the
pairs; an oracle that keeps each query's heaviest distant keys keeps 91% and is no worse than the dense model
(docs/study.md, the floor). The indexer estimates the true logit q.k of every distant key in a low-rank space,

    s_ij = (q_i W_q[h]) . (k_j W_k[kv(h)]) / sqrt(D),     W_q[h], W_k[kv]: (D, r) per query and key/value head,

and keeps, per query, the `budget` share of its distant keys with the highest s (`FocusConfig.selector="indexer"`).
Started from the keys' principal directions (W_q = W_k = the top-r eigenvectors of the layer's uncentred key second
moment, Loki's training-free estimate: `principal_directions`), it trains with the model frozen and attending densely,
as DeepSeek's DSA warms up its lightning indexer: the KL divergence from each query's true distant attention
(renormalised over its distant keys) to the softmax of its index scores over the same keys (`indexer_loss`), weighted by
the mass the query puts on distant keys. The window and the sinks are kept free, as Focus keeps them, and are not in
the target: they already hold their mass. Under `route_queries="kv_head"` the query heads of a key/value head share
one selection: their scores averaged, their attention summed into one target (DSA shares its indexer across heads).

Shapes: B batch, H query heads, K key/value heads, R = H / K, Q queries, L keys, D head size, r the indexer's rank.
"""

from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from focus.attention.pattern.reference import local_pairs, model_allowed
from focus.attention.routers.routing import sink_keys
from focus.config import FocusConfig

QUERY_WEIGHTS = "focus_indexer_query"
KEY_WEIGHTS = "focus_indexer_key"


CODE_DTYPE = torch.bfloat16
"""The key codes' dtype, where a selection is made: a decoding step reads every cached key's code, so its scoring is
bound by their bytes (bfloat16 halves them; the ranking moves only among near ties: docs/routers.md)."""


def indexer_scores(module: nn.Module, query: torch.Tensor, key: torch.Tensor, stored: bool = False) -> torch.Tensor:
    """The layer's index scores, float32: (B, H, Q, L) per query head, or (B, K, Q, L) per key/value head under
    `route_queries="kv_head"` (the mean of its query heads' scores). query (B, H, Q, D), key (B, K, L, D) as the layer
    attends with them (rotary embedded). Differentiable in the indexer's weights only. `stored`: the key codes as a
    cache stores them (`CODE_DTYPE`, not differentiable): the scores a selection is made by."""
    k = key_codes(module, key).float() if stored else torch.einsum(
        "bkld,kdr->bklr", key.detach().float(), getattr(module, KEY_WEIGHTS))
    return codes_scores(query_codes(module, query), k, query.shape[-1])


def query_codes(module: nn.Module, query: torch.Tensor) -> torch.Tensor:
    """(B, S, Q, r) float32 the codes that score keys, one per selection: per query head (S = H), or under
    `route_queries="kv_head"` the mean of a key/value head's query heads' codes (S = K; its score of a key is then
    the mean of theirs, one product instead of R). query (B, H, Q, D)."""
    w_q = getattr(module, QUERY_WEIGHTS)  # (H, D, r)
    q = torch.einsum("bhqd,hdr->bhqr", query.detach().float(), w_q)
    if module.focus_config.route_queries == "kv_head":
        k_heads = getattr(module, KEY_WEIGHTS).shape[0]
        return q.unflatten(1, (k_heads, q.shape[1] // k_heads)).mean(dim=2)
    return q


def codes_scores(query_code: torch.Tensor, key_code: torch.Tensor, head_dim: int) -> torch.Tensor:
    """(B, S, Q, L) the index scores of `query_codes` (B, S, Q, r) against key codes (B, K, L, r), float32, scaled by
    the head size as the logits are: the one product every selection's scores come from."""
    s, k_heads = query_code.shape[1], key_code.shape[1]
    q = query_code.unflatten(1, (k_heads, s // k_heads)) * head_dim**-0.5  # (B, K, S / K, Q, r): r products, not L
    return (q @ key_code[:, :, None].transpose(-1, -2)).flatten(1, 2)


def key_codes(module: nn.Module, key: torch.Tensor) -> torch.Tensor:
    """(B, K, L, r) `CODE_DTYPE` the index codes `k W_k[kv]` of keys (B, K, L, D), computed in float32: what a
    `FocusCache` keeps per key (`focus.attention.cache.key_codes.KeyCodes`) and a selection scores keys by."""
    with torch.no_grad():
        return torch.einsum("bkld,kdr->bklr", key.float(), getattr(module, KEY_WEIGHTS)).to(CODE_DTYPE)


def indexer_decode_attention(
    module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, codes: torch.Tensor,
    base_mask: torch.Tensor | None, scaling: float | None,
) -> torch.Tensor:
    """One decoding step of an indexer layer (B, H, 1, D): the query's window, its sinks and the `budget` share of its
    distant keys with the highest index scores, read by index, not under a mask over the cache.

    The scores are the cached `codes` (B, K, L, r) against the query's code (r numbers per head, not D per key); the
    kept keys are gathered (window and sinks by position, distant ones by top-k) and attended by SDPA with the query
    heads of a key/value head as its queries. The pairs are `selectors.selected_pairs`' for the indexer; ties at the
    threshold, which floats make rare, keep one key fewer there. base_mask (B, 1, 1, L) the keys the model allows.
    """
    config = module.focus_config
    b, heads, _, d = query.shape
    k_heads, k_len = key.shape[1], key.shape[2]
    r = heads // k_heads
    scores = codes_scores(query_codes(module, query[:, :, -1:]), codes.float(), d)[:, :, 0]  # (B, S, L)
    scores = scores.unflatten(1, (k_heads, scores.shape[1] // k_heads))  # (B, K, 1 (kv_head) or R, L)
    valid = None if base_mask is None else base_mask[:, 0, -1, :k_len].bool()  # (B, L)
    window = min(config.window, k_len)
    start = k_len - window  # the window: the last `window` keys
    sinks = sink_keys(valid, k_len, config.sink_tokens, key.device) if config.sink_tokens else None
    distant = torch.ones(1, k_len, dtype=torch.bool, device=key.device) if valid is None else valid.clone()
    distant[:, start:] = False
    if sinks is not None:
        distant &= ~sinks
    need = distant_need(config, distant.sum(dim=-1))  # (B or 1,)
    top = max(int(need.max()), 1)
    ranked = scores.masked_fill(~distant[:, None, None], float("-inf")).topk(min(top, k_len), dim=-1)
    kept = (torch.arange(ranked.indices.shape[-1], device=key.device) < need[:, None, None, None]) & (
        ranked.values > float("-inf"))
    parts, masks = [ranked.indices], [kept]
    positions = torch.arange(start, k_len, device=key.device).expand(*ranked.indices.shape[:-1], window)
    parts.append(positions)
    masks.append(torch.ones_like(positions, dtype=torch.bool) if valid is None
                 else valid[:, None, None, start:].expand_as(positions))
    if sinks is not None:
        early = sinks[:, :start]  # sinks inside the window are the window's already
        count = min(config.sink_tokens, early.shape[-1])
        if count:
            first = early.int().topk(count, dim=-1)
            parts.append(first.indices[:, None, None].expand(*ranked.indices.shape[:-1], count))
            masks.append((first.values > 0)[:, None, None].expand(*ranked.indices.shape[:-1], count))
    index = torch.cat(parts, dim=-1)  # (B, K, G, n), G = 1 (kv_head) or R
    mask = torch.cat(masks, dim=-1).expand_as(index)
    groups, n = index.shape[2], index.shape[3]
    index = index.expand(b, -1, -1, -1)
    keys, values = (_rows(x, index).view(b, k_heads, groups, n, d) for x in (key, value))
    queries = query[:, :, -1].reshape(b, k_heads, r, 1, d)
    if groups == 1:
        queries = queries.transpose(2, 3)  # (B, K, 1, R, D): the query heads as one selection's queries
    out = F.scaled_dot_product_attention(queries, keys, values, attn_mask=mask.expand(b, -1, -1, -1)[..., None, :],
                                         scale=scaling if scaling is not None else 1 / math.sqrt(d))
    return out.reshape(b, heads, 1, d)


def distant_need(config: FocusConfig, distant: torch.Tensor) -> torch.Tensor:
    """How many of its `distant` (a count per query, any shape) keys each query keeps: `config.budget_keys` of them
    where set (all where it has fewer), else the share `config.budget` rounded up."""
    if config.budget_keys:
        return distant.clamp_max(config.budget_keys).long()
    return torch.ceil(config.budget * distant.double()).long()


def _rows(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """(B, K, G * n, D) the rows `index` (B, K, G, n) of each (batch row, head) of x (B, K, L, D), a cache's view:
    index_select per head (several times faster than `gather` with an index expanded over D, and no copy of a
    cache that is a view into a larger buffer)."""
    b, k_heads = index.shape[:2]
    return torch.stack([x[i, k].index_select(0, index[i, k].flatten()) for i in range(b) for k in range(k_heads)]
                       ).view(b, k_heads, -1, x.shape[-1])


Thresholds = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""(scores (N, L), -inf where a key is no candidate; need (N,) int64) -> (N,) the `need`-th largest candidate score
(+inf where a row keeps none): `topk_thresholds`, or the native kernels' histogram (`indexer_thresholds`)."""


def topk_thresholds(scores: torch.Tensor, need: torch.Tensor) -> torch.Tensor:
    """`Thresholds` by `topk` of the most any row needs (any device), not a sort of all its keys (8K keys: 2K kept)."""
    most = max(int(need.max()), 1) if need.numel() else 1
    ranked = scores.topk(min(most, scores.shape[-1]), dim=-1).values
    threshold = ranked.gather(-1, (need[:, None] - 1).clamp(0, ranked.shape[-1] - 1))[:, 0]
    return threshold.masked_fill(need <= 0, float("inf"))


def top_scored(scores: torch.Tensor, distant: torch.Tensor, need: torch.Tensor,
               thresholds: Thresholds = topk_thresholds) -> torch.Tensor:
    """(.., Q, L) bool: of each query's `distant` keys (broadcast to `scores` (.., Q, L)), the `need` (.., Q, 1) with
    the highest scores (ties at the threshold all kept, which floats make rare), each row's threshold by
    `thresholds`."""
    candidates = scores.masked_fill(~distant.expand_as(scores), float("-inf"))
    rows = need.expand(*scores.shape[:-1], 1).reshape(-1)
    threshold = thresholds(candidates.reshape(-1, scores.shape[-1]), rows).view(*scores.shape[:-1], 1)
    return distant & (scores >= threshold)


def indexer_loss(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    base_mask: torch.Tensor | None,
    sinks: torch.Tensor | None,
    scaling: float | None,
    softcap: float | None,
) -> torch.Tensor:
    """The indexer's loss on one attention call (scalar float32, differentiable in the indexer's weights only):
    sum_i m_i KL(p_i || softmax(s_i)) / sum_i m_i over the distant keys of every query (and query head), p_i its true
    attention renormalised over them, m_i the attention mass it puts there. A call of more than `LOSS_QUERIES`
    queries is scored on that many of them (`loss_queries`).

    Args:
        query (B, H, Q, D), key (B, K, L, D) as the layer attends with them; base_mask (B, 1, Q, L) the pairs the model
        allows or None (causal); sinks (B or 1, L) bool or None.
    """
    config = module.focus_config
    heads, q_len, d = query.shape[1:]
    k_heads, k_len = key.shape[1], key.shape[2]
    rows = loss_queries(q_len, query.device)
    query = query[:, :, rows]
    with torch.no_grad():
        logits = torch.einsum("bkgqd,bkld->bkgql", query.float().unflatten(1, (k_heads, heads // k_heads)),
                              key.float()) * (d**-0.5 if scaling is None else scaling)
        if softcap is not None:
            logits = softcap * torch.tanh(logits / softcap)
        allowed = model_allowed(base_mask, q_len, k_len, query.device)[:, :, rows][:, :, None]  # (B or 1, 1, 1, Q', L)
        weights = torch.softmax(logits.masked_fill(~allowed, float("-inf")), dim=-1).nan_to_num(0.0)
        distant = allowed & ~local_pairs(q_len, k_len, config.window, query.device)[rows]
        if sinks is not None:
            distant = distant & ~sinks[:, None, None, None, :]
        target = weights * distant  # (B, K, R, Q, L)
        if config.route_queries == "kv_head":
            target = target.sum(dim=2)  # (B, K, Q, L)
            distant = distant[:, :, 0]
        else:
            target = target.flatten(1, 2)  # (B, H, Q, L)
            distant = distant.flatten(1, 2)
        mass = target.sum(dim=-1)  # (B, H or K, Q)
        p = target / mass.clamp_min(1e-30)[..., None]
    scores = indexer_scores(module, query, key).masked_fill(~distant, float("-inf"))
    log_q = torch.log_softmax(scores, dim=-1)
    # KL(p || q) = sum_j p_j (log p_j - log q_j); pairs where p is 0 (not distant, or no weight) add nothing.
    kl = torch.where(p > 0, p * (p.clamp_min(1e-30).log() - log_q), torch.zeros_like(p)).sum(dim=-1)
    return (mass * kl).sum() / mass.sum().clamp_min(1e-30)


LOSS_QUERIES = 512
"""A longer call's loss is taken on this many of its queries, evenly spaced from a random offset: its cost grows with
the queries times the keys, and a few hundred queries per row and layer say as much about the indexer's weights."""


def loss_queries(q_len: int, device=None) -> torch.Tensor | slice:
    """The queries a call's loss is taken on: all of up to `LOSS_QUERIES`, else every s-th from a random start (the
    global torch generator: a seeded run draws the same), so each query is equally likely to be in it."""
    if q_len <= LOSS_QUERIES:
        return slice(None)
    stride = -(-q_len // LOSS_QUERIES)
    start = int(torch.randint(stride, ()))
    return torch.arange(start, q_len, stride, device=device)


def principal_directions(second_moment: torch.Tensor, rank: int) -> torch.Tensor:
    """(K, D, rank) the top-`rank` eigenvectors of each head's key second moment (K, D, D), as columns, largest first:
    the rank-r subspace that keeps most of the keys' energy, so q.(P P^T k) estimates q.k (Loki)."""
    _, eigenvectors = torch.linalg.eigh(second_moment.double())  # ascending
    return eigenvectors[..., -rank:].flip(-1).float()


def calibrate_indexer(module: nn.Module, second_moment: torch.Tensor) -> None:
    """Set the layer's indexer to the principal directions of its keys (K, D, D second moment): W_k[kv] = W_q[h] = P,
    for every query head h of key/value head kv."""
    w_q, w_k = getattr(module, QUERY_WEIGHTS), getattr(module, KEY_WEIGHTS)
    directions = principal_directions(second_moment, w_k.shape[-1]).to(w_k.device)  # (K, D, r)
    with torch.no_grad():
        w_k.copy_(directions)
        w_q.copy_(directions.repeat_interleave(w_q.shape[0] // w_k.shape[0], dim=0))
