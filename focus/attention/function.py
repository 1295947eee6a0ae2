"""The attention function transformers calls for a Focus model, registered under the name "focus".

transformers hands it the layer module, the projected (and rotary-embedded) heads and the mask its
registered mask function built; everything Focus needs (config, centroids, balance bias) sits on the
module, put there by `apply_focus`. Each call reads its facts (`call_facts`), asks for its plan
(`focus.attention.dispatch.planning`: unmodified, soft or hard; which router, which kernel) and executes it: the router
(`focus.attention.routers.routing`, a selector, the indexer's key codes) makes the call's `CallState`, and the plan's
row of `focus.attention.dispatch.kernel_table` runs on it (`focus.attention.dispatch.kernel_runs`). Where a query
attends as the unmodified model does instead: `FocusConfig.dense_below`, `_dense_rows`.
"""

from __future__ import annotations

import torch
from torch import nn

from focus.attention.cache.decoding import index_new_keys, take_cache_index
from focus.attention.cache.group_index import GroupIndex
from focus.attention.cache.key_codes import KeyCodes
from focus.attention.dispatch.facts import CallFacts
from focus.attention.dispatch.kernel_table import kernel_row
from focus.attention.dispatch.planning import Plan, plan
from focus.attention.kernels.call import AttentionCall, CallState
from focus.attention.labels import label
from focus.attention.pattern.reference import (
    causal_pairs,
    dense_attention,
    sdpa_grouped,
    soft_bias,
    unmodified_attention,
)
from focus.attention.routers.indexer import indexer_loss, key_codes
from focus.attention.routers.recall import LOSSES_ATTRIBUTE, recall_loss
from focus.attention.routers.routing import (
    Routed,
    cache_key_groups,
    centroids_training,
    key_positions,
    layer_routing_logits,
    route_call,
    route_prompt_natively,
    routing_vectors,
    sink_keys,
    step_groups,
)
from focus.attention.routers.selectors import SELECTORS, selected_pairs
from focus.config import FocusConfig

FOCUS_ATTENTION = "focus"
TRACE_ATTRIBUTE = "focus_trace"
"""A list set under this name on a Focus attention module receives the routing logits (B, K, L, G) of every call,
whether or not the call sparsifies (`focus.eval.interpret.trace_routing` sets and removes it)."""


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
    out = _attend(module, query, key, value, attention_mask, scaling, dropout, softcap, **kwargs)
    return out.transpose(1, 2).contiguous(), None


def _attend(module, query, key, value, attention_mask, scaling, dropout, softcap, **kwargs) -> torch.Tensor:
    """`focus_attention`'s output, (B, H, Q, D): the call's plan (`focus.attention.dispatch.planning`), executed."""
    config: FocusConfig = module.focus_config
    k_len = key.shape[-2]
    base_mask = None if attention_mask is None else attention_mask[..., :k_len]
    call = AttentionCall(query, key, value, base_mask, scaling, dropout, softcap, kwargs.get("sliding_window"))
    trace = getattr(module, TRACE_ATTRIBUTE, None)
    index = take_cache_index(module)  # a FocusCache's group index of this layer's cached keys, or None
    chosen = plan(config, call_facts(module, call, index, trace is not None))
    position_ids = kwargs.get("position_ids")
    if chosen.attention == "attention_recall" and config.selector == "indexer":
        # The indexer's warm-up: the layer attends as the pretrained model does; the indexer learns its distant keys.
        valid = None if base_mask is None else base_mask.any(dim=-2)[:, 0]
        sinks = sink_keys(valid, k_len, config.sink_tokens, key.device) if config.sink_tokens else None
        _keep_recall_loss(module, indexer_loss(module, query, key, base_mask, sinks, scaling, softcap))
        return call.unmodified()
    if isinstance(index, KeyCodes):  # the indexer's codes of the keys that just arrived, whatever attends
        past = k_len - query.shape[-2]
        index.extend(key_codes(module, key[:, :, past:]), past)
    # The indexer's own prompt and steps (the router checked first: no table lookup on the groups' decoding steps).
    if chosen.attention == "hard" and chosen.router == "indexer" and kernel_row(chosen.kernel).selector == "indexer":
        return _run(chosen, CallState(module, index), call)
    if isinstance(index, KeyCodes):
        index = None  # (no groups to index)
    if chosen.router in SELECTORS or chosen.router == "indexer":  # no groups, no index
        with label("focus/selected"):
            selected = selected_pairs(module, query, key, base_mask, position_ids)
            return _run(chosen, CallState(module, selected=selected), call)
    if chosen.kernel == "native_step":  # (its routing and index upkeep are the kernel's)
        return _run(chosen, CallState(module, index, position_ids), call)
    query_groups = routed = None
    if index is not None:  # the cache's index takes the new keys' groups, whatever computes this call
        query_groups, routed = _index_new_keys(module, call, index, chosen, position_ids)
    if chosen.kernel in ("masked_step", "sparse_step"):
        return _run(chosen, CallState(module, index, position_ids, step_groups=query_groups), call)
    if chosen.attention == "unmodified" and trace is None:
        return call.unmodified()
    if routed is None:  # (a native prompt's routing came with its index)
        positions = key_positions(position_ids, k_len, key.device)
        key_vectors = routing_vectors(module, key if config.route_on == "key" else value, positions)
        if trace is not None:
            trace.append(layer_routing_logits(module, key_vectors))
        if chosen.attention == "unmodified":
            return call.unmodified()
        with label("focus/route"):
            routed = route_call(module, query, key_vectors, base_mask, positions)
    if chosen.attention == "attention_recall":
        # Training for recall: the layer attends as the pretrained model does, and scores its routing against that.
        _keep_recall_loss(module, recall_loss(query, key, routed.query_log_assign, routed.key_log_assign, config.window,
                                              base_mask, routed.sinks, scaling, softcap))
        return call.unmodified()
    if chosen.attention == "straight_through":
        # The hard model's forward pass, the soft gate's gradient: out = soft + (hard - soft), the difference detached.
        soft = _soft_attention(config, call, routed)
        with torch.no_grad():
            hard = kernel_row(chosen.kernel).run(CallState(module, routed=routed), call)
        return soft + (hard - soft).detach()
    if chosen.attention == "soft":
        return _with_dense_rows(_soft_attention(config, call, routed), call, chosen.dense_rows)
    with label("focus/hard_attention"):
        return _run(chosen, CallState(module, index, position_ids, routed), call)


def _run(chosen: Plan, state: CallState, call: AttentionCall) -> torch.Tensor:
    """The plan's kernel row run on the call; its first `dense_rows` queries the unmodified model's."""
    return _with_dense_rows(kernel_row(chosen.kernel).run(state, call), call, chosen.dense_rows)


def _keep_recall_loss(module: nn.Module, loss: torch.Tensor) -> None:
    """Keep the layer's loss of this training call for the objective (`focus.train.objective.recall_term`)."""
    kept = module.__dict__.setdefault(LOSSES_ATTRIBUTE, [])
    if kept:  # a training step that never takes the loss would optimise nothing, silently
        raise RuntimeError("the attention-recall loss of the previous forward pass was never collected: train with "
                           "objective=focus.train.objective.focus_objective(model)")
    kept.append(loss)


def call_facts(
    module: nn.Module, call: AttentionCall, index: GroupIndex | KeyCodes | None, traced: bool
) -> CallFacts:
    """The facts of one call that its plan depends on (`focus.attention.dispatch.facts.CallFacts`)."""
    query, key = call.query, call.key
    q_len, k_len = query.shape[-2], key.shape[-2]
    current = left_padded = True
    if index is not None:
        current = index.length == k_len - q_len and index.sinks_found
        if index.native and q_len == k_len and call.base_mask is not None:  # (only the native prefill asks)
            valid = call.base_mask.any(dim=-2)[:, 0]
            left_padded = bool((valid[:, 1:] >= valid[:, :-1]).all())  # no real token before a padding one
    return CallFacts(
        queries=q_len, keys=k_len, heads=query.shape[1], k_heads=key.shape[1], head_dim=query.shape[-1],
        device=query.device.type, cache="none" if index is None else "native" if index.native else "eager",
        index_current=current, left_padded=left_padded,
        gradients=torch.is_grad_enabled() and (query.requires_grad or key.requires_grad),
        training=centroids_training(module), traced=traced, softcap=call.softcap is not None,
        dropout=call.dropout != 0.0, model_window=call.sliding_window, dense_rows=_dense_rows(module, q_len, k_len),
        dtype=str(query.dtype).removeprefix("torch."),
    )


def _index_new_keys(
    module: nn.Module, call: AttentionCall, index: GroupIndex, chosen: Plan, position_ids: torch.Tensor | None
) -> tuple[torch.Tensor | None, Routed | None]:
    """Route the call's new keys into the cache's index, as the plan's router does. Returns the query heads' groups
    (B, H, top_k) of a decoding step (routed in the same pass) and the `Routed` of a natively routed prompt (its
    queries' groups kept for its attention), each None where the plan has none."""
    config: FocusConfig = module.focus_config
    query, key = call.query, call.key
    k_len = key.shape[-2]
    past = k_len - query.shape[-2]
    arrived = (key if config.route_on == "key" else call.value)[:, :, past:]
    arrived_positions = key_positions(position_ids, k_len, key.device, first=past)
    valid = None if call.base_mask is None else call.base_mask.any(dim=-2)[:, 0, past:]
    query_groups = routed = None
    with label("focus/index_new_keys"):  # labels for torch.profiler (benchmarks/profile_focus.py)
        if chosen.kernel in ("masked_step", "sparse_step"):  # the new key and the query heads routed in one pass
            key_groups, query_groups = step_groups(module, query, arrived, arrived_positions)
        elif chosen.router == "native":  # keys and queries routed natively, the queries kept for the prompt
            key_groups, routed = route_prompt_natively(module, query, arrived, call.base_mask, arrived_positions)
        else:
            key_groups = cache_key_groups(module, routing_vectors(module, arrived, arrived_positions))
        index_new_keys(index, key_groups, past, valid)
    return query_groups, routed


def _dense_rows(module: nn.Module, q_len: int, k_len: int) -> int:
    """How many of a call's queries, the first ones, attend as the unmodified model does (`FocusConfig.dense_below`):
    those whose position, their key's slot among the call's keys (k_len - q_len + row, left padding counted), is
    below it. 0 while the centroids train: rows shorter than `dense_below` still train them."""
    below = module.focus_config.dense_below
    if below == 0 or centroids_training(module):
        return 0
    return min(max(below - (k_len - q_len), 0), q_len)


def _with_dense_rows(out: torch.Tensor, call: AttentionCall, rows: int) -> torch.Tensor:
    """`out` (B, H, Q, D) with its first `rows` queries replaced by the unmodified model's attention (`_dense_rows`).

    Causal: those queries see no key after the last of them, so the keys up to it are all they need. Not in place:
    `out` may be what autograd saved (soft mode with gradients, outside training)."""
    if rows == 0:
        return out
    keys = call.key.shape[-2] - call.query.shape[-2] + rows
    if call.base_mask is not None:
        mask = call.base_mask[..., :rows, :keys]
    else:  # plainly causal, queries aligned to the end of the keys
        mask = None if keys == rows else causal_pairs(rows, keys, call.query.device)[None, None]
    own = unmodified_attention(call.query[:, :, :rows], call.key[:, :, :keys], call.value[:, :, :keys], mask,
                               call.scaling, call.dropout, call.softcap)
    return torch.cat([own.to(out.dtype), out[:, :, rows:]], dim=2)


def _soft_attention(config: FocusConfig, call: AttentionCall, routed: Routed) -> torch.Tensor:
    """Soft Focus (B, H, Q, D): every pair the model allows, distant ones charged the soft gate."""
    bias, allowed = soft_bias(routed.query_log_assign, routed.key_log_assign, config.window, call.base_mask,
                              config.gate_floor, routed.sinks, config.gate, routed.dense)
    if call.softcap is not None:  # SDPA has no soft-capping: use the explicit path (Gemma 2)
        return dense_attention(call.query, call.key, call.value, allowed, bias, call.scaling, call.softcap)
    return sdpa_grouped(call.query, call.key, call.value, allowed, bias, call.scaling, call.dropout)
