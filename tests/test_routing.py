import math

import pytest
import torch

from focus.attention.pattern.rule import group_membership
from focus.attention.routers.centroids import (
    inference_log_assign,
    routing_logits,
    sinkhorn,
    spherical_kmeans,
    top_k_groups,
)


def skewed_logits(*shape, seed=0):
    gen = torch.Generator().manual_seed(seed)
    # A strong per-group preference: without balancing some groups take most tokens.
    return torch.randn(*shape, generator=gen) * 3 + torch.randn(shape[-1], generator=gen) * 2


def test_sinkhorn_balances_group_mass():
    logits = skewed_logits(2, 3, 256, 16)
    unbalanced = logits.softmax(-1).sum(-2) / (256 / 16)
    assert unbalanced.max() > 2, "the test input must start unbalanced"
    log_p, potential = sinkhorn(logits, iters=30)
    p = log_p.exp()
    torch.testing.assert_close(p.sum(-1), torch.ones(2, 3, 256), atol=1e-5, rtol=0)
    torch.testing.assert_close(p.sum(-2), torch.full((2, 3, 16), 256 / 16), atol=1e-2, rtol=0)
    assert potential.shape == (2, 3, 16)
    torch.testing.assert_close(potential.mean(-1), torch.zeros(2, 3), atol=1e-5, rtol=0)


def test_sinkhorn_more_iterations_balance_better():
    logits = skewed_logits(1, 1, 512, 8)
    spread = []
    for iters in (0, 1, 3, 10):
        cols = sinkhorn(logits, iters)[0].exp().sum(-2)
        spread.append((cols.max() - cols.min()).item())
    assert spread == sorted(spread, reverse=True)


def test_sinkhorn_ignores_padding():
    logits = skewed_logits(1, 1, 40, 4)
    valid = torch.ones(1, 1, 40, dtype=torch.bool)
    valid[..., :15] = False
    padded = logits.clone()
    padded[..., :15, :] = 1e4  # garbage in the padding must not move the real tokens
    log_p, _ = sinkhorn(padded, 30, valid)
    alone, _ = sinkhorn(logits[..., 15:, :], 30)
    torch.testing.assert_close(log_p[..., 15:, :], alone, atol=1e-4, rtol=0)
    torch.testing.assert_close(log_p[..., :15, :].exp(), torch.full((1, 1, 15, 4), 0.25))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("scale", [1e4, 1e30])
def test_sinkhorn_no_nan_under_extreme_logits(dtype, scale):
    gen = torch.Generator().manual_seed(0)
    logits = (torch.randn(2, 2, 64, 8, generator=gen) * scale).clamp(-3e38, 3e38).to(dtype)
    valid = torch.ones(2, 2, 64, dtype=torch.bool)
    valid[0, :, :20] = False
    valid[1] = False  # a sequence of nothing but padding
    log_p, potential = sinkhorn(logits, 10, valid)
    assert torch.isfinite(log_p).all() and torch.isfinite(potential).all()
    torch.testing.assert_close(log_p.exp().sum(-1), torch.ones(2, 2, 64), atol=1e-3, rtol=0)


def test_inference_assignment_is_per_token_and_uses_bias():
    logits = torch.randn(1, 2, 10, 4)
    bias = torch.tensor([[0.0, 0.0, 0.0, 50.0], [50.0, 0.0, 0.0, 0.0]])
    log_p = inference_log_assign(logits, bias)
    torch.testing.assert_close(log_p.exp().sum(-1), torch.ones(1, 2, 10))
    assert (top_k_groups(log_p, 1)[0, 0] == 3).all() and (top_k_groups(log_p, 1)[0, 1] == 0).all()
    # Causal by construction: a token's assignment depends only on its own logits.
    changed = logits.clone()
    changed[..., 5:, :] = 100
    torch.testing.assert_close(inference_log_assign(changed, bias)[..., :5, :], log_p[..., :5, :])


def test_routing_logits_are_scaled_cosines():
    vectors = torch.randn(2, 3, 5, 8)
    centroids = torch.randn(3, 4, 8)
    logits = routing_logits(vectors * 7.0, centroids, temperature=0.5)
    b, h, t, g = 1, 2, 3, 1
    expected = torch.nn.functional.cosine_similarity(vectors[b, h, t], centroids[h, g], dim=0) / 0.5
    torch.testing.assert_close(logits[b, h, t, g], expected)
    shared = routing_logits(vectors, centroids[:1], temperature=1.0)
    assert shared.shape == (2, 3, 5, 4)
    torch.testing.assert_close(shared[:, 2], routing_logits(vectors[:, 2:3], centroids[:1], 1.0)[:, 0])


def test_top_k_and_membership():
    log_p = torch.log_softmax(torch.tensor([[0.1, 3.0, 2.0, -1.0]]), -1)
    groups = top_k_groups(log_p, 2)
    assert groups.tolist() == [[1, 2]]
    assert group_membership(groups, 4).tolist() == [[False, True, True, False]]


def test_spherical_kmeans_finds_separated_directions():
    gen = torch.Generator().manual_seed(1)
    directions = torch.nn.functional.normalize(torch.randn(4, 16, generator=gen), dim=-1)
    points = directions.repeat_interleave(50, 0) + 0.05 * torch.randn(200, 16, generator=gen)
    points = points * torch.rand(200, 1, generator=gen) * 10  # norms must not matter
    centroids = spherical_kmeans(points, 4, seed=0)
    similarity = centroids @ directions.T
    assert similarity.max(dim=0).values.min() > 0.99  # every true direction found
    torch.testing.assert_close(centroids.norm(dim=-1), torch.ones(4))
    torch.testing.assert_close(spherical_kmeans(points, 4, seed=0), centroids)  # deterministic


def test_spherical_kmeans_with_fewer_points_than_clusters():
    centroids = spherical_kmeans(torch.randn(3, 8), 5)
    assert centroids.shape == (5, 8) and torch.isfinite(centroids).all()
    assert not math.isnan(centroids.sum().item())


@pytest.mark.parametrize("route_queries", ["query", "kv_head", "key"])
@pytest.mark.parametrize("shared", [False, True])
def test_one_pass_step_routing_equals_routing_keys_and_queries_apart(route_queries, shared):
    """A decoding step routes its new key and its query heads in one call; the groups are those each gets alone, and
    a change of the centroids or the balance bias is seen at the next step (the unit centroids are kept between
    steps)."""
    from test_attention import make_layer

    from focus import FocusConfig
    from focus.attention.routers.routing import cache_key_groups, route_query_heads, step_groups

    config = FocusConfig(num_groups=6, top_k=2, route_queries=route_queries, shared_centroids=shared)
    layer = make_layer(config, 2, 8)
    gen = torch.Generator().manual_seed(3)
    for _ in range(2):
        query, key = torch.randn(3, 6, 1, 8, generator=gen), torch.randn(3, 2, 1, 8, generator=gen)
        key_groups, query_groups = step_groups(layer, query, key, torch.tensor([[7]]))
        assert torch.equal(key_groups, cache_key_groups(layer, key))
        own = (top_k_groups(route_query_heads(layer, query, 2), 2)[:, :, 0] if route_queries != "key"
               else key_groups[:, :, 0].repeat_interleave(3, dim=1))
        assert torch.equal(query_groups, own)
        with torch.no_grad():  # as an optimizer step or load_focus changes them
            layer.focus_centroids.mul_(-1.0)
            layer.focus_group_bias.add_(torch.randn(layer.focus_group_bias.shape, generator=gen))
