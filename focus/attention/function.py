"""The attention function transformers calls for a Focus model, registered under the name "focus".

transformers hands it the layer module, the projected (and rotary-embedded) heads and the mask its
registered mask function built; everything Focus needs (config, centroids, balance bias) sits on the
module, put there by `apply_focus`.
"""

from __future__ import annotations

import torch
from torch import nn

from focus.attention.decoding import GroupIndex, index_new_keys, sparse_decode_attention, take_cache_index
from focus.attention.decomposed import decomposed_hard_attention
from focus.attention.fast_path import current_fast_path
from focus.attention.recall import LOSSES_ATTRIBUTE, recall_loss
from focus.attention.reference import (
    dense_attention,
    hard_allowed,
    sdpa_grouped,
    sink_keys,
    soft_bias,
    unmodified_attention,
)
from focus.attention.routing import inference_log_assign, routing_logits, sinkhorn, top_k_groups, undo_rotary
from focus.config import FocusConfig
from focus.distributed import average_across_processes

FOCUS_ATTENTION = "focus"
TRACE_ATTRIBUTE = "focus_trace"
"""A list set under this name on a Focus attention module receives the routing logits (B, K, L, G) of every call,
whether or not the call sparsifies (`focus.eval.interpret.trace_routing` sets and removes it)."""


def route(module: nn.Module, vectors: torch.Tensor, valid: torch.Tensor | None) -> torch.Tensor:
    """Log-assignments (B, K, L, G) of every key token to its layer's groups.

    While the centroids are being trained (grad enabled and they require it), tokens are balanced by
    Sinkhorn over the sequence and the running group bias is updated; otherwise each token is routed
    causally by its own logits plus that bias. The routing input is detached: gradients reach the
    centroids only, never the frozen network through this path.

    Args:
        vectors: (B, K, L, D) keys or values.
        valid: (B, L) bool, False for padding, or None.
    """
    config: FocusConfig = module.focus_config
    centroids: torch.Tensor = module.focus_centroids
    logits = layer_routing_logits(module, vectors)
    if not (torch.is_grad_enabled() and centroids.requires_grad):
        return inference_log_assign(logits, module.focus_group_bias)
    log_p, potential = sinkhorn(logits, config.sinkhorn_iters, None if valid is None else valid[:, None])
    with torch.no_grad():
        # Every process of a data-parallel run keeps the same bias: the mean over the whole global batch.
        step_mean = average_across_processes(potential.mean(dim=0))  # (K, G)
        if centroids.shape[0] == 1:  # shared centroids: one bias row for all heads
            step_mean = step_mean.mean(dim=0, keepdim=True)
        module.focus_group_bias.lerp_(step_mean.to(module.focus_group_bias.dtype), 1 - config.balance_momentum)
    return log_p


def layer_routing_logits(module: nn.Module, vectors: torch.Tensor) -> torch.Tensor:
    """(B, K, L, G) float32 routing logits of one Focus layer: `vectors` (B, K, L, D), detached, against its centroids."""
    return routing_logits(vectors.detach(), module.focus_centroids, module.focus_config.temperature)


def key_positions(position_ids: torch.Tensor | None, k_len: int, device: torch.device) -> torch.Tensor:
    """(B or 1, L) positions of the keys. The queries are the last keys, and positions run on by one per key: true
    of a whole sequence, of a KV cache, and of left padding as generate() numbers it (padding keys, numbered
    otherwise, are never in a pair). So the positions of a cache follow from the queries' alone: no state."""
    steps = torch.arange(k_len, device=device)[None]
    if position_ids is None:
        return steps
    return position_ids[:, -1:].to(device) - (k_len - 1) + steps


def routing_vectors(module: nn.Module, vectors: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """What a Focus layer routes: `vectors` (B, heads, L, D) at `positions` (B or 1, L), with the layer's rotary
    embedding undone when the config asks for it and the model has one (float32 then; else unchanged)."""
    inv_freq = getattr(module, "focus_inv_freq", None)
    if not module.focus_config.unrotate or inv_freq is None:
        return vectors
    return undo_rotary(vectors, positions, inv_freq)


def route_queries(module: nn.Module, query: torch.Tensor, k_heads: int) -> torch.Tensor:
    """Log-assignments (B, H, Q, G) of every query head's query vector to the groups of its key/value head.

    A plain softmax over groups, in training as at inference: a query's groups depend on that query alone (causal,
    stateless in decoding), and balance is the keys' business (their groups set how many keys each query reads).
    The query is detached, as the keys are: gradients reach the centroids only.

    Args:
        query: (B, H, Q, D), H = K * R.
    """
    centroids = module.focus_centroids  # (K or 1, G, D)
    if centroids.shape[0] == k_heads and k_heads > 1:
        centroids = centroids.repeat_interleave(query.shape[1] // k_heads, dim=0)  # (H, G, D)
    logits = routing_logits(query.detach(), centroids, module.focus_config.temperature)
    return torch.log_softmax(logits, dim=-1)


def focus_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    softcap: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers attention interface: query (B, H, Q, D), key/value (B, K, L, D) -> (B, Q, H, D).

    `attention_mask` is the boolean (B, 1, Q, L) mask of `sdpa_mask` (True = attend), or None for plain
    causal attention. The model's own sliding window and padding are in it; Focus only removes pairs.
    """
    config: FocusConfig = module.focus_config
    q_len, k_len = query.shape[-2], key.shape[-2]
    base_mask = None if attention_mask is None else attention_mask[..., :k_len]
    trace = getattr(module, TRACE_ATTRIBUTE, None)
    positions = key_positions(kwargs.get("position_ids"), k_len, key.device)
    index = take_cache_index(module)  # a FocusCache's group index of this layer's cached keys, or None
    if index is not None:
        past = k_len - q_len
        arrived = (key if config.route_on == "key" else value)[:, :, past:]
        valid = None if base_mask is None else base_mask.any(dim=-2)[:, 0, past:]
        index_new_keys(module, index, routing_vectors(module, arrived, positions[:, past:]), past, valid)
    if config.window >= k_len and trace is None:
        # Every pair the model allows is local: Focus is exactly the model's own attention, and nothing routes.
        out = unmodified_attention(query, key, value, base_mask, scaling, dropout, softcap)
        return out.transpose(1, 2).contiguous(), None
    if index is not None and q_len == 1 and config.mode == "hard" and trace is None and _fast_path_applies(
        query, key, softcap, dropout, kwargs.get("sliding_window")
    ):
        out = _sparse_step(module, query, key, value, index, base_mask, positions, scaling)
        return out.transpose(1, 2).contiguous(), None
    key_vectors = routing_vectors(module, key if config.route_on == "key" else value, positions)
    if trace is not None:
        trace.append(layer_routing_logits(module, key_vectors))
    if config.window >= k_len:
        out = unmodified_attention(query, key, value, base_mask, scaling, dropout, softcap)
        return out.transpose(1, 2).contiguous(), None

    valid, log_p_q, log_p, sinks = route_call(module, query, key_vectors, base_mask, positions)
    if config.objective == "attention_recall" and _centroids_training(module):
        # Training for recall: the layer attends as the pretrained model does, and scores its routing against that.
        loss = recall_loss(query, key, log_p_q, log_p, config.window, base_mask, sinks, scaling, softcap)
        module.__dict__.setdefault(LOSSES_ATTRIBUTE, []).append(loss)
        out = unmodified_attention(query, key, value, base_mask, scaling, dropout, softcap)
        return out.transpose(1, 2).contiguous(), None
    if config.objective == "straight_through" and _centroids_training(module):
        # The hard model's forward pass, the soft gate's gradient: out = soft + (hard - soft), the difference detached.
        soft = _soft_attention(module, query, key, value, log_p_q, log_p, base_mask, sinks, scaling, dropout, softcap)
        with torch.no_grad():
            hard = _hard_attention(module, query, key, value, log_p_q, log_p, valid, base_mask, sinks, None, scaling,
                                   dropout, softcap, kwargs.get("sliding_window"))
        out = soft + (hard - soft).detach()
    elif config.mode == "soft":
        out = _soft_attention(module, query, key, value, log_p_q, log_p, base_mask, sinks, scaling, dropout, softcap)
    else:
        out = _hard_attention(module, query, key, value, log_p_q, log_p, valid, base_mask, sinks, index, scaling,
                              dropout, softcap, kwargs.get("sliding_window"))
    return out.transpose(1, 2).contiguous(), None


def _centroids_training(module: nn.Module) -> bool:
    return torch.is_grad_enabled() and module.focus_centroids.requires_grad


def _soft_attention(module, query, key, value, log_p_q, log_p, base_mask, sinks, scaling, dropout, softcap):
    """Soft Focus (B, H, Q, D): every pair the model allows, distant ones charged the soft gate."""
    config: FocusConfig = module.focus_config
    bias, allowed = soft_bias(log_p_q, log_p, config.window, base_mask, config.gate_floor, sinks, config.gate)
    if softcap is not None:  # SDPA has no soft-capping: use the explicit path (Gemma 2)
        return dense_attention(query, key, value, allowed, bias, scaling, softcap)
    return sdpa_grouped(query, key, value, allowed, bias, scaling, dropout)


def _hard_attention(module, query, key, value, log_p_q, log_p, valid, base_mask, sinks, index, scaling, dropout,
                    softcap, sliding_window):
    """Hard Focus (B, H, Q, D): the window, the sinks and the keys of the query's top-k groups."""
    config: FocusConfig = module.focus_config
    q_len, k_len = query.shape[-2], key.shape[-2]
    # A FocusCache's index holds every cached key's groups, assigned once: the whole generation sees one.
    groups = top_k_groups(log_p, config.top_k) if index is None else index.groups(k_len).clamp_min(0)
    query_groups = top_k_groups(log_p_q, config.top_k) if config.route_queries == "query" else None
    if _decomposable(query, key, softcap, dropout, sliding_window):
        return decomposed_hard_attention(query, key, value, groups, config.window, valid, sinks, scaling,
                                         query_groups=query_groups)
    allowed = hard_allowed(
        groups[:, :, k_len - q_len :] if query_groups is None else query_groups, groups, config.num_groups,
        config.window, base_mask, sinks,
    )
    if softcap is not None:
        return dense_attention(query, key, value, allowed, None, scaling, softcap)
    return sdpa_grouped(query, key, value, allowed, None, scaling, dropout)


def route_call(
    module: nn.Module, query: torch.Tensor, key_vectors: torch.Tensor, base_mask: torch.Tensor | None,
    positions: torch.Tensor,
) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Everything one attention call routes: (valid keys (B, L) or None, query log-assignments (B, K or H, Q, G),
    key log-assignments (B, K, L, G), sink keys (B or 1, L) or None).

    Args:
        key_vectors: (B, K, L, D) the routing vectors of the keys (`routing_vectors`).
        positions: (B or 1, L) positions of the keys (`key_positions`); the queries are the last Q of them.
    """
    config: FocusConfig = module.focus_config
    q_len, k_len = query.shape[-2], key_vectors.shape[-2]
    valid = None if base_mask is None else base_mask.any(dim=-2)[:, 0]  # (B, L) real (non-padding) keys
    log_p = route(module, key_vectors, valid)  # (B, K, L, G)
    if config.route_queries == "query":
        query_vectors = routing_vectors(module, query, positions[:, k_len - q_len :])
        log_p_q = route_queries(module, query_vectors, key_vectors.shape[1])  # (B, H, Q, G)
    else:
        log_p_q = log_p[:, :, k_len - q_len :]  # (B, K, Q, G): a query token is routed by its own key
    sinks = sink_keys(valid, k_len, config.sink_tokens, key_vectors.device) if config.sink_tokens else None
    return valid, log_p_q, log_p, sinks


def _sparse_step(
    module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, index: GroupIndex,
    base_mask: torch.Tensor | None, positions: torch.Tensor, scaling: float | None,
) -> torch.Tensor:
    """One decoding step (a query token per row) read through the cache's group index: (B, H, 1, D)."""
    config: FocusConfig = module.focus_config
    k_heads, k_len = key.shape[1], key.shape[2]
    if config.route_queries == "query":
        query_vectors = routing_vectors(module, query, positions[:, -1:])
        query_groups = top_k_groups(route_queries(module, query_vectors, k_heads), config.top_k)[:, :, 0]
    else:  # the groups of the query's own key, the last one indexed
        query_groups = index.key_groups[:, :, index.length - 1].long().repeat_interleave(query.shape[1] // k_heads, 1)
    window_valid = None if base_mask is None else base_mask[:, 0, -1, max(k_len - config.window, 0) :]
    return sparse_decode_attention(query, key, value, index, query_groups, config.window, window_valid, scaling)


def _fast_path_applies(query, key, softcap, dropout, sliding_window) -> bool:
    """Whether a fast path (decomposition, sparse decoding step) can compute this call: one is switched on
    (`focus.attention.fast_path`), no gradient, and a model mask that is only causal plus padding (no soft-capping,
    no model window shorter than the keys)."""
    return (
        current_fast_path() != "dense"
        and softcap is None
        and dropout == 0.0
        and (sliding_window is None or sliding_window >= key.shape[-2])
        and not (torch.is_grad_enabled() and (query.requires_grad or key.requires_grad))
    )


def _decomposable(query, key, softcap, dropout, sliding_window) -> bool:
    """Whether the decomposition computes this call: a whole sequence (no cached past) on a fast path."""
    return query.shape[-2] == key.shape[-2] and _fast_path_applies(query, key, softcap, dropout, sliding_window)
