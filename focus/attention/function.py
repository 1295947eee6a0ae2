"""The attention function transformers calls for a Focus model, registered under the name "focus".

transformers hands it the layer module, the projected (and rotary-embedded) heads and the mask its
registered mask function built; everything Focus needs (config, centroids, balance bias) sits on the
module, put there by `apply_focus`. Routing is `focus.attention.routing`'s; this module chooses the path
that computes the pattern (unmodified, soft, hard: dense masked, decomposed, or a decoding step), and where a query
attends as the unmodified model does instead (`FocusConfig.dense_below`, `_dense_rows`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from focus.attention.decoding import (
    GroupIndex,
    index_new_keys,
    masked_decode_attention,
    sparse_decode_attention,
    take_cache_index,
)
from focus.attention.decomposed import decomposed_hard_attention
from focus.attention.fast_path import current_fast_path
from focus.attention.labels import label
from focus.attention.native import ROUTE_QUERIES, kernels
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
    step_groups,
    top_k_groups,
)
from focus.attention.step_cost import NATIVE_STEP_BELOW, sparse_step_pays
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

    def fast_path_applies(self) -> bool:
        """Whether a fast path (decomposition, sparse decoding step) can compute this call: one is switched on
        (`focus.attention.fast_path`), no gradient, and a model mask that is only causal plus padding (no
        soft-capping, no model window shorter than the keys)."""
        return (
            current_fast_path() != "dense"
            and self.softcap is None
            and self.dropout == 0.0
            and (self.sliding_window is None or self.sliding_window >= self.key.shape[-2])
            and not (torch.is_grad_enabled() and (self.query.requires_grad or self.key.requires_grad))
        )

    def decomposable(self) -> bool:
        """Whether the decomposition computes this call: a whole sequence (no cached past) on a fast path."""
        return self.query.shape[-2] == self.key.shape[-2] and self.fast_path_applies()


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
    """`focus_attention`'s output, (B, H, Q, D)."""
    config: FocusConfig = module.focus_config
    q_len, k_len = query.shape[-2], key.shape[-2]
    base_mask = None if attention_mask is None else attention_mask[..., :k_len]
    call = AttentionCall(query, key, value, base_mask, scaling, dropout, softcap, kwargs.get("sliding_window"))
    trace = getattr(module, TRACE_ATTRIBUTE, None)
    index = take_cache_index(module)  # a FocusCache's group index of this layer's cached keys, or None
    dense_rows = _dense_rows(module, q_len, k_len)  # the first queries, below `dense_below`: the model's attention
    all_dense = dense_rows == q_len
    if index is not None:
        past = k_len - q_len
        step = (q_len == 1 and config.mode == "hard" and trace is None and config.window < k_len
                and call.fast_path_applies())
        if step and not all_dense and _native_step_applies(config, index, past, query):
            with label("focus/native_step"):
                return _native_decoding_step(module, call, index, kwargs.get("position_ids"))
        arrived = (key if config.route_on == "key" else value)[:, :, past:]
        arrived_positions = key_positions(kwargs.get("position_ids"), k_len, key.device, first=past)
        valid = None if base_mask is None else base_mask.any(dim=-2)[:, 0, past:]
        native_prompt = not (step or all_dense) and trace is None and _native_prompt_applies(config, call, index)
        with label("focus/index_new_keys"):  # labels for torch.profiler (benchmarks/profile_focus.py)
            if step:  # the new key and the query heads routed in one pass
                key_groups, query_groups = step_groups(module, query, arrived, arrived_positions)
            elif native_prompt:  # keys and queries routed natively, the queries kept for the prompt's attention
                key_groups, routed = route_prompt_natively(module, query, arrived, base_mask, arrived_positions)
            else:
                key_groups = cache_key_groups(module, routing_vectors(module, arrived, arrived_positions))
            index_new_keys(index, key_groups, past, valid)
        if step and not all_dense:
            return _decoding_step(module, call, index, query_groups)
        if native_prompt:
            with label("focus/hard_attention"):
                return _with_dense_rows(_hard_attention(config, call, routed, index), call, dense_rows)
    if all_dense and trace is None:  # (a cache has indexed its keys all the same, for the queries Focus will take)
        return call.unmodified()
    positions = key_positions(kwargs.get("position_ids"), k_len, key.device)
    if config.window >= k_len and trace is None:
        return call.unmodified()  # every pair the model allows is local: Focus is the model's own attention
    key_vectors = routing_vectors(module, key if config.route_on == "key" else value, positions)
    if trace is not None:
        trace.append(layer_routing_logits(module, key_vectors))
    if config.window >= k_len:
        return call.unmodified()

    with label("focus/route"):
        routed = route_call(module, query, key_vectors, base_mask, positions)
    if config.objective == "attention_recall" and centroids_training(module):
        # Training for recall: the layer attends as the pretrained model does, and scores its routing against that.
        loss = recall_loss(query, key, routed.query_log_assign, routed.key_log_assign, config.window, base_mask,
                           routed.sinks, scaling, softcap)
        kept = module.__dict__.setdefault(LOSSES_ATTRIBUTE, [])
        if kept:  # a training step that never takes the loss would optimise nothing, silently
            raise RuntimeError("the attention-recall loss of the previous forward pass was never collected: train with "
                               "objective=focus.train.objective.focus_objective(model)")
        kept.append(loss)
        return call.unmodified()
    if config.objective == "straight_through" and centroids_training(module):
        # The hard model's forward pass, the soft gate's gradient: out = soft + (hard - soft), the difference detached.
        soft = _soft_attention(config, call, routed)
        with torch.no_grad():
            hard = _hard_attention(config, call, routed)
        return soft + (hard - soft).detach()
    if config.mode == "soft":
        return _with_dense_rows(_soft_attention(config, call, routed), call, dense_rows)
    with label("focus/hard_attention"):
        return _with_dense_rows(_hard_attention(config, call, routed, index), call, dense_rows)


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
    config: FocusConfig, call: AttentionCall, routed: Routed, index: GroupIndex | None = None
) -> torch.Tensor:
    """Hard Focus (B, H, Q, D): the window, the sinks and the keys of the query's top-k groups."""
    q_len, k_len = call.query.shape[-2], call.key.shape[-2]
    # A FocusCache's index holds every cached key's groups, assigned once: the whole generation sees one.
    groups = top_k_groups(routed.key_log_assign, config.top_k) if index is None else index.groups(k_len).clamp_min(0)
    query_groups = routed.query_groups
    if query_groups is None and config.route_queries != "key":
        query_groups = top_k_groups(routed.query_log_assign, config.top_k)
    if call.decomposable():
        if config.route_queries == "kv_head" and query_groups.shape[1] == call.query.shape[1]:
            # The query heads of a key/value head share its groups: one copy (native routing gives one already).
            query_groups = query_groups[:, :: call.query.shape[1] // call.key.shape[1]]
        # A FocusCache that runs native steps runs the prefill's band and rectangles natively too
        # (`focus.attention.native.native_routed_prefill`).
        native = index is not None and index.native and call.query.device.type == "cpu"
        return _decomposed_with_dense_heads(config, call, routed, groups, query_groups, native)
    allowed = hard_allowed(
        groups[:, :, k_len - q_len :] if query_groups is None else query_groups, groups, config.num_groups,
        config.window, call.base_mask, routed.sinks, routed.dense,
    )
    if call.softcap is not None:
        return dense_attention(call.query, call.key, call.value, allowed, None, call.scaling, call.softcap)
    return sdpa_grouped(call.query, call.key, call.value, allowed, None, call.scaling, call.dropout)


def _decoding_step(
    module: nn.Module, call: AttentionCall, index: GroupIndex, query_groups: torch.Tensor
) -> torch.Tensor:
    """One decoding step (a query token per row) with the cache's group index: (B, H, 1, D), `query_groups`
    (B, H, top_k) those of its query heads. Under the hard mask over every cached key, or through the group lists
    where that pays (`sparse_step_pays`): the same output."""
    config: FocusConfig = module.focus_config
    query, key = call.query, call.key
    heads, k_heads, k_len = query.shape[1], key.shape[1], key.shape[2]
    dense = dense_heads(module, k_heads, key.device)
    routing_heads = k_heads if config.route_queries == "kv_head" else heads
    if index.key_bits is not None and not sparse_step_pays(config.num_groups, config.top_k, routing_heads, k_heads,
                                                           k_len):
        with label("focus/masked_step"):
            base_mask = None if call.base_mask is None else call.base_mask[:, :, -1:]
            return masked_decode_attention(query, key, call.value, index, query_groups, config.window, base_mask,
                                           call.scaling, dense)
    window_valid = None if call.base_mask is None else call.base_mask[:, 0, -1, max(k_len - config.window, 0) :]
    with label("focus/sparse_step"):
        if routing_heads != heads:  # the query heads of a key/value head share its groups: read them once
            query_groups = query_groups[:, :: heads // k_heads]
        out = sparse_decode_attention(query, key, call.value, index, query_groups, config.window, window_valid,
                                      call.scaling)
    return _with_dense_heads(out, call, dense)


def _native_step_applies(config: FocusConfig, index: GroupIndex, past: int, query: torch.Tensor) -> bool:
    """Whether this decoding step runs as one native call (`focus.attention.native`): its cache asked for it,
    the step runs on the CPU, below `NATIVE_STEP_BELOW` keys or where the sparse step would not pay anyway, and the
    index needs nothing but the new key (no cropped cache to rebuild, every row's sink tokens already seen)."""
    if not (index.native and query.device.type == "cpu" and index.key_bits is not None and index.length == past
            and index.sinks_found):
        return False
    k_heads = index.key_bits.shape[1]
    routing_heads = k_heads if config.route_queries == "kv_head" else query.shape[1]
    return past + 1 < NATIVE_STEP_BELOW or not sparse_step_pays(config.num_groups, config.top_k, routing_heads,
                                                                k_heads, past + 1)


def _native_prompt_applies(config: FocusConfig, call: AttentionCall, index: GroupIndex) -> bool:
    """Whether a prompt routes natively (`route_prompt_natively`): its cache runs native steps on the CPU, and the whole
    prompt goes through the query-routed decomposition in hard mode (which then runs natively too)."""
    return (index.native and call.query.device.type == "cpu" and config.mode == "hard"
            and config.route_queries != "key" and config.window < call.key.shape[-2] and call.decomposable())


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
    native: bool = False,
) -> torch.Tensor:
    """A whole sequence's hard Focus (B, H, L, D) by the decomposition, on the sparse heads only: the dense key/value
    heads (`FocusConfig.dense_heads`) and their query heads take the model's own attention instead."""
    dense = routed.dense
    if dense is None:
        return decomposed_hard_attention(call.query, call.key, call.value, groups, config.window, routed.valid,
                                         routed.sinks, call.scaling, query_groups=query_groups, native=native)
    r = call.query.shape[1] // call.key.shape[1]
    sparse_kv = (~dense).nonzero().squeeze(1)
    sparse_q = (sparse_kv[:, None] * r + torch.arange(r, device=dense.device)).flatten()
    per_query_head = query_groups is not None and query_groups.shape[1] == call.query.shape[1]
    out = torch.empty_like(call.query)
    if sparse_kv.numel():
        out[:, sparse_q] = decomposed_hard_attention(
            call.query[:, sparse_q], call.key[:, sparse_kv], call.value[:, sparse_kv], groups[:, sparse_kv],
            config.window, routed.valid, routed.sinks, call.scaling,
            query_groups=None if query_groups is None else query_groups[:, sparse_q if per_query_head else sparse_kv],
            native=native,
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
