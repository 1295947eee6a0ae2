"""The centroid router's tensor functions: centroid scores, log-domain Sinkhorn balancing, hard top-k and the k-means
that initialises the centroids. They take tensors only; `focus.attention.routers.routing` routes one attention call
of a Focus layer through them, reading its config, centroids and balance bias off the module.

Shapes use B batch, H query heads, K key/value (routing) heads, Q queries, L tokens, G groups, D vector size.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def routing_logits(vectors: torch.Tensor, centroids: torch.Tensor, temperature: float) -> torch.Tensor:
    """Cosine similarity of every token vector to every centroid of its head, divided by `temperature`.

    Cosine rather than a dot product because key norms vary a lot between tokens and layers; routing
    should depend on direction, as in spherical k-means which initialises the centroids.

    Args:
        vectors: (B, H, L, D) per-head token vectors (keys or values).
        centroids: (H, G, D) or (1, G, D) when shared by all heads.
    Returns:
        (B, H, L, G) float32 logits.
    """
    x = F.normalize(vectors.float(), dim=-1)
    c = F.normalize(centroids.float(), dim=-1)
    return torch.einsum("bhld,hgd->bhlg", x, c) / temperature


def undo_rotary(vectors: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """Vectors as they were before the rotary position embedding (transformers' rotate-half layout).

    The embedding turns each pair (x_m, x_{m + D/2}) by the angle position * inv_freq[m]; turning it back by the
    same angle is exact, so routing on the result depends on what a token says, not where it stands.

    Args:
        vectors: (B, H, L, D) rotary-embedded vectors.
        positions: (B or 1, L) the position each token was embedded at.
        inv_freq: (D / 2,) the rotary frequencies of the layer.
    Returns:
        (B, H, L, D) float32.
    """
    cos, sin = rotary_tables(positions, inv_freq, vectors.device)
    x = vectors.float()
    first, second = x.chunk(2, dim=-1)
    return x * cos - torch.cat([-second, first], dim=-1) * sin


_STEP_TABLES: dict = {}
"""cos/sin of a decoding step's angles, by (frequencies, device, positions): every layer of a step routes at the same
positions with the same frequencies, so the step computes them once instead of once per layer."""


def rotary_tables(positions: torch.Tensor, inv_freq: torch.Tensor, device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin (B, 1, L, D) of the rotary angles at `positions` (B or 1, L)."""
    key = None
    if positions.numel() <= 8:  # a decoding step: remembered (a handful of entries)
        # Keyed by the values themselves: a freed buffer's address can come back holding other frequencies.
        key = (str(device), tuple(inv_freq.tolist()), tuple(positions.shape), *positions.flatten().tolist())
        found = _STEP_TABLES.get(key)
        if found is not None:
            return found
    angles = positions[..., None].float() * inv_freq.float().to(device)  # (B, L, D/2)
    angles = torch.cat([angles, angles], dim=-1)[:, None]  # (B, 1, L, D)
    tables = angles.cos(), angles.sin()
    if key is not None:
        if len(_STEP_TABLES) >= 64:
            _STEP_TABLES.clear()
        _STEP_TABLES[key] = tables
    return tables


def sinkhorn(logits: torch.Tensor, iters: int, valid: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Balance soft assignments of tokens to groups over each sequence (log-domain Sinkhorn).

    Alternately rescale groups so each holds an equal share (n / G) of the token mass and rescale
    tokens so each token's mass is 1. It ends on the token step: rows are exact, columns are balanced
    to the tolerance the iterations reach.

    Balancing looks at the whole sequence, so it is used only while training the centroids (as in
    the paper); inference routes causally with the running mean of the group potentials returned
    here (see `inference_log_assign`).

    Args:
        logits: (..., L, G) routing logits.
        iters: Sinkhorn iterations; 0 gives a plain softmax over groups.
        valid: (..., L) bool, False for padding tokens, which then count in no group's mass (their own
            rows come back uniform).
    Returns:
        log_p: (..., L, G) float32 log-assignments, rows summing to 1.
        group_potential: (..., G) float32 log-scaling applied to each group, centred to mean zero.
    """
    # Beyond |1e4| a softmax is already one-hot; larger values would only lose the small terms
    # (log 2 of a tie, the row normaliser) to float32 rounding.
    s = logits.float().clamp(-1e4, 1e4)
    num_groups = s.shape[-1]
    if valid is not None:
        s = s.masked_fill(~valid[..., None], 0.0)
        count = valid.to(s.dtype).sum(dim=-1)[..., None, None]  # (..., 1, 1) real tokens
    else:
        count = torch.full_like(s[..., :1, :1], s.shape[-2])
    row = -torch.logsumexp(s, dim=-1, keepdim=True)  # (..., L, 1)
    col = torch.zeros_like(s[..., :1, :])  # (..., 1, G)
    for _ in range(iters):
        mass = s + row
        if valid is not None:
            mass = mass.masked_fill(~valid[..., None], float("-inf"))
        col = torch.log(count / num_groups) - torch.logsumexp(mass, dim=-2, keepdim=True)
        # A sequence made only of padding has no mass to balance: leave its groups unscaled.
        col = torch.nan_to_num(col, nan=0.0, posinf=0.0, neginf=0.0)
        row = -torch.logsumexp(s + col, dim=-1, keepdim=True)
    log_p = s + col + row
    if valid is not None:
        log_p = log_p.masked_fill(~valid[..., None], -math.log(num_groups))
    potential = col.squeeze(-2)
    return log_p, potential - potential.mean(dim=-1, keepdim=True)


def inference_log_assign(logits: torch.Tensor, group_bias: torch.Tensor) -> torch.Tensor:
    """Causal routing: each token's own softmax over groups, shifted by the learnt balance bias.

    Args:
        logits: (B, H, L, G) routing logits.
        group_bias: (H, G) or (1, G) running mean of the Sinkhorn group potentials seen in training.
    Returns:
        (B, H, L, G) float32 log-assignments.
    """
    return torch.log_softmax(logits.float() + group_bias.float()[:, None, :], dim=-1)


def top_k_groups(log_assign: torch.Tensor, top_k: int) -> torch.Tensor:
    """(..., L, G) log-assignments -> (..., L, top_k) int64 group ids, best first."""
    return log_assign.topk(top_k, dim=-1).indices



def spherical_kmeans(
    points: torch.Tensor, num_clusters: int, iters: int = 20, seed: int = 0
) -> torch.Tensor:
    """Cluster unit-normalised points by cosine similarity; returns (num_clusters, D) unit centroids.

    k-means++ seeding (deterministic given `seed`) then Lloyd iterations. A cluster that empties keeps
    its previous centroid. Fewer points than clusters repeats points (then some centroids coincide).

    Args:
        points: (N, D) vectors; normalised here.
    """
    x = F.normalize(points.float(), dim=-1)
    n = x.shape[0]
    if n == 0:
        raise ValueError("spherical_kmeans needs at least one point")
    gen = torch.Generator().manual_seed(seed)
    first = torch.randint(n, (1,), generator=gen)
    centroids = [x[first[0]]]
    closest = 1 - x @ centroids[0]  # cosine distance to the nearest chosen centroid
    for _ in range(1, num_clusters):
        weights = closest.clamp_min(0)
        if weights.sum() <= 0:
            idx = torch.randint(n, (1,), generator=gen)[0]
        else:
            idx = torch.multinomial(weights, 1, generator=gen)[0]
        centroids.append(x[idx])
        closest = torch.minimum(closest, 1 - x @ x[idx])
    c = torch.stack(centroids)
    for _ in range(iters):
        assign = (x @ c.T).argmax(dim=-1)
        sums = torch.zeros_like(c).index_add_(0, assign, x)
        counts = torch.bincount(assign, minlength=num_clusters)
        c = torch.where(counts[:, None] > 0, F.normalize(sums, dim=-1), c)
    return c
