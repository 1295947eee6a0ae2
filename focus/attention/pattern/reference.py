"""The Focus attention pattern, defined densely: the oracle every fast path is tested against, and the dense masked
path that computes whatever no fast path can (gradients, soft mode, soft-capping, short model windows).

A query i may attend to key j when the model allows it (causal, padding, its own sliding window) and
  - local: 0 <= pos(i) - pos(j) < window, at full resolution; or
  - distant: i and j share a group. The first `sink_tokens` real tokens of a sequence belong to
    every group (attention sinks), so every query keeps them. Hard mode keeps exactly those pairs. Soft mode keeps every pair
    the model allows and adds log(sum_g P_ig P_jg) to the logit of each distant pair: the log
    probability that the two tokens land in the same group under the soft assignment P.

Shapes: B batch, H query heads, K key/value heads (H = K * R), Q query tokens, L key tokens,
G groups, D head size. Queries are aligned to the end of the keys (a KV cache holds the past), so
query i sits at position L - Q + i. Query-side routing data comes per key/value head (K: every query head of
a key/value head shares its pattern) or per query head (H: each query head routes its own query vector);
patterns and biases come back with the same head axis.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from focus.attention.pattern.rule import group_membership, kept, within_window


def query_positions(q_len: int, k_len: int, device: torch.device | None = None) -> torch.Tensor:
    """(Q,) positions of the queries among the keys: the last Q of them."""
    return torch.arange(k_len - q_len, k_len, device=device)


def causal_pairs(q_len: int, k_len: int, device: torch.device | None = None) -> torch.Tensor:
    """(Q, L) bool: key j is not after query i."""
    q = query_positions(q_len, k_len, device)
    return torch.arange(k_len, device=device)[None, :] <= q[:, None]


def local_pairs(q_len: int, k_len: int, window: int, device: torch.device | None = None) -> torch.Tensor:
    """(Q, L) bool: 0 <= pos(i) - pos(j) < window (`rule.within_window`)."""
    return within_window(query_positions(q_len, k_len, device)[:, None], torch.arange(k_len, device=device)[None, :],
                         window)


def model_allowed(base_mask: torch.Tensor | None, q_len: int, k_len: int, device=None) -> torch.Tensor:
    """(B or 1, 1, Q, L) bool pairs the unmodified model allows; `None` means plainly causal."""
    if base_mask is None:
        return causal_pairs(q_len, k_len, device)[None, None]
    return base_mask[..., :k_len].bool()


def per_head(dense: torch.Tensor, heads: int) -> torch.Tensor:
    """(K,) per key/value head -> (1, heads, 1, 1) for a head axis of K or H = K * R heads (grouped-query order)."""
    return dense.repeat_interleave(heads // dense.numel())[None, :, None, None]


def split_query_heads(x: torch.Tensor, k_heads: int) -> torch.Tensor:
    """(B, K or H or 1, ...) -> (B, K or 1, R or 1, ...): a query-head axis per key/value head.

    Data per key/value head (or shared by all heads) gets a broadcastable axis of 1; data per query head
    (H = K * R, query heads of one key/value head adjacent, as transformers orders them) is unflattened.
    """
    heads = x.shape[1]
    if heads in (1, k_heads):
        return x[:, :, None]
    return x.unflatten(1, (k_heads, heads // k_heads))


def soft_gate(log_p_q: torch.Tensor, log_p_k: torch.Tensor, floor: float, form: str = "overlap") -> torch.Tensor:
    """The soft gate of distant pairs from the probability that two tokens share a group, o = sum_g P_ig P_jg.

    "overlap": log(o), clamped at log(floor) so the logit stays finite. "neutral": min(0, log(G o)) (the same
    clamp below): no charge for a pair at or above chance agreement (o >= 1 / G).

    Args:
        log_p_q: (B, K or H, Q, G) log-assignments of the query tokens.
        log_p_k: (B, K, L, G) log-assignments of the key tokens.
    Returns:
        (B, K or H, Q, L) float32, the head axis of `log_p_q`.
    """
    same_group = group_overlap(log_p_q, log_p_k).flatten(1, 2)
    if form == "overlap":
        return same_group.clamp_min(floor).log()
    if form == "neutral":
        return (same_group * log_p_k.shape[-1]).clamp_min(floor).log().clamp_max(0.0)
    raise ValueError(f"unknown soft gate {form!r}")


def group_overlap(log_p_q: torch.Tensor, log_p_k: torch.Tensor) -> torch.Tensor:
    """o_ij = sum_g P_ig P_jg, the probability that query i and key j share a group: (B, K, R or 1, Q, L) float32
    from log-assignments (B, K or H or 1, Q, G) and (B, K, L, G), R query heads per key/value head."""
    p_q = split_query_heads(_probabilities(log_p_q), log_p_k.shape[1])  # (B, K, R, Q, G)
    return torch.einsum("bkrqg,bklg->bkrql", p_q, _probabilities(log_p_k))


_NEGLIGIBLE_LOG_P = -30.0
"""Log-probabilities below this count as 0 in `soft_gate`: then every product of two is a normal float (>= e^-60),
never a subnormal one, which x86 CPUs without flush-to-zero compute tens of times slower. The largest term dropped,
e^-30 ~ 1e-13, is far below any gate floor."""


def _probabilities(log_p: torch.Tensor) -> torch.Tensor:
    log_p = log_p.float()
    return torch.where(log_p > _NEGLIGIBLE_LOG_P, log_p.exp(), torch.zeros((), device=log_p.device))


def shared_group(groups_q: torch.Tensor, groups_k: torch.Tensor, num_groups: int) -> torch.Tensor:
    """(B, K or H, Q, top_k), (B, K, L, top_k) group ids -> (B, K or H, Q, L) bool: the tokens share a group."""
    member_q = split_query_heads(group_membership(groups_q, num_groups).float(), groups_k.shape[1])
    member_k = group_membership(groups_k, num_groups).float()
    return (torch.einsum("bkrqg,bklg->bkrql", member_q, member_k) > 0).flatten(1, 2)


def soft_bias(
    log_p_q: torch.Tensor,
    log_p_k: torch.Tensor,
    window: int,
    base_mask: torch.Tensor | None,
    floor: float,
    sinks: torch.Tensor | None = None,
    gate: str = "overlap",
    dense: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Soft Focus as an additive logit bias (`gate`: the form of `soft_gate`).

    Args:
        log_p_q: (B, K or H, Q, G), log_p_k: (B, K, L, G) log-assignments of queries and keys.
        sinks: (B or 1, L) bool keys that belong to every group (see `sink_keys`), or None.
        dense: (K,) bool key/value heads that keep every pair, uncharged, or None.
    Returns:
        bias: (B, K or H, Q, L) float32, 0 on local pairs, sink keys and dense heads, the soft gate on other pairs.
        allowed: (B or 1, 1, Q, L) bool, the pairs the model itself allows.
    """
    q_len, k_len = log_p_q.shape[-2], log_p_k.shape[-2]
    free = local_pairs(q_len, k_len, window, log_p_q.device)
    if sinks is not None:
        free = free | sinks[:, None, None, :]  # a sink shares every group: probability 1
    charge = soft_gate(log_p_q, log_p_k, floor, gate)
    if dense is not None:
        free = free | per_head(dense, charge.shape[1])
    bias = torch.where(free, torch.zeros((), device=charge.device), charge)
    return bias, model_allowed(base_mask, q_len, k_len, log_p_q.device)


def hard_allowed(
    groups_q: torch.Tensor,
    groups_k: torch.Tensor,
    num_groups: int,
    window: int,
    base_mask: torch.Tensor | None,
    sinks: torch.Tensor | None = None,
    dense: torch.Tensor | None = None,
) -> torch.Tensor:
    """Hard Focus: (B, K or H, Q, L) bool pairs kept = model-allowed and (local, sharing a group or a sink key, or in
    a dense head): `rule.kept`, groups compared by membership (any number of groups).

    Args:
        groups_q: (B, K or H, Q, top_k) group ids of the queries; groups_k: (B, K, L, top_k) of the keys.
        dense: (K,) bool key/value heads that keep every pair the model allows, or None.

    A sink query needs no rule of its own: every key it can see (causally) is a sink too.
    """
    q_len, k_len = groups_q.shape[-2], groups_k.shape[-2]
    device = groups_q.device
    allowed = model_allowed(base_mask, q_len, k_len, device)
    sink = None if sinks is None else sinks[:, None, None, :]
    keep = kept(query_positions(q_len, k_len, device)[:, None], torch.arange(k_len, device=device)[None, :], window,
                shared_group(groups_q, groups_k, num_groups), allowed, sink)
    if dense is not None:
        keep = keep | (per_head(dense, keep.shape[1]) & allowed)
    return keep


def dense_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    allowed: torch.Tensor,
    bias: torch.Tensor | None = None,
    scaling: float | None = None,
    softcap: float | None = None,
) -> torch.Tensor:
    """Explicit softmax attention with grouped-query heads: the reference.

    Logits are computed in float32, soft-capped if asked (Gemma 2), biased, masked, then softmaxed.
    A query with no allowed key (a padding row) attends uniformly, as transformers' eager path does,
    so no NaN reaches the rest of the network.

    Args:
        query: (B, H, Q, D); key, value: (B, K, L, D) with H a multiple of K.
        allowed: bool, broadcastable to (B, K, Q, L), or per query head (B, H, Q, L).
        bias: float, shaped as `allowed`, added to allowed logits.
    Returns:
        (B, H, Q, D) in the query's dtype.
    """
    b, h, q_len, d = query.shape
    k_heads, k_len = key.shape[1], key.shape[2]
    r = h // k_heads
    scaling = d**-0.5 if scaling is None else scaling
    q = query.float().view(b, k_heads, r, q_len, d)  # (B, K, R, Q, D)
    logits = torch.einsum("bkrqd,bkld->bkrql", q, key.float()) * scaling
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    if bias is not None:
        logits = logits + split_query_heads(bias.float(), k_heads)
    allowed = split_query_heads(allowed, k_heads).expand(b, k_heads, r, q_len, k_len)
    allowed = allowed | ~allowed.any(dim=-1, keepdim=True)  # padding rows: uniform, not NaN
    logits = logits.masked_fill(~allowed, float("-inf"))
    weights = torch.softmax(logits, dim=-1)
    out = torch.einsum("bkrql,bkld->bkrqd", weights, value.float())
    return out.reshape(b, h, q_len, d).to(query.dtype)


def sdpa_grouped(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    allowed: torch.Tensor,
    bias: torch.Tensor | None,
    scaling: float | None,
    dropout: float = 0.0,
) -> torch.Tensor:
    """SDPA with a per key/value-head mask, without copying keys and values per query head.

    The R query heads that share a key/value head are folded into the query-length axis, so SDPA sees
    K heads of R * Q queries and the mask only needs repeating along that axis.

    Args:
        query: (B, H, Q, D); key, value: (B, K, L, D).
        allowed: bool broadcastable to (B, K, Q, L), or per query head (B, H, Q, L).
        bias: float (B, K or H, Q, L) added where allowed, or None.
    Returns:
        (B, H, Q, D).
    """
    b, h, q_len, d = query.shape
    k_heads, k_len = key.shape[1], key.shape[2]
    r = h // k_heads
    allowed = split_query_heads(allowed, k_heads)  # (B, K, R or 1, Q, L)
    if bias is None:
        mask = allowed | ~allowed.any(dim=-1, keepdim=True)  # padding rows: attend anywhere, not NaN
    else:
        floor = torch.finfo(query.dtype).min
        mask = torch.where(allowed, split_query_heads(bias, k_heads).to(query.dtype), floor)
    mask = mask.expand(b, k_heads, r, q_len, k_len).reshape(b, k_heads, r * q_len, k_len)
    q = query.reshape(b, k_heads, r * q_len, d)  # (B, K, R*Q, D)
    if mask.requires_grad and q.is_cuda:
        # CUDA's memory-efficient kernel cannot return a mask's gradient here ("LSE is not correctly aligned"):
        # the math kernel can.
        with sdpa_kernel(SDPBackend.MATH):
            out = F.scaled_dot_product_attention(q, key, value, attn_mask=mask, dropout_p=dropout, scale=scaling)
    else:
        out = F.scaled_dot_product_attention(q, key, value, attn_mask=mask, dropout_p=dropout, scale=scaling)
    return out.reshape(b, h, q_len, d)  # the CUDA kernels' output is not always contiguous


def unmodified_attention(query, key, value, base_mask, scaling, dropout, softcap) -> torch.Tensor:
    """The unmodified model's attention: (B, H, Q, D)."""
    q_len, k_len = query.shape[-2], key.shape[-2]
    if softcap is not None:
        allowed = causal_pairs(q_len, k_len, query.device)[None, None] if base_mask is None else base_mask
        return dense_attention(query, key, value, allowed, None, scaling, softcap)
    if base_mask is None:
        # sdpa_mask returns None only when the mask is plainly causal with queries aligned to the end.
        return F.scaled_dot_product_attention(
            query, key, value, dropout_p=dropout, scale=scaling, is_causal=q_len > 1, enable_gqa=True
        )
    mask = base_mask | ~base_mask.any(dim=-1, keepdim=True)
    return F.scaled_dot_product_attention(
        query, key, value, attn_mask=mask, dropout_p=dropout, scale=scaling, enable_gqa=True
    )
