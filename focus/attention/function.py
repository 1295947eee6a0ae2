"""The attention function transformers calls for a Focus model, registered under the name "focus".

transformers hands it the layer module, the projected (and rotary-embedded) heads and the mask its
registered mask function built; everything Focus needs (config, centroids, balance bias) sits on the
module, put there by `apply_focus`. Each call reads its facts (`call_facts`), asks for its plan
(`focus.attention.planning`: unmodified, soft or hard; which router, which kernel) and executes it: routing is
`focus.attention.routing`'s, the kernels are `reference`'s, `decomposed`'s, `decoding`'s and `native`'s. Where a
query attends as the unmodified model does instead: `FocusConfig.dense_below`, `_dense_rows`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from focus.attention.decoding import index_new_keys, masked_decode_attention, sparse_decode_attention, take_cache_index
from focus.attention.decomposed import decomposed_hard_attention
from focus.attention.facts import CallFacts
from focus.attention.group_index import GroupIndex
from focus.attention.indexer import indexer_decode_attention, indexer_loss, key_codes
from focus.attention.key_codes import KeyCodes
from focus.attention.labels import label
from focus.attention.native import ROUTE_QUERIES, kernels
from focus.attention.planning import Plan, plan
from focus.attention.recall import LOSSES_ATTRIBUTE, recall_loss
from focus.attention.reference import (
    causal_pairs,
    dense_attention,
    hard_allowed,
    sdpa_grouped,
    soft_bias,
    unmodified_attention,
)
from focus.attention.routing import (
    Routed,
    cache_key_groups,
    centroids_training,
    dense_heads,
    key_positions,
    layer_routing_logits,
    native_step_router,
    route_call,
    route_prompt_natively,
    routing_vectors,
    sink_keys,
    step_groups,
    top_k_groups,
)
from focus.attention.selectors import SELECTORS, selected_pairs
from focus.config import FocusConfig

FOCUS_ATTENTION = "focus"
TRACE_ATTRIBUTE = "focus_trace"
"""A list set under this name on a Focus attention module receives the routing logits (B, K, L, G) of every call,
whether or not the call sparsifies (`focus.eval.interpret.trace_routing` sets and removes it)."""


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
    """`focus_attention`'s output, (B, H, Q, D): the call's plan (`focus.attention.planning`), executed."""
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
        if chosen.kernel == "indexer_step":
            with label("focus/indexer_step"):
                return indexer_decode_attention(module, query, key, value, index.codes, base_mask, scaling)
        index = None  # (no groups to index)
    if chosen.router in SELECTORS or chosen.router == "indexer":  # no groups, no index
        with label("focus/selected"):
            allowed = selected_pairs(module, query, key, base_mask, position_ids)
            return _with_dense_rows(_masked(call, allowed), call, chosen.dense_rows)
    if chosen.kernel == "native_step":
        with label("focus/native_step"):
            return _native_decoding_step(module, call, index, position_ids)
    step_query_groups = routed = None
    if index is not None:  # the cache's index takes the new keys' groups, whatever computes this call
        step_query_groups, routed = _index_new_keys(module, call, index, chosen, position_ids)
    if chosen.kernel in ("masked_step", "sparse_step"):
        return _decoding_step(module, call, index, step_query_groups, chosen.kernel)
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
            hard = _hard_attention(config, call, routed, chosen.kernel)
        return soft + (hard - soft).detach()
    if chosen.attention == "soft":
        return _with_dense_rows(_soft_attention(config, call, routed), call, chosen.dense_rows)
    with label("focus/hard_attention"):
        return _with_dense_rows(_hard_attention(config, call, routed, chosen.kernel, index), call, chosen.dense_rows)


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
    """The facts of one call that its plan depends on (`focus.attention.planning.CallFacts`)."""
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


def _hard_attention(
    config: FocusConfig, call: AttentionCall, routed: Routed, kernel: str, index: GroupIndex | None = None
) -> torch.Tensor:
    """Hard Focus (B, H, Q, D) by the plan's `kernel`: the window, the sinks, the keys of the query's top-k groups."""
    q_len, k_len = call.query.shape[-2], call.key.shape[-2]
    # A FocusCache's index holds every cached key's groups, assigned once: the whole generation sees one.
    groups = top_k_groups(routed.key_log_assign, config.top_k) if index is None else index.groups(k_len).clamp_min(0)
    query_groups = routed.query_groups
    if query_groups is None and config.route_queries != "key":
        query_groups = top_k_groups(routed.query_log_assign, config.top_k)
    if kernel.startswith("decomposed_"):
        if config.route_queries == "kv_head" and query_groups.shape[1] == call.query.shape[1]:
            # The query heads of a key/value head share its groups: one copy (native routing gives one already).
            query_groups = query_groups[:, :: call.query.shape[1] // call.key.shape[1]]
        backend = kernel.removeprefix("decomposed_")
        return _decomposed_with_dense_heads(config, call, routed, groups, query_groups, backend)
    allowed = hard_allowed(
        groups[:, :, k_len - q_len :] if query_groups is None else query_groups, groups, config.num_groups,
        config.window, call.base_mask, routed.sinks, routed.dense,
    )
    return _masked(call, allowed)


def _masked(call: AttentionCall, allowed: torch.Tensor) -> torch.Tensor:
    """The dense masked kernel (B, H, Q, D): attention over the pairs `allowed` (broadcastable to (B, K, Q, L), or per
    query head (B, H, Q, L)) only."""
    if call.softcap is not None:
        return dense_attention(call.query, call.key, call.value, allowed, None, call.scaling, call.softcap)
    return sdpa_grouped(call.query, call.key, call.value, allowed, None, call.scaling, call.dropout)


def _decoding_step(
    module: nn.Module, call: AttentionCall, index: GroupIndex, query_groups: torch.Tensor, kernel: str
) -> torch.Tensor:
    """One decoding step (a query token per row) with the cache's group index: (B, H, 1, D), `query_groups`
    (B, H, top_k) those of its query heads. `kernel` "masked_step": under the hard mask over every cached key;
    "sparse_step": through the group lists. The same output."""
    config: FocusConfig = module.focus_config
    query, key = call.query, call.key
    heads, k_heads, k_len = query.shape[1], key.shape[1], key.shape[2]
    dense = dense_heads(module, k_heads, key.device)
    if kernel == "masked_step":
        with label("focus/masked_step"):
            base_mask = None if call.base_mask is None else call.base_mask[:, :, -1:]
            return masked_decode_attention(query, key, call.value, index, query_groups, config.window, base_mask,
                                           call.scaling, dense)
    window_valid = None if call.base_mask is None else call.base_mask[:, 0, -1, max(k_len - config.window, 0) :]
    with label("focus/sparse_step"):
        if config.route_queries == "kv_head":  # the query heads of a key/value head share its groups: read them once
            query_groups = query_groups[:, :: heads // k_heads]
        out = sparse_decode_attention(query, key, call.value, index, query_groups, config.window, window_valid,
                                      call.scaling)
    return _with_dense_heads(out, call, dense)


def _native_decoding_step(
    module: nn.Module, call: AttentionCall, index: GroupIndex, position_ids: torch.Tensor | None
) -> torch.Tensor:
    """`_decoding_step` with its routing and index upkeep as one native call: (B, H, 1, D)."""
    config: FocusConfig = module.focus_config
    query, key = call.query, call.key
    heads, k_heads, k_len = query.shape[1], key.shape[1], key.shape[2]
    index.reserve(k_len)
    panel, bias = native_step_router(module, k_heads, heads if config.route_queries != "key" else 0)
    inv_freq = getattr(module, "focus_inv_freq", None) if config.unrotate else None
    # The new token's position: the last of `position_ids` (`key_positions` of the last key, without its arithmetic).
    position = position_ids[:, -1:] if position_ids is not None else torch.full((1, 1), k_len - 1, device=key.device)
    out = kernels().masked_step(
        query, key, call.value, index.key_groups, index.key_bits, position, inv_freq, panel, bias,
        None if call.base_mask is None else call.base_mask[:, :, -1:], dense_heads(module, k_heads, key.device),
        config.temperature, config.top_k, config.window, config.route_on == "value", ROUTE_QUERIES[config.route_queries],
        call.scaling,
    )
    index.length = k_len
    return out


def _decomposed_with_dense_heads(
    config: FocusConfig, call: AttentionCall, routed: Routed, groups: torch.Tensor, query_groups: torch.Tensor | None,
    backend: str,
) -> torch.Tensor:
    """A whole sequence's hard Focus (B, H, L, D) by the decomposition, on the sparse heads only: the dense key/value
    heads (`FocusConfig.dense_heads`) and their query heads take the model's own attention instead. `backend`: "torch",
    "flash" or "native" (`decomposed_hard_attention`)."""
    dense = routed.dense
    if dense is None:
        return decomposed_hard_attention(call.query, call.key, call.value, groups, config.window, routed.valid,
                                         routed.sinks, call.scaling, backend, query_groups=query_groups)
    r = call.query.shape[1] // call.key.shape[1]
    sparse_kv = (~dense).nonzero().squeeze(1)
    sparse_q = (sparse_kv[:, None] * r + torch.arange(r, device=dense.device)).flatten()
    per_query_head = query_groups is not None and query_groups.shape[1] == call.query.shape[1]
    out = torch.empty_like(call.query)
    if sparse_kv.numel():
        out[:, sparse_q] = decomposed_hard_attention(
            call.query[:, sparse_q], call.key[:, sparse_kv], call.value[:, sparse_kv], groups[:, sparse_kv],
            config.window, routed.valid, routed.sinks, call.scaling, backend,
            query_groups=None if query_groups is None else query_groups[:, sparse_q if per_query_head else sparse_kv],
        )
    return _with_dense_heads(out, call, dense)


def _with_dense_heads(out: torch.Tensor, call: AttentionCall, dense: torch.Tensor | None) -> torch.Tensor:
    """`out` (B, H, Q, D) with the query heads of the dense key/value heads `dense` (K,) replaced by the model's own
    attention (`FocusConfig.dense_heads`)."""
    if dense is None:
        return out
    r = call.query.shape[1] // call.key.shape[1]
    kv = dense.nonzero().squeeze(1)
    heads = (kv[:, None] * r + torch.arange(r, device=kv.device)).flatten()
    own = unmodified_attention(call.query[:, heads], call.key[:, kv], call.value[:, kv], call.base_mask, call.scaling,
                               call.dropout, call.softcap)
    out[:, heads] = own.to(out.dtype)
    return out
