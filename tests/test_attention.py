"""The attention function transformers calls (SDPA-based) against the dense reference."""

import pytest
import torch
from torch import nn

from focus import FocusConfig
from focus.attention.dispatch.fast_path import fast_path
from focus.attention.function import focus_attention
from focus.attention.pattern.reference import dense_attention, hard_allowed, soft_bias
from focus.attention.routers.centroids import routing_logits, top_k_groups
from focus.attention.routers.routing import route_keys, sink_keys


def make_layer(config: FocusConfig, kv_heads: int, head_dim: int, seed: int = 0) -> nn.Module:
    """A stand-in attention module carrying what apply_focus puts on a real one."""
    gen = torch.Generator().manual_seed(seed)
    layer = nn.Module()
    layer.focus_config = config
    sets = 1 if config.shared_centroids else kv_heads
    layer.focus_centroids = nn.Parameter(torch.randn(sets, config.num_groups, head_dim, generator=gen))
    layer.register_buffer("focus_group_bias", 0.3 * torch.randn(sets, config.num_groups, generator=gen))
    return layer


def make_inputs(b, h, k, length, d, pads=(), dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q, key, v = (torch.randn(b, n, length, d, generator=gen).to(dtype) for n in (h, k, k))
    mask = None
    if pads:
        mask = torch.ones(b, 1, length, length, dtype=torch.bool).tril()
        for bi, p in enumerate(pads):
            mask[bi, :, :, :p] = False
    return q, key, v, mask


def reference_attention(layer, q, key, v, mask, scaling=None, softcap=None):
    """Dense reference, routed exactly as the layer routes (the routing is tested on its own)."""
    config = layer.focus_config
    q_len, k_len = q.shape[-2], key.shape[-2]
    valid = None if mask is None else mask.any(dim=-2)[:, 0]
    log_p = route_keys(layer, key if config.route_on == "key" else v, valid)
    if config.route_queries != "key":  # each query head against its key/value head's centroids, written out
        centroids = layer.focus_centroids
        per_head = torch.stack([centroids[min(h * centroids.shape[0] // q.shape[1], centroids.shape[0] - 1)]
                                for h in range(q.shape[1])])  # (H, G, D)
        logits = routing_logits(q.detach(), per_head, config.temperature)  # routing: centroids only
        if config.route_queries == "kv_head":  # the query heads of a key/value head: one mean, shared
            r = q.shape[1] // key.shape[1]
            logits = torch.stack([logits[:, h // r * r : h // r * r + r].mean(dim=1) for h in range(q.shape[1])], 1)
        log_p_q = torch.log_softmax(logits, dim=-1)
    else:
        log_p_q = log_p[:, :, k_len - q_len :]
    sinks = sink_keys(valid, k_len, config.sink_tokens)

    def attend(mode):
        if mode == "soft":
            bias, allowed = soft_bias(log_p_q, log_p, config.window, mask, config.gate_floor, sinks, config.gate)
        else:
            groups = top_k_groups(log_p, config.top_k)
            allowed = hard_allowed(top_k_groups(log_p_q, config.top_k), groups, config.num_groups, config.window, mask,
                                   sinks)
            bias = None
        return dense_attention(q, key, v, allowed, bias, scaling, softcap)

    if config.objective == "straight_through" and torch.is_grad_enabled() and layer.focus_centroids.requires_grad:
        soft, hard = attend("soft"), attend("hard")  # training the hard model: its values, the soft gate's gradient
        return soft + (hard - soft).detach()
    return attend(config.mode)


def reference_with_dense_heads(layer, q, key, v, mask, scaling=None):
    """The reference of a layer with `dense_heads`: Focus's for the other heads, written out as the model's own
    attention (every pair it allows) for the query heads of the dense key/value heads."""
    config = layer.focus_config
    layer.focus_config = config.replace(dense_heads=[])
    try:
        out = reference_attention(layer, q, key, v, mask, scaling=scaling)
    finally:
        layer.focus_config = config
    allowed = torch.ones(q.shape[-2], key.shape[-2], dtype=torch.bool).tril()[None, None] if mask is None else mask
    own = dense_attention(q, key, v, allowed, None, scaling)
    r = q.shape[1] // key.shape[1]
    for head in config.dense_heads_of(layer.layer_idx):
        out[:, head * r : (head + 1) * r] = own[:, head * r : (head + 1) * r]
    return out


def run_focus(layer, q, key, v, mask, **kwargs):
    out, weights = focus_attention(layer, q, key, v, mask, **kwargs)
    assert weights is None
    return out.transpose(1, 2)  # (B, H, Q, D)


CASES = [
    # mode, top_k, window, heads, kv_heads, pads, route_on, shared, sinks, route_queries
    ("soft", 2, 5, 6, 2, (0, 7), "key", False, 1, "key"),
    ("soft", 1, 0, 3, 3, (), "value", False, 0, "key"),
    ("soft", 2, 9, 4, 1, (3, 0), "key", True, 4, "key"),
    ("soft", 2, 5, 6, 2, (0, 7), "key", False, 1, "query"),
    ("soft", 1, 3, 4, 1, (3, 0), "key", True, 2, "query"),
    ("soft", 2, 4, 6, 3, (0, 5), "key", False, 1, "query", "neutral"),
    ("hard", 1, 5, 6, 2, (0, 7), "key", False, 1, "key"),
    ("hard", 2, 0, 3, 3, (), "key", False, 0, "key"),
    ("hard", 2, 9, 4, 1, (3, 0), "value", True, 4, "key"),
    ("hard", 4, 3, 4, 2, (0, 2), "key", False, 1, "key"),  # top_k == num_groups: every pair shares a group
    ("hard", 2, 5, 6, 2, (0, 7), "key", False, 1, "query"),
    ("hard", 1, 1, 3, 3, (), "key", True, 0, "query"),
    ("soft", 2, 5, 6, 2, (0, 7), "key", False, 1, "kv_head"),
    ("hard", 2, 5, 6, 2, (0, 7), "key", False, 1, "kv_head"),
    ("hard", 1, 3, 4, 1, (3, 0), "key", True, 2, "kv_head"),
]


# Training routes by Sinkhorn, inference by the balance bias; the objective matters only while training.
PHASES = [(False, "straight_through"), (True, "language_model"), (True, "straight_through")]


@pytest.mark.parametrize("case", CASES, ids=str)
@pytest.mark.parametrize(("training", "objective"), PHASES)
def test_outputs_match_reference(case, training, objective):
    mode, top_k, window, heads, kv_heads, pads, route_on, shared, sinks, route_queries, *gate = case
    config = FocusConfig(
        num_groups=4, top_k=top_k, window=window, mode=mode, route_on=route_on, shared_centroids=shared,
        sink_tokens=sinks, route_queries=route_queries, gate=gate[0] if gate else "overlap", unrotate=False,
        objective=objective,
    )
    layer = make_layer(config, kv_heads, 8)
    q, key, v, mask = make_inputs(2, heads, kv_heads, 37, 8, pads)
    with torch.set_grad_enabled(training):
        out = run_focus(layer, q, key, v, mask, scaling=0.4)
        expected = reference_attention(layer, q, key, v, mask, scaling=0.4)
    real = torch.ones(2, 37, dtype=torch.bool) if mask is None else mask.any(-1)[:, 0]
    torch.testing.assert_close(out.transpose(1, 2)[real], expected.transpose(1, 2)[real], atol=2e-5, rtol=1e-4)
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("path", ["auto", "dense"])
@pytest.mark.parametrize(("mode", "route_queries"), [("soft", "query"), ("hard", "query"), ("hard", "key"),
                                                  ("hard", "kv_head")])
def test_dense_heads_attend_as_the_model_and_the_other_heads_as_focus(mode, route_queries, path):
    config = FocusConfig(num_groups=4, top_k=1, window=3, mode=mode, route_queries=route_queries, unrotate=False,
                         dense_heads=["l1h1", "l2h0"])
    layer = make_layer(config, 3, 8)
    layer.layer_idx = 1  # of l1h1 and l2h0, only key/value head 1 of this layer is dense
    q, key, v, mask = make_inputs(2, 6, 3, 29, 8, pads=(0, 4))
    with torch.no_grad(), fast_path(path):
        out = run_focus(layer, q, key, v, mask, scaling=0.4)
        expected = reference_with_dense_heads(layer, q, key, v, mask, scaling=0.4)
    real = mask.any(-1)[:, 0]
    torch.testing.assert_close(out.transpose(1, 2)[real], expected.transpose(1, 2)[real], atol=2e-5, rtol=1e-4)
    layer.focus_config = config.replace(dense_heads=[])
    with torch.no_grad(), fast_path(path):
        sparse = run_focus(layer, q, key, v, mask, scaling=0.4).transpose(1, 2)[real]  # (N, H, D) real rows
    out = out.transpose(1, 2)[real]
    assert not torch.allclose(sparse[:, 2:4], out[:, 2:4], atol=1e-3)  # the dense head differs from its Focus self
    torch.testing.assert_close(sparse[:, [0, 1, 4, 5]], out[:, [0, 1, 4, 5]])  # the other heads are untouched


@pytest.mark.parametrize("objective", ["language_model", "straight_through"])
@pytest.mark.parametrize("route_queries", ["key", "query", "kv_head"])
@pytest.mark.parametrize("mode", ["soft", "hard"])
def test_gradients_match_reference(mode, route_queries, objective):
    config = FocusConfig(num_groups=4, top_k=2, window=4, mode=mode, route_queries=route_queries, objective=objective)
    layer = make_layer(config, 2, 8)
    q, key, v, mask = make_inputs(2, 4, 2, 23, 8, pads=(0, 5))
    weight = torch.randn(2, 4, 23, 8)  # an arbitrary downstream loss
    weight[1, :, :5] = 0  # padding rows carry no loss
    grads = []
    for attend in (run_focus, reference_attention):
        tensors = [t.clone().requires_grad_() for t in (q, key, v)]
        layer.focus_centroids.grad = None
        loss = (attend(layer, *tensors, mask) * weight).sum()
        loss.backward()
        grads.append([t.grad for t in tensors] + [layer.focus_centroids.grad])
    for fast, ref, name in zip(*grads, ["query", "key", "value", "centroids"]):
        if mode == "hard" and objective == "language_model" and name == "centroids":
            assert fast is None and ref is None  # top-k is not differentiable: the soft model is what trains
            continue
        torch.testing.assert_close(fast, ref, atol=5e-5, rtol=1e-4, msg=name)
    if mode == "soft" or objective == "straight_through":
        assert grads[0][3].abs().sum() > 0, "training must reach the centroids"


@pytest.mark.parametrize(("route_queries", "gate", "mode"), [("key", "overlap", "soft"), ("query", "neutral", "hard")])
def test_straight_through_training_runs_the_hard_pattern_and_takes_the_soft_gradient(route_queries, gate, mode):
    config = FocusConfig(num_groups=4, top_k=2, window=4, mode=mode, route_queries=route_queries, gate=gate,
                         objective="straight_through")
    layer = make_layer(config, 2, 8)
    q, key, v, mask = make_inputs(2, 4, 2, 23, 8, pads=(0, 5))
    weight = torch.randn(2, 4, 23, 8)
    weight[1, :, :5] = 0  # padding rows carry no loss
    outputs, grads = [], []
    references = [config.replace(mode=mode, objective="language_model") for mode in ("hard", "soft")]
    for attend, as_config in ((run_focus, config), *((reference_attention, ref) for ref in references)):
        layer.focus_config = as_config
        tensors = [t.clone().requires_grad_() for t in (q, key, v)]
        layer.focus_centroids.grad = None
        out = attend(layer, *tensors, mask)
        (out * weight).sum().backward()
        outputs.append(out.detach())
        grads.append([t.grad for t in tensors] + [layer.focus_centroids.grad])
    (straight, hard, soft), real = outputs, mask.any(-1)[:, 0]
    torch.testing.assert_close(straight.transpose(1, 2)[real], hard.transpose(1, 2)[real], atol=2e-5, rtol=1e-4)
    assert not torch.allclose(hard, soft, atol=1e-3)  # the two passes differ: the test tells them apart
    for fast, ref, name in zip(grads[0], grads[2], ["query", "key", "value", "centroids"]):
        torch.testing.assert_close(fast, ref, atol=5e-5, rtol=1e-4, msg=name)
    assert grads[0][3].abs().sum() > 0
    layer.focus_config = config
    with torch.no_grad():  # outside training, the objective changes nothing: the configured mode attends
        inference, expected = run_focus(layer, q, key, v, mask), reference_attention(layer, q, key, v, mask)
    torch.testing.assert_close(inference.transpose(1, 2)[real], expected.transpose(1, 2)[real], atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("route_queries", ["key", "query", "kv_head"])
@pytest.mark.parametrize("mode", ["soft", "hard"])
def test_decoding_rows_equal_prefill_rows(mode, route_queries):
    """Queries at the end of a KV cache see what the same rows of a full prefill see."""
    config = FocusConfig(num_groups=4, top_k=2, window=3, mode=mode, route_queries=route_queries)
    layer = make_layer(config, 2, 8)
    q, key, v, _ = make_inputs(1, 4, 2, 30, 8)
    with torch.no_grad():
        prefill = run_focus(layer, q, key, v, None)
        for q_len in (1, 4):
            decode_mask = None if q_len == 1 else torch.ones(30, 30, dtype=torch.bool).tril()[-q_len:][None, None]
            step = run_focus(layer, q[:, :, -q_len:], key, v, decode_mask)
            torch.testing.assert_close(step, prefill[:, :, -q_len:], atol=1e-6, rtol=1e-5)


def test_window_covering_the_sequence_is_plain_causal_attention():
    layer = make_layer(FocusConfig(num_groups=4, window=16, mode="hard"), 2, 8)
    q, key, v, _ = make_inputs(2, 4, 2, 16, 8)
    out = run_focus(layer, q, key, v, None)
    expected = torch.nn.functional.scaled_dot_product_attention(q, key, v, is_causal=True, enable_gqa=True)
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=1e-5)


def test_softcap_path_matches_reference():
    layer = make_layer(FocusConfig(num_groups=4, top_k=1, window=4, mode="soft"), 2, 8)
    q, key, v, mask = make_inputs(2, 4, 2, 19, 8, pads=(0, 3))
    with torch.no_grad():
        out = run_focus(layer, q * 5, key, v, mask, softcap=3.0)
        expected = reference_attention(layer, q * 5, key, v, mask, softcap=3.0)
    torch.testing.assert_close(out[:, :, 3:], expected[:, :, 3:])


@pytest.mark.parametrize("route_queries", ["key", "query"])
@pytest.mark.parametrize("mode", ["soft", "hard"])
def test_bfloat16_error_within_twice_the_reference_error(mode, route_queries):
    """flash-attn's rule: the fast path's error vs float32 is at most twice the reference's in bf16."""
    config = FocusConfig(num_groups=4, top_k=2, window=5, mode=mode, route_queries=route_queries)
    layer = make_layer(config, 2, 16)
    q, key, v, mask = make_inputs(2, 4, 2, 64, 16, pads=(0, 9))
    with torch.no_grad():
        exact = reference_attention(layer, q, key, v, mask)
        low = [t.bfloat16() for t in (q, key, v)]
        fast = run_focus(layer, *low, mask).float()
        ref = reference_attention(layer, *low, mask).float()
    real = mask.any(-1)[:, 0]
    fast_err = (fast - exact).transpose(1, 2)[real].abs().max()
    ref_err = (ref - exact).transpose(1, 2)[real].abs().max()
    assert fast_err <= 2 * ref_err + 1e-3, (fast_err, ref_err)


def test_training_updates_the_balance_bias_and_inference_does_not():
    layer = make_layer(FocusConfig(num_groups=4, window=2), 2, 8)
    q, key, v, _ = make_inputs(1, 4, 2, 20, 8)
    before = layer.focus_group_bias.clone()
    with torch.no_grad():
        run_focus(layer, q, key, v, None)
    assert torch.equal(layer.focus_group_bias, before)
    run_focus(layer, q, key, v, None)
    assert not torch.equal(layer.focus_group_bias, before)
