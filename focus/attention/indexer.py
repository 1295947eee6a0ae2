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

import torch
from torch import nn

from focus.attention.reference import local_pairs, model_allowed

QUERY_WEIGHTS = "focus_indexer_query"
KEY_WEIGHTS = "focus_indexer_key"


def indexer_scores(module: nn.Module, query: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    """The layer's index scores, float32: (B, H, Q, L) per query head, or (B, K, Q, L) per key/value head under
    `route_queries="kv_head"` (the mean of its query heads' scores). query (B, H, Q, D), key (B, K, L, D) as the layer
    attends with them (rotary embedded). Differentiable in the indexer's weights only."""
    w_q, w_k = getattr(module, QUERY_WEIGHTS), getattr(module, KEY_WEIGHTS)  # (H, D, r), (K, D, r)
    heads, d = query.shape[1], query.shape[-1]
    k_heads = key.shape[1]
    q = torch.einsum("bhqd,hdr->bhqr", query.detach().float(), w_q).unflatten(1, (k_heads, heads // k_heads))
    k = torch.einsum("bkld,kdr->bklr", key.detach().float(), w_k)
    scores = torch.einsum("bkgqr,bklr->bkgql", q, k) * d**-0.5  # (B, K, R, Q, L)
    if module.focus_config.route_queries == "kv_head":
        return scores.mean(dim=2)
    return scores.flatten(1, 2)


def top_scored(scores: torch.Tensor, distant: torch.Tensor, need: torch.Tensor) -> torch.Tensor:
    """(.., Q, L) bool: of each query's `distant` keys (broadcast to `scores` (.., Q, L)), the `need` (.., Q, 1) with
    the highest scores (ties at the threshold all kept, which floats make rare)."""
    distant = distant.expand_as(scores)
    ranked = scores.masked_fill(~distant, float("-inf")).sort(dim=-1, descending=True).values
    need = need.expand(*scores.shape[:-1], 1)
    threshold = ranked.gather(-1, (need - 1).clamp_min(0))
    return distant & (scores >= threshold) & (need > 0)


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
