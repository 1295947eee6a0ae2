"""The dense reference is the oracle, so it is itself checked against loops written from the definition."""

import math

import pytest
import torch

from focus.attention.pattern.reference import dense_attention, hard_allowed, local_pairs, soft_bias
from focus.attention.routers.routing import sink_keys


def padded_causal_mask(batch, length, pads):
    """(B, 1, L, L) bool: causal, with the first pads[b] tokens of row b being left padding."""
    mask = torch.ones(batch, 1, length, length, dtype=torch.bool).tril()
    for b, p in enumerate(pads):
        mask[b, :, :, :p] = False
    return mask


@pytest.mark.parametrize("window,top_k,sink_tokens", [(0, 1, 0), (3, 1, 1), (3, 2, 2), (20, 2, 0)])
def test_hard_pattern_allows_exactly_the_right_pairs(window, top_k, sink_tokens):
    gen = torch.Generator().manual_seed(window * 10 + top_k)
    b, k, length, groups_n = 2, 2, 13, 4
    groups = torch.stack([torch.randperm(groups_n, generator=gen)[:top_k] for _ in range(b * k * length)])
    groups = groups.view(b, k, length, top_k)
    pads = [0, 4]
    mask = padded_causal_mask(b, length, pads)
    sinks = sink_keys(mask.any(dim=-2)[:, 0], length, sink_tokens)
    allowed = hard_allowed(groups, groups, groups_n, window, mask, sinks)
    for bi in range(b):
        for h in range(k):
            for i in range(length):
                for j in range(length):
                    real = j >= pads[bi] and i >= pads[bi]
                    share = bool(set(groups[bi, h, i].tolist()) & set(groups[bi, h, j].tolist()))
                    sink = pads[bi] <= j < pads[bi] + sink_tokens  # the first real tokens
                    expected = real and j <= i and (i - j < window or share or sink)
                    if i < pads[bi]:  # padding query: the model itself allows nothing
                        expected = False
                    assert allowed[bi, h, i, j].item() == expected, (bi, h, i, j)


def test_hard_pattern_for_decoding_queries_uses_end_positions():
    groups = torch.tensor([0, 1, 0, 1, 1, 0]).view(1, 1, 6, 1)
    allowed = hard_allowed(groups[:, :, -1:], groups, 2, 2, None)  # last token, queries aligned to the end
    assert allowed[0, 0, 0].tolist() == [True, False, True, False, True, True]


def test_soft_bias_is_log_same_group_probability_outside_the_window():
    gen = torch.Generator().manual_seed(0)
    log_p = torch.log_softmax(torch.randn(1, 2, 9, 3, generator=gen), -1)
    bias, allowed = soft_bias(log_p, log_p, window=3, base_mask=None, floor=1e-6, sinks=sink_keys(None, 9, 1))
    p = log_p.exp()
    for h in range(2):
        for i in range(9):
            for j in range(9):
                if 0 <= i - j < 3 or j == 0:  # local, or the sink
                    expected = 0.0
                else:
                    expected = math.log(max(sum(p[0, h, i, g] * p[0, h, j, g] for g in range(3)).item(), 1e-6))
                assert bias[0, h, i, j].item() == pytest.approx(expected, abs=1e-5)
                assert allowed[0, 0, i, j].item() == (j <= i)


def test_neutral_gate_charges_only_pairs_below_chance_agreement():
    gen = torch.Generator().manual_seed(1)
    log_p = torch.log_softmax(3 * torch.randn(1, 1, 7, 4, generator=gen), -1)
    bias, _ = soft_bias(log_p, log_p, window=2, base_mask=None, floor=1e-6, gate="neutral")
    p = log_p.exp()
    for i in range(7):
        for j in range(i - 1):  # distant pairs
            overlap = sum(p[0, 0, i, g] * p[0, 0, j, g] for g in range(4)).item()
            expected = min(0.0, math.log(max(4 * overlap, 1e-6)))
            assert bias[0, 0, i, j].item() == pytest.approx(expected, abs=1e-5)
    assert (bias <= 0).all() and (bias == 0).any() and (bias < -1).any()


def test_per_query_head_groups_give_each_query_head_its_own_pattern():
    """Query groups per query head (H = K * R = 2 * 2), key groups per key/value head: pair (i, j) of query head
    h is kept when h's groups for i meet the groups of key j in h's key/value head h // R."""
    gen = torch.Generator().manual_seed(2)
    groups_k = torch.randint(3, (1, 2, 8, 1), generator=gen)
    groups_q = torch.randint(3, (1, 4, 8, 1), generator=gen)
    allowed = hard_allowed(groups_q, groups_k, 3, 2, None)
    assert allowed.shape == (1, 4, 8, 8)
    for h in range(4):
        for i in range(8):
            for j in range(8):
                shared = groups_q[0, h, i, 0] == groups_k[0, h // 2, j, 0]
                assert allowed[0, h, i, j].item() == (j <= i and (i - j < 2 or bool(shared)))


def test_sink_keys_are_the_first_real_tokens():
    valid = torch.tensor([[True] * 6, [False, False, True, True, True, True]])
    assert sink_keys(valid, 6, 2).tolist() == [[True, True, False, False, False, False],
                                              [False, False, True, True, False, False]]
    assert sink_keys(None, 4, 1).tolist() == [[True, False, False, False]]


def test_local_pairs_window_zero_is_empty():
    assert not local_pairs(5, 5, 0).any()
    assert local_pairs(5, 5, 1).equal(torch.eye(5, dtype=torch.bool))


def test_dense_attention_matches_a_per_head_loop():
    gen = torch.Generator().manual_seed(0)
    b, h, k, q_len, k_len, d = 2, 6, 2, 4, 7, 5
    q, key, v = (torch.randn(b, n, length, d, generator=gen) for n, length in ((h, q_len), (k, k_len), (k, k_len)))
    allowed = torch.rand(b, k, q_len, k_len, generator=gen) > 0.3
    allowed[0, 0, 1] = False  # a row with nothing allowed: attends everywhere instead of NaN
    bias = torch.randn(b, k, q_len, k_len, generator=gen)
    out = dense_attention(q, key, v, allowed, bias, scaling=0.3, softcap=2.0)
    for bi in range(b):
        for hi in range(h):
            kv = hi // (h // k)
            logits = 2.0 * torch.tanh((q[bi, hi] @ key[bi, kv].T) * 0.3 / 2.0) + bias[bi, kv]
            row_ok = allowed[bi, kv] | ~allowed[bi, kv].any(-1, keepdim=True)
            weights = logits.masked_fill(~row_ok, float("-inf")).softmax(-1)
            torch.testing.assert_close(out[bi, hi], weights @ v[bi, kv], atol=1e-5, rtol=1e-5)
