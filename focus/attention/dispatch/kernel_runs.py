"""The kernels of hard Focus as the plan's rows run them: each `run_*(state, call)` computes one call from its
tensors (`AttentionCall`) and what the router made of them (`CallState`), nothing read from the module but the layer's
weights. `focus.attention.dispatch.kernel_table` pairs each with the row that says when it runs; every one computes the
dense masked reference's output over the pairs the router keeps."""

from __future__ import annotations

import torch
from torch import nn

from focus.attention.cache.decoding import masked_decode_attention, sparse_decode_attention
from focus.attention.cache.group_index import GroupIndex
from focus.attention.kernels.call import AttentionCall, CallState
from focus.attention.kernels.decomposed import decomposed_hard_attention
from focus.attention.kernels.indexer_prompt import indexer_prompt_attention
from focus.attention.labels import label
from focus.attention.native import ROUTE_QUERIES, kernels
from focus.attention.pattern.reference import dense_attention, hard_allowed, sdpa_grouped, unmodified_attention
from focus.attention.routers.centroids import top_k_groups
from focus.attention.routers.indexer import QUERY_WEIGHTS, indexer_decode_attention, topk_thresholds
from focus.attention.routers.routing import Routed, dense_heads, native_step_router
from focus.config import FocusConfig


def run_indexer_step(state: CallState, call: AttentionCall) -> torch.Tensor:
    with label("focus/indexer_step"):
        return indexer_decode_attention(state.module, call.query, call.key, call.value, state.index.codes,
                                        call.base_mask, call.scaling)


def run_indexer_native_step(state: CallState, call: AttentionCall) -> torch.Tensor:
    """The indexer's step as one native call (`focus/attention/native/csrc/indexer_step.cpp`): scores from the cached
    codes, the top keys by a histogram and a partial sort, the kept keys attended in place."""
    config = state.config
    with label("focus/indexer_native_step"):
        return kernels().indexer_step(
            call.query, call.key, call.value, state.index.codes, getattr(state.module, QUERY_WEIGHTS).detach(),
            None if call.base_mask is None else call.base_mask[:, :, -1:], config.window, config.sink_tokens,
            config.budget, config.budget_keys or 0, config.route_queries == "kv_head", call.scaling,
        )


def run_indexer_prompt(state: CallState, call: AttentionCall) -> torch.Tensor:
    with label("focus/indexer_prompt"):
        return indexer_prompt_attention(state.module, call, topk_thresholds)


def run_indexer_native_prompt(state: CallState, call: AttentionCall) -> torch.Tensor:
    """The indexer's prompt, each row's threshold by the native histogram
    (`focus/attention/native/csrc/indexer_step.cpp`)."""
    with label("focus/indexer_native_prompt"):
        return indexer_prompt_attention(state.module, call, kernels().indexer_thresholds)


def run_native_step(state: CallState, call: AttentionCall) -> torch.Tensor:
    with label("focus/native_step"):
        return native_decoding_step(state.module, call, state.index, state.position_ids)


def run_masked_step(state: CallState, call: AttentionCall) -> torch.Tensor:
    return decoding_step(state.module, call, state.index, state.step_groups, "masked_step")


def run_sparse_step(state: CallState, call: AttentionCall) -> torch.Tensor:
    return decoding_step(state.module, call, state.index, state.step_groups, "sparse_step")


def run_decomposed_native_amx(state: CallState, call: AttentionCall) -> torch.Tensor:
    return hard_attention(state.config, call, state.routed, "decomposed_native", state.index, matrix_units=True)


def run_decomposed_native(state: CallState, call: AttentionCall) -> torch.Tensor:
    """The native prefill on the CPU's vector units (its bfloat16 rectangles too: the row above takes AMX's)."""
    return hard_attention(state.config, call, state.routed, "decomposed_native", state.index, matrix_units=False)


def run_decomposed_flash(state: CallState, call: AttentionCall) -> torch.Tensor:
    return hard_attention(state.config, call, state.routed, "decomposed_flash", state.index)


def run_decomposed_torch(state: CallState, call: AttentionCall) -> torch.Tensor:
    return hard_attention(state.config, call, state.routed, "decomposed_torch", state.index)


def run_dense_masked(state: CallState, call: AttentionCall) -> torch.Tensor:
    """A selector's pairs (`state.selected`), or the groups' (`state.routed`), under one mask."""
    if state.selected is not None:
        return masked(call, state.selected)
    return hard_attention(state.config, call, state.routed, "dense_masked", state.index)


def hard_attention(
    config: FocusConfig, call: AttentionCall, routed: Routed, kernel: str, index: GroupIndex | None = None,
    matrix_units: bool = False,
) -> torch.Tensor:
    """Hard Focus (B, H, Q, D) by the plan's `kernel`: the window, the sinks, the keys of the query's top-k groups
    (`matrix_units`: the native prefill's bfloat16 rectangles on AMX)."""
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
        return decomposed_with_dense_heads(config, call, routed, groups, query_groups, backend, matrix_units)
    allowed = hard_allowed(
        groups[:, :, k_len - q_len :] if query_groups is None else query_groups, groups, config.num_groups,
        config.window, call.base_mask, routed.sinks, routed.dense,
    )
    return masked(call, allowed)


def masked(call: AttentionCall, allowed: torch.Tensor) -> torch.Tensor:
    """The dense masked kernel (B, H, Q, D): attention over the pairs `allowed` (broadcastable to (B, K, Q, L), or per
    query head (B, H, Q, L)) only."""
    if call.softcap is not None:
        return dense_attention(call.query, call.key, call.value, allowed, None, call.scaling, call.softcap)
    return sdpa_grouped(call.query, call.key, call.value, allowed, None, call.scaling, call.dropout)


def decoding_step(
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
    return with_dense_heads(out, call, dense)


def native_decoding_step(
    module: nn.Module, call: AttentionCall, index: GroupIndex, position_ids: torch.Tensor | None
) -> torch.Tensor:
    """`decoding_step` with its routing and index upkeep as one native call: (B, H, 1, D)."""
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
        config.temperature, config.top_k, config.window, config.route_on == "value",
        ROUTE_QUERIES[config.route_queries], call.scaling,
    )
    index.length = k_len
    return out


def decomposed_with_dense_heads(
    config: FocusConfig, call: AttentionCall, routed: Routed, groups: torch.Tensor, query_groups: torch.Tensor | None,
    backend: str, matrix_units: bool = False,
) -> torch.Tensor:
    """A whole sequence's hard Focus (B, H, L, D) by the decomposition, on the sparse heads only: the dense key/value
    heads (`FocusConfig.dense_heads`) and their query heads take the model's own attention instead. `backend`: "torch",
    "flash" or "native" (`decomposed_hard_attention`)."""
    dense = routed.dense
    if dense is None:
        return decomposed_hard_attention(call.query, call.key, call.value, groups, config.window, routed.valid,
                                         routed.sinks, call.scaling, backend, query_groups=query_groups,
                                         matrix_units=matrix_units)
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
            matrix_units=matrix_units,
        )
    return with_dense_heads(out, call, dense)


def with_dense_heads(out: torch.Tensor, call: AttentionCall, dense: torch.Tensor | None) -> torch.Tensor:
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
