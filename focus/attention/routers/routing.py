"""Routing tokens to groups: the one place Focus decides which groups a token joins.

The layer functions here (`route_call`, `cache_key_groups`, `step_groups`) route one attention call of a Focus
layer through the centroid router's tensor functions (`focus.attention.routers.centroids`), reading its config,
centroids and balance bias off the module; the dense reference, the decomposed prefill and the decoding step all
route through them, so a routing change is written once.

Shapes use B batch, H query heads, K key/value (routing) heads, Q queries, L tokens, G groups, D vector size.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from focus.attention.labels import label
from focus.attention.native import kernels
from focus.attention.routers.centroids import (
    inference_log_assign,
    rotary_tables,
    routing_logits,
    sinkhorn,
    top_k_groups,
    undo_rotary,
)
from focus.config import FocusConfig
from focus.distributed import average_across_processes


@dataclass(frozen=True)
class Routed:
    """Everything one attention call routed.

    valid: (B, L) bool real (non-padding) keys, or None when nothing is padded.
    query_log_assign: (B, K or H, Q, G) the queries' log-assignments (H: each query head routes its own vector).
    key_log_assign: (B, K, L, G) the keys' log-assignments.
    query_groups: the queries' top-k groups, where `route_prompt_natively` routed them instead.
    sinks: (B or 1, L) bool keys in every group (the first real tokens), or None.
    dense: (K,) bool key/value heads that keep every pair the model allows (`FocusConfig.dense_heads`), or None.
    """

    valid: torch.Tensor | None
    query_log_assign: torch.Tensor | None
    key_log_assign: torch.Tensor | None
    sinks: torch.Tensor | None
    dense: torch.Tensor | None = None
    query_groups: torch.Tensor | None = None  # (B, K or H, Q, top_k) routed natively (`route_prompt_natively`): then
    # the log-assignments are None


def route_call(
    module: nn.Module, query: torch.Tensor, key_vectors: torch.Tensor, base_mask: torch.Tensor | None,
    positions: torch.Tensor,
) -> Routed:
    """Route the queries and keys of one attention call of a Focus layer.

    Args:
        query: (B, H, Q, D) as the layer attends with it (rotary-embedded).
        key_vectors: (B, K, L, D) the routing vectors of the keys (`routing_vectors`).
        base_mask: (B, 1, Q, L) bool pairs the model allows, or None (plainly causal).
        positions: (B or 1, L) positions of the keys (`key_positions`); the queries are the last Q of them.
    """
    config: FocusConfig = module.focus_config
    q_len, k_len = query.shape[-2], key_vectors.shape[-2]
    valid = None if base_mask is None else base_mask.any(dim=-2)[:, 0]
    log_p = route_keys(module, key_vectors, valid)
    if config.route_queries != "key":
        query_vectors = routing_vectors(module, query, positions[:, k_len - q_len :])
        log_p_q = route_query_heads(module, query_vectors, key_vectors.shape[1])
    else:
        log_p_q = log_p[:, :, k_len - q_len :]  # (B, K, Q, G): a query token is routed by its own key
    sinks = sink_keys(valid, k_len, config.sink_tokens, key_vectors.device) if config.sink_tokens else None
    return Routed(valid, log_p_q, log_p, sinks, dense_heads(module, key_vectors.shape[1], key_vectors.device))


def route_prompt_natively(
    module: nn.Module, query: torch.Tensor, keys: torch.Tensor, base_mask: torch.Tensor | None, positions: torch.Tensor
) -> tuple[torch.Tensor, Routed]:
    """A whole prompt's hard routing in two native calls (`focus/attention/native/csrc/route.cpp`): the
    keys' groups (B, K, L, top_k), as `cache_key_groups` finds them, and a `Routed` holding the queries' groups, as
    `route_call` then `top_k_groups` find them (`route_queries` "query" or "kv_head"), without log-assignments.
    Within float32 rounding of the eager routing (a product summed in another order): a group can differ only
    where two scores tie to about 1e-6.

    Args:
        query: (B, H, L, D) rotary-embedded; keys: (B, K, L, D) what the layer routes keys on; base_mask as for
            `route_call`; positions: (B or 1, L) the tokens' positions (`key_positions`).
    """
    config: FocusConfig = module.focus_config
    k_heads, heads = keys.shape[1], query.shape[1]
    unit, bias = step_router(module, k_heads, heads)  # (K + H, G, D) unit centroids, (K + H, G) bias (0: queries)
    cos = sin = None
    inv_freq = getattr(module, "focus_inv_freq", None)
    if config.unrotate and inv_freq is not None:
        tables = rotary_tables(positions, inv_freq, keys.device)  # (B or 1, 1, L, D): each angle twice
        cos, sin = (t[:, 0, :, : t.shape[-1] // 2].contiguous() for t in tables)
    ext = kernels()
    with label("focus/native_route"):
        key_groups = ext.route_tokens(keys, cos, sin, unit[:k_heads].contiguous(), bias[:k_heads].contiguous(),
                                      config.temperature, config.top_k, 1)
        share = heads // k_heads if config.route_queries == "kv_head" else 1
        query_groups = ext.route_tokens(query, cos, sin, unit[k_heads:].contiguous(), None, config.temperature,
                                        config.top_k, share)
    valid = None if base_mask is None else base_mask.any(dim=-2)[:, 0]
    sinks = sink_keys(valid, keys.shape[2], config.sink_tokens, keys.device) if config.sink_tokens else None
    routed = Routed(valid, None, None, sinks, dense_heads(module, k_heads, keys.device), query_groups)
    return key_groups, routed


def dense_heads(module: nn.Module, k_heads: int, device=None) -> torch.Tensor | None:
    """(K,) bool the layer's key/value heads that attend densely (`FocusConfig.dense_heads`), or None when none do."""
    heads = module.focus_config.dense_heads_of(getattr(module, "layer_idx", -1))
    if not heads:
        return None
    return torch.zeros(k_heads, dtype=torch.bool, device=device).index_fill_(0, torch.tensor(heads, device=device), True)


def route_keys(module: nn.Module, vectors: torch.Tensor, valid: torch.Tensor | None) -> torch.Tensor:
    """Log-assignments (B, K, L, G) of every key token to its layer's groups.

    While the centroids are being trained (grad enabled and they require it), tokens are balanced by
    Sinkhorn over the sequence and the running group bias is updated; otherwise each token is routed
    causally by its own logits plus that bias (`inference_log_assign`). The routing input is detached:
    gradients reach the centroids only, never the frozen network through this path.

    Args:
        vectors: (B, K, L, D) keys or values.
        valid: (B, L) bool, False for padding, or None.
    """
    config: FocusConfig = module.focus_config
    logits = layer_routing_logits(module, vectors)
    if not centroids_training(module):
        return inference_log_assign(logits, module.focus_group_bias)
    log_p, potential = sinkhorn(logits, config.sinkhorn_iters, None if valid is None else valid[:, None])
    with torch.no_grad():
        # Every process of a data-parallel run keeps the same bias: the mean over the whole global batch.
        step_mean = average_across_processes(potential.mean(dim=0))  # (K, G)
        if module.focus_centroids.shape[0] == 1:  # shared centroids: one bias row for all heads
            step_mean = step_mean.mean(dim=0, keepdim=True)
        module.focus_group_bias.lerp_(step_mean.to(module.focus_group_bias.dtype), 1 - config.balance_momentum)
    return log_p


def cache_key_groups(module: nn.Module, key_vectors: torch.Tensor) -> torch.Tensor:
    """(B, K, n, top_k) int64 the groups of keys entering a KV cache: inference routing, as `route_keys` routes
    them outside training. `key_vectors` (B, K, n, D) are their routing vectors."""
    logits = layer_routing_logits(module, key_vectors)
    return top_k_groups(inference_log_assign(logits, module.focus_group_bias), module.focus_config.top_k)


def step_groups(
    module: nn.Module, query: torch.Tensor, key_vectors: torch.Tensor, position: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """One decoding step's routing in one pass: the groups of the key that just entered the cache (B, K, 1, top_k),
    as `cache_key_groups` routes it, and of the query heads (B, H, top_k), as `route_call` routes queries (their own
    query vectors under `route_queries="query"` or `"kv_head"`, else the key's groups).

    Keys and query heads are routed as the heads of one call (one rotary undo, one product with the centroids, one
    top-k): a step does this in every layer, so its tensor ops are a cost of their own. Under causal routing both
    depend on this token alone, so the result is the same as routing each apart.

    Args:
        query: (B, H, 1, D); key_vectors: (B, K, 1, D) what the layer routes keys on (`FocusConfig.route_on`),
            rotary embedded; position: (B or 1, 1).
    """
    config = module.focus_config
    b, h = query.shape[:2]
    k_heads = key_vectors.shape[1]
    by_query = config.route_queries != "key"
    centroids, bias = step_router(module, k_heads, h if by_query else 0)  # (K [+ H], G, D) unit, (K [+ H], G)
    vectors = torch.cat([key_vectors, query], dim=1) if by_query else key_vectors
    logits = torch.einsum("bhld,hgd->bhlg", F.normalize(routing_vectors(module, vectors, position).float(), dim=-1),
                          centroids) / config.temperature
    if config.route_queries == "kv_head":
        logits = torch.cat([logits[:, :k_heads], _kv_head_mean(logits[:, k_heads:], k_heads)], dim=1)
    groups = top_k_groups(torch.log_softmax(logits + bias[:, None, :], dim=-1), config.top_k)  # (B, K [+ H], 1, k)
    key_groups = groups[:, :k_heads]
    if by_query:
        return key_groups, groups[:, k_heads:, 0]
    return key_groups, key_groups[:, :, 0].repeat_interleave(h // k_heads, dim=1)


def step_router(module: nn.Module, k_heads: int, heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The unit centroids of the layer's K key heads then `heads` query heads, (K + heads, G, D), and their group
    bias (the keys' learnt balance bias, none for queries), kept on the module until the centroids or bias change."""
    centroids, bias = module.focus_centroids, module.focus_group_bias
    # Tensors made under torch.inference_mode track no version: their in-place changes go unseen, so nothing is kept.
    tracked = not (centroids.is_inference() or bias.is_inference())
    stamp = (id(centroids), centroids.data_ptr(), centroids._version, id(bias), bias.data_ptr(), bias._version, k_heads,
             heads) if tracked else None
    kept = module.__dict__.get("_focus_step_router")
    if kept is None or kept[0] != stamp or stamp is None:
        unit = F.normalize(centroids.detach().float(), dim=-1)  # (K or 1, G, D)
        key_side = unit.expand(k_heads, -1, -1)
        key_bias = bias.detach().float().expand(k_heads, -1)
        if heads:
            query_side = unit.repeat_interleave(heads // k_heads, dim=0) if unit.shape[0] == k_heads else unit
            unit = torch.cat([key_side, query_side.expand(heads, -1, -1)])
            bias_all = torch.cat([key_bias, torch.zeros_like(key_bias[:1]).expand(heads, -1)])
        else:
            unit, bias_all = key_side.contiguous(), key_bias.contiguous()
        kept = module.__dict__["_focus_step_router"] = (stamp, unit, bias_all)
    return kept[1], kept[2]


def native_step_router(module: nn.Module, k_heads: int, heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`step_router` as the native step reads it: the unit centroids transposed and padded (`router_panel` of
    `focus.attention.native.kernels`, (K + heads, D, G_pad)) and the bias, the panel kept beside the centroids it was
    made of."""
    unit, bias = step_router(module, k_heads, heads)
    kept = module.__dict__.get("_focus_native_step_router")
    if kept is None or kept[0] is not unit:
        kept = module.__dict__["_focus_native_step_router"] = (unit, kernels().router_panel(unit))
    return kept[1], bias


def route_query_heads(module: nn.Module, query: torch.Tensor, k_heads: int) -> torch.Tensor:
    """Log-assignments (B, H, Q, G) of every query head's query vector to the groups of its key/value head.

    A plain softmax over groups, in training as at inference: a query's groups depend on that query alone (causal,
    stateless in decoding), and balance is the keys' business (their groups set how many keys each query reads).
    The query is detached, as the keys are: gradients reach the centroids only. Under `route_queries="kv_head"`
    the R query heads of a key/value head share the softmax of their mean logits (the same row R times).

    Args:
        query: (B, H, Q, D), H = K * R.
    """
    centroids = module.focus_centroids  # (K or 1, G, D)
    if centroids.shape[0] == k_heads and k_heads > 1:
        centroids = centroids.repeat_interleave(query.shape[1] // k_heads, dim=0)  # (H, G, D)
    logits = routing_logits(query.detach(), centroids, module.focus_config.temperature)
    if module.focus_config.route_queries == "kv_head":
        logits = _kv_head_mean(logits, k_heads)
    return torch.log_softmax(logits, dim=-1)


def _kv_head_mean(logits: torch.Tensor, k_heads: int) -> torch.Tensor:
    """(B, H, Q, G) query-head logits -> each key/value head's mean over its R = H / K query heads, repeated R times."""
    b, h = logits.shape[:2]
    shared = logits.view(b, k_heads, h // k_heads, *logits.shape[2:]).mean(dim=2, keepdim=True)
    return shared.expand(-1, -1, h // k_heads, *logits.shape[2:]).reshape(logits.shape)


def layer_routing_logits(module: nn.Module, vectors: torch.Tensor) -> torch.Tensor:
    """(B, K, L, G) float32 routing logits of one Focus layer: `vectors` (B, K, L, D), detached, against its centroids."""
    return routing_logits(vectors.detach(), module.focus_centroids, module.focus_config.temperature)


def routing_vectors(module: nn.Module, vectors: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """What a Focus layer routes: `vectors` (B, heads, L, D) at `positions` (B or 1, L), with the layer's rotary
    embedding undone when the config asks for it and the model has one (float32 then; else unchanged)."""
    inv_freq = getattr(module, "focus_inv_freq", None)
    if not module.focus_config.unrotate or inv_freq is None:
        return vectors
    return undo_rotary(vectors, positions, inv_freq)


def key_positions(position_ids: torch.Tensor | None, k_len: int, device: torch.device, first: int = 0) -> torch.Tensor:
    """(B or 1, L - first) positions of the keys from the `first`-th on. The queries are the last keys, and positions
    run on by one per key: true of a whole sequence, of a KV cache, and of left padding as generate() numbers it
    (padding keys, numbered otherwise, are never in a pair). So the positions of a cache follow from the queries'
    alone: no state."""
    steps = torch.arange(first, k_len, device=device)[None]
    if position_ids is None:
        return steps
    return position_ids[:, -1:].to(device) - (k_len - 1) + steps


def centroids_training(module: nn.Module) -> bool:
    """Whether this call trains the layer's router (grad enabled and its parameters require it): its centroids, or
    its indexer's weights under `selector="indexer"`."""
    indexed = module.focus_config.selector == "indexer"  # asked every call: no failing attribute lookup
    router = module.focus_indexer_key if indexed else module.focus_centroids
    return torch.is_grad_enabled() and router.requires_grad


def sink_keys(valid: torch.Tensor | None, k_len: int, sink_tokens: int, device=None) -> torch.Tensor:
    """(B or 1, L) bool: the first `sink_tokens` real (non-padding) keys of each sequence, which belong to every group
    (attention sinks).

    Args:
        valid: (B, L) bool, False for padding, or None when nothing is padded.
    """
    if valid is None:
        return (torch.arange(k_len, device=device) < sink_tokens)[None]
    return valid & (valid.long().cumsum(dim=-1) <= sink_tokens)
