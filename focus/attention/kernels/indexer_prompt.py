"""The indexer's prompt: its selection and attention a block of queries at a time, exact, without the whole-call mask.

The dense masked kernel computes a selector's call from one (B, H, Q, L) mask of its pairs (`selectors.
selected_pairs`): at 8K that is 600 MB of booleans per layer, every key scored per query head and sorted by `topk`,
and SDPA asked for every pair the causal mask removes (a 4K prompt: 2.2 s a layer here, 19x the unmodified model's).
This computes the same pairs `PROMPT_QUERIES` queries at a time over the keys up to the block's last query: the keys'
codes once, one product for the block's scores (a selection's query code against the codes), the threshold of each
query's top `need` (`thresholds`: a histogram and a partial sort per row in the native row, `topk` in the eager
one), and SDPA over the block's keys with the query heads of a key/value head sharing its mask.

It is not a sparse kernel: it computes every causal pair under a mask, as the unmodified model computes them
unmasked. A per-key selection differs per query, so no block of queries shares the keys it keeps; on a CPU the
unmodified model's attention runs as dense products near the cores' peak, and gathering each query's keys costs more
than the pairs it saves at 1-2K keys per query (docs/routers.md, the prompt). What it buys is the indexer's prompt at
a few times the unmodified model's cost instead of 19x, in bounded memory.
"""

from __future__ import annotations

import math
from typing import Iterator

import torch
import torch.nn.functional as F
from torch import nn

from focus.attention.kernels.call import AttentionCall
from focus.attention.pattern.reference import local_pairs, model_allowed
from focus.attention.routers.indexer import Thresholds, codes_scores, distant_need, key_codes, query_codes, top_scored
from focus.attention.routers.routing import sink_keys

PROMPT_QUERIES = 256
"""Queries per block: the block's mask (K x 256 x L booleans) stays small, and SDPA's products stay large."""


def indexer_prompt_attention(
    module: nn.Module, call: AttentionCall, thresholds: Thresholds, block: int = PROMPT_QUERIES
) -> torch.Tensor:
    """(B, H, Q, D) the dense masked reference's output over the indexer's pairs (`selectors.selected_pairs`),
    `block` queries at a time (`prompt_blocks`). Rows without a pair (padding) attend anywhere, as the reference's
    `sdpa_grouped` has them (not NaN)."""
    query, key, value = call.query, call.key, call.value
    scale = call.scaling if call.scaling is not None else 1 / math.sqrt(query.shape[-1])
    out = torch.empty_like(query)
    for start, stop, end, pairs in prompt_blocks(module, call, thresholds, block):
        if call.base_mask is not None:  # (a causal row always has its own key)
            pairs = pairs | ~pairs.any(dim=-1, keepdim=True)
        out[:, :, start:stop] = _attend(query[:, :, start:stop], key[:, :, :end], value[:, :, :end], pairs, scale,
                                        call.dropout)
    return out


def prompt_blocks(
    module: nn.Module, call: AttentionCall, thresholds: Thresholds, block: int = PROMPT_QUERIES
) -> Iterator[tuple[int, int, int, torch.Tensor]]:
    """The indexer's pairs of a call, `block` queries at a time: (start, stop, end, pairs (B, S, stop - start, end))
    for queries start..stop-1 over keys 0..end-1, S = K (one selection per key/value head) or H: the router's whole
    work. The queries are the last Q of the keys; a model mask that lets a query see a later key is taken over every
    key, the others over the keys up to the block's last query."""
    config = module.focus_config
    query, key, base_mask = call.query, call.key, call.base_mask
    q_len, d, k_len = query.shape[2], query.shape[3], key.shape[2]
    past = k_len - q_len
    valid = None if base_mask is None else base_mask.any(dim=-2)[:, 0]  # (B, L) as the reference reads it
    sinks = sink_keys(valid, k_len, config.sink_tokens, key.device) if config.sink_tokens else None
    codes = key_codes(module, key).float()  # (B, K, L, r): as a cache stores them
    selection_codes = query_codes(module, query)  # (B, S, Q, r)
    for start in range(0, q_len, block):
        stop = min(q_len, start + block)
        end = past + stop
        if base_mask is not None and bool(base_mask[:, :, start:stop, end:k_len].any()):
            end = k_len  # (not a causal mask: every key)
        rows = None if base_mask is None else base_mask[:, :, start:stop, :end]
        allowed = model_allowed(rows, stop - start, end, key.device)  # (B or 1, 1, c, e)
        # the block's rows of the window's pairs: its queries are the last of the keys up to `end`, or, over every
        # key, the first of the queries from `start` on
        free = local_pairs(q_len - start if end == k_len else stop - start, end, config.window, key.device)
        free = free[None, None, : stop - start]
        if sinks is not None:
            free = free | sinks[:, None, None, :end]
        distant = allowed & ~free
        need = distant_need(config, distant.sum(dim=-1, keepdim=True))  # (B or 1, 1, c, 1)
        scores = codes_scores(selection_codes[:, :, start:stop], codes[:, :, :end], d)  # (B, S, c, e)
        yield start, stop, end, (free | top_scored(scores, distant, need, thresholds)) & allowed


def _attend(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, pairs: torch.Tensor, scale: float,
            dropout: float) -> torch.Tensor:
    """(B, H, c, D) SDPA over `pairs` (B, S, c, e), S = K (a key/value head's query heads share its mask: each key/
    value head is a batch of R query heads against one) or H."""
    b, heads, c, d = query.shape
    k_heads, e = key.shape[1], key.shape[2]
    if pairs.shape[1] == k_heads and heads != k_heads:
        r = heads // k_heads
        out = F.scaled_dot_product_attention(
            query.reshape(b * k_heads, r, c, d), key.reshape(b * k_heads, 1, e, d), value.reshape(b * k_heads, 1, e, d),
            attn_mask=pairs.expand(b, k_heads, c, e).reshape(b * k_heads, 1, c, e), dropout_p=dropout, scale=scale,
            enable_gqa=True)
        return out.view(b, heads, c, d)
    return F.scaled_dot_product_attention(query, key, value, attn_mask=pairs.expand(b, -1, c, e), dropout_p=dropout,
                                          scale=scale, enable_gqa=heads != k_heads)
