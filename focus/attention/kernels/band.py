"""The decomposition's local part (`focus.attention.kernels.decomposed`): the pairs within the window, a band of width
`window` computed blockwise under an explicit mask. Thin, so its mask is cheap, while the big group part stays
mask-free.

`local_part` takes the pairs within the window that share no group (the group part takes those that do); `band_part`
takes every pair within the window, for the query-routed (rectangle) form, whose rectangles take only pairs at least
`window` apart.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from focus.attention.kernels.segments import masked_with_lse
from focus.attention.pattern.rule import GROUP_BITS, group_bits, groups_meet, within_window


def local_part(q, key, value, groups_q, groups, window, valid, sinks, scaling, block, blocks_per_call: int = 32):
    """Pairs with 0 <= i - j < window that share no group (the query's `groups_q`, the key's `groups`), j not a sink:
    outputs (B, K, R, L, D) fp32 and log-sum-exp (B, K, R, L) (-inf where a query has no such pair).

    Queries go in blocks of `block`; each block sees the `block + window - 1` keys it can reach, with the band
    and group exclusions as an additive mask (cheap: the band is thin). Many blocks share one fused kernel call
    as a batch, so Python overhead stays per `blocks_per_call` blocks.
    """
    b, k_heads, r, length, d = q.shape
    pad, n_blocks = window - 1, -(-length // block)
    span, tail = block + pad, n_blocks * block - length
    q_pad = F.pad(q, (0, 0, 0, tail))  # (B, K, R, n*block, D)
    q_blocks = q_pad.view(b, k_heads, r, n_blocks, block, d).permute(0, 1, 3, 2, 4, 5)  # (B, K, n, R, block, D)
    # Keys padded in front by window - 1 so block i's keys are the plain slice [i*block, i*block + span).
    k_blocks = F.pad(key, (0, 0, pad, tail)).unfold(2, span, block).transpose(-1, -2)  # (B, K, n, span, D)
    v_blocks = F.pad(value, (0, 0, pad, tail)).unfold(2, span, block).transpose(-1, -2)
    g_keys = F.pad(groups, (0, 0, pad, tail), value=-1).unfold(2, span, block).transpose(-1, -2)  # (B,K,n,span,k)
    g_queries = F.pad(groups_q, (0, 0, 0, tail), value=-2).view(b, k_heads, n_blocks, block, -1)
    keyable = F.pad(valid & ~sinks, (pad, tail), value=False).unfold(1, span, block)  # (B, n, span)
    members_q = members_k = None
    if groups.shape[-1] > 1 and max(int(groups.max()), int(groups_q.max())) < GROUP_BITS:
        bits = group_bits(groups.clamp_min(0))  # (B, K, L) int64: bit g set for each group g of the token
        bits_q = bits if groups_q is groups else group_bits(groups_q.clamp_min(0))
        members_q = F.pad(bits_q, (0, tail)).view(b, k_heads, n_blocks, block)
        members_k = F.pad(bits, (pad, tail)).unfold(2, span, block)  # (B, K, n, span); padding: no bits
    band = within_window(torch.arange(block, device=q.device)[:, None] + pad,  # (block, span): i - j in [0, window)
                         torch.arange(span, device=q.device)[None, :], window)

    kernel = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    out = torch.empty(b, k_heads, n_blocks, r, block, d, dtype=torch.float32, device=q.device)
    lse = torch.empty(b, k_heads, n_blocks, r, block, dtype=torch.float32, device=q.device)
    for first in range(0, n_blocks, blocks_per_call):
        part = slice(first, min(first + blocks_per_call, n_blocks))
        n = part.stop - part.start
        if members_q is not None:  # top-k > 1: one AND of group bitmasks per pair
            shared = groups_meet(members_q[:, :, part, :, None], members_k[:, :, part, None, :])
        elif groups.shape[-1] == 1:
            shared = g_queries[:, :, part, :, None, 0] == g_keys[:, :, part, None, :, 0]
        else:  # group ids from GROUP_BITS on: compare every (query group, key group) pair
            shared = (g_queries[:, :, part, :, None, :, None] == g_keys[:, :, part, None, :, None, :]).flatten(-2)
            shared = shared.any(-1)
        allowed = band & ~shared & keyable[:, None, part, None, :]  # (B, K, n, block, span)
        mask = torch.zeros(allowed.shape, dtype=q.dtype, device=q.device).masked_fill_(~allowed, float("-inf"))
        rows = b * k_heads * n
        q_part = q_blocks[:, :, part].reshape(rows, r, block, d)
        k_part = k_blocks[:, :, part].reshape(rows, 1, span, d).expand(rows, r, span, d)
        v_part = v_blocks[:, :, part].reshape(rows, 1, span, d).expand(rows, r, span, d)
        if q.device.type == "cpu":
            blk_out, blk_lse = kernel(q_part, k_part, v_part, 0.0, False, attn_mask=mask.view(rows, 1, block, span),
                                      scale=scaling)
        else:
            blk_out, blk_lse = masked_with_lse(q_part, k_part, v_part, mask.view(rows, 1, block, span), scaling)
        # The kernel returns LSE 0 and output 0 for a row with no allowed key: mark those rows empty.
        empty = ~allowed.any(dim=-1).view(rows, 1, block)
        out[:, :, part] = blk_out.float().view(b, k_heads, n, r, block, d)
        lse[:, :, part] = blk_lse.float().masked_fill(empty, float("-inf")).view(b, k_heads, n, r, block)
    out = out.permute(0, 1, 3, 2, 4, 5).reshape(b, k_heads, r, n_blocks * block, d)[:, :, :, :length]
    lse = lse.permute(0, 1, 3, 2, 4).reshape(b, k_heads, r, n_blocks * block)[:, :, :, :length]
    return out, lse


def band_part(query, key, value, window: int, valid, block: int, scaling: float, blocks_per_call: int = 32):
    """Every pair with 0 <= i - j < window (j a real token): outputs (B, H, L, D) fp32 and log-sum-exp (B, H, L).

    The band of the rectangle form: no group test (the rectangles take only pairs at least `window` apart), so one
    (block, span) mask serves every head, and the query heads of a key/value head share its keys. Queries go in blocks
    of `block`; a block sees the `block + window - 1` keys it can reach.
    """
    b, h, length, d = query.shape
    k_heads = key.shape[1]
    r = h // k_heads
    pad, n_blocks = window - 1, -(-length // block)
    span, tail = block + pad, n_blocks * block - length
    q_blocks = F.pad(query, (0, 0, 0, tail)).view(b, h, n_blocks, block, d).transpose(1, 2)  # (B, n, H, block, D)
    k_blocks = F.pad(key, (0, 0, pad, tail)).unfold(2, span, block).permute(0, 2, 1, 4, 3)  # (B, n, K, span, D)
    v_blocks = F.pad(value, (0, 0, pad, tail)).unfold(2, span, block).permute(0, 2, 1, 4, 3)
    keyable = F.pad(valid, (pad, tail), value=False).unfold(1, span, block)  # (B, n, span)
    distance = torch.arange(block, device=query.device)[:, None] + pad - torch.arange(span, device=query.device)
    band = (distance >= 0) & (distance < window)  # (block, span)
    kernel = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    out = torch.empty(b, n_blocks, h, block, d, dtype=torch.float32, device=query.device)
    lse = torch.empty(b, n_blocks, h, block, dtype=torch.float32, device=query.device)
    for first in range(0, n_blocks, blocks_per_call):
        part = slice(first, min(first + blocks_per_call, n_blocks))
        rows = b * (part.stop - part.start)
        allowed = band & keyable[:, part, None, :]  # (B, n, block, span)
        mask = torch.zeros(allowed.shape, dtype=query.dtype, device=query.device).masked_fill_(~allowed, float("-inf"))
        q_part = q_blocks[:, part].reshape(rows, h, block, d)
        k_part = k_blocks[:, part, :, None].expand(-1, -1, -1, r, -1, -1).reshape(rows, h, span, d)
        v_part = v_blocks[:, part, :, None].expand(-1, -1, -1, r, -1, -1).reshape(rows, h, span, d)
        mask = mask.view(rows, 1, block, span)
        if query.device.type == "cpu":
            blk_out, blk_lse = kernel(q_part, k_part, v_part, 0.0, False, attn_mask=mask, scale=scaling)
        else:
            blk_out, blk_lse = masked_with_lse(q_part, k_part, v_part, mask, scaling)
        empty = ~allowed.any(dim=-1).view(rows, 1, block)
        out[:, part] = blk_out.float().view(b, -1, h, block, d)
        lse[:, part] = blk_lse.float().masked_fill(empty, float("-inf")).view(b, -1, h, block)
    out = out.transpose(1, 2).reshape(b, h, n_blocks * block, d)[:, :, :length]
    lse = lse.transpose(1, 2).reshape(b, h, n_blocks * block)[:, :, :length]
    return out, lse
