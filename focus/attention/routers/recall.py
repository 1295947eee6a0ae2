"""The attention-recall objective: centroids learn which distant pairs the frozen model attends to.

Trained through the soft gate on the next-token loss, the centroids learn a pattern that helps the soft model; it
need not be the one hard top-k inference should keep, and on SmolLM2 it was not (the design study: soft 3% below
pretrained perplexity, hard above it). This objective trains the routing for hard inference directly, in the
manner of SeerAttention's self-distillation of its gates: every layer runs the model's own attention (so each sees
the pretrained inputs, and the output is the pretrained model's), and its routing is scored by how much of that
attention's distant mass it keeps. For query i with distant attention weights a_ij (beyond the window, sinks
excluded) and the soft probability o_ij = sum_g P_ig P_jg that i and key j share a group, the soft recall is

    r_i = sum_j a_ij o_ij / m_i,   m_i = sum_j a_ij,

and the layer's loss is -sum_i m_i log r_i / sum_i m_i: queries that look far weigh most, and a query whose heavy
keys sit outside its groups pays most. The keys stay Sinkhorn-balanced, which fixes what the pattern costs (each
group holds L / G keys); the loss decides which keys share a query's groups.
"""

from __future__ import annotations

import torch
from torch import nn

from focus.attention.pattern.reference import group_overlap, local_pairs, model_allowed

LOSSES_ATTRIBUTE = "focus_recall_losses"
"""A list on each Focus attention module that collects the layer's recall loss of every training call."""
_FLOOR = 1e-6


def recall_loss(
    query: torch.Tensor,
    key: torch.Tensor,
    log_p_q: torch.Tensor,
    log_p_k: torch.Tensor,
    window: int,
    base_mask: torch.Tensor | None,
    sinks: torch.Tensor | None,
    scaling: float | None,
    softcap: float | None,
) -> torch.Tensor:
    """The recall loss of one attention call (scalar, float32; differentiable in the log-assignments only).

    Args:
        query: (B, H, Q, D), key: (B, K, L, D) as the layer attends with them.
        log_p_q: (B, K or H, Q, G), log_p_k: (B, K, L, G) log-assignments of queries and keys.
        sinks: (B or 1, L) bool sink keys, or None.
    """
    b, h, q_len, d = query.shape
    k_heads, k_len = key.shape[1], key.shape[2]
    with torch.no_grad():
        logits = torch.einsum("bkrqd,bkld->bkrql", query.float().unflatten(1, (k_heads, h // k_heads)), key.float())
        logits = logits * (d**-0.5 if scaling is None else scaling)
        if softcap is not None:
            logits = softcap * torch.tanh(logits / softcap)
        allowed = model_allowed(base_mask, q_len, k_len, query.device)[:, :, None]  # (B or 1, 1, 1, Q, L)
        weights = torch.softmax(logits.masked_fill(~allowed, float("-inf")), dim=-1).nan_to_num(0.0)
        distant = allowed & ~local_pairs(q_len, k_len, window, query.device)
        if sinks is not None:
            distant = distant & ~sinks[:, None, None, None, :]
        target = weights * distant  # (B, K, R, Q, L)
        mass = target.sum(dim=-1)  # (B, K, R, Q)
    kept = (target * group_overlap(log_p_q, log_p_k)).sum(dim=-1)  # (B, K, R, Q)
    recall = kept / mass.clamp_min(1e-30)
    return -(mass * recall.clamp_min(_FLOOR).log()).sum() / mass.sum().clamp_min(1e-30)


def collect_recall_loss(model: nn.Module) -> torch.Tensor | None:
    """The mean recall loss over the layers of `model`'s last forward, and clears them; None if none was kept."""
    losses = []
    for module in model.modules():
        kept = getattr(module, LOSSES_ATTRIBUTE, None)
        if kept:
            losses.extend(kept)
            kept.clear()
    return torch.stack(losses).mean() if losses else None
