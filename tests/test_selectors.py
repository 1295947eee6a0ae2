"""The training-free selectors (`focus.attention.routers.selectors`) against a query-by-query statement of each rule,
and as a Focus model's attention against the dense reference (issue 47)."""

import math

import pytest
import torch

from focus import FocusConfig, apply_focus, remove_focus
from focus.attention import explain
from focus.attention.cache.decoding import FocusCache
from focus.attention.pattern.reference import causal_pairs, dense_attention
from focus.attention.routers.selectors import QUEST_PAGE, selected_pairs
from focus.config import ConfigError

WINDOW, SINKS, LENGTH = 8, 1, 70


class Layer(torch.nn.Module):
    """What `selected_pairs` reads of a Focus layer: its config (and, for "clusters", its routing)."""

    def __init__(self, **changes):
        super().__init__()
        self.focus_config = FocusConfig(mode="hard", window=WINDOW, sink_tokens=SINKS, unrotate=False, **changes)


def case(seed=0, length=LENGTH, padded=0):
    g = torch.Generator().manual_seed(seed)
    query = torch.randn(2, 6, length, 8, generator=g)
    key = torch.randn(2, 2, length, 8, generator=g)
    valid = torch.ones(2, length, dtype=torch.bool)
    valid[1, :padded] = False
    base = causal_pairs(length, length)[None, None] & valid[:, None, None, :]
    return query, key, base, valid


def distant_keys(i, valid_row):
    """The distant keys of query i in one row, oldest first: allowed, beyond the window, not a sink."""
    real = [j for j in range(i + 1) if valid_row[j]]
    return [j for j in real[SINKS:] if i - j >= WINDOW]


def statement(selector, budget, query, key, valid, scores_of_units):
    """The kept pairs (B, H, Q, L), query by query: the window and sinks, plus `selector`'s distant keys."""
    b, h, length, _ = query.shape
    kept = torch.zeros(b, h, length, length, dtype=torch.bool)
    for row in range(b):
        real = [j for j in range(length) if valid[row, j]]
        for head in range(h):
            for i in range(length):
                if not valid[row, i]:
                    continue
                local = [j for j in real if 0 <= i - j < WINDOW or j in real[:SINKS]]
                distant = distant_keys(i, valid[row])
                need = math.ceil(budget * len(distant))
                if selector == "streaming":
                    chosen = distant[len(distant) - need:] if need else []
                else:  # whole units, best first, until the budget is met
                    units = scores_of_units(row, head, i)  # [(score, [distant keys of the unit])]
                    chosen = []
                    for _, members in sorted(units, key=lambda unit: -unit[0]):
                        if len(chosen) >= need:
                            break
                        chosen += members
                kept[row, head, i, local + chosen] = True
    return kept


@pytest.mark.parametrize("budget", [0.0, 0.3, 1.0])
def test_streaming_keeps_the_most_recent_distant_keys(budget):
    query, key, base, valid = case(padded=5)
    got = selected_pairs(Layer(selector="streaming", budget=budget), query, key, base, None)
    assert torch.equal(got, statement("streaming", budget, query, key, valid, None))


@pytest.mark.parametrize("budget", [0.2, 0.5])
def test_quest_keeps_whole_pages_by_its_bound_on_the_logits(budget):
    query, key, base, valid = case(padded=5)
    k = key.float()

    def pages(row, head, i):
        kv = head // 3
        units = []
        for first in range(0, LENGTH, QUEST_PAGE):
            page = [j for j in range(first, min(first + QUEST_PAGE, LENGTH)) if valid[row, j]]
            members = [j for j in distant_keys(i, valid[row]) if j in page]
            if members:
                low, high = k[row, kv, page].amin(dim=0), k[row, kv, page].amax(dim=0)
                q = query[row, head, i]
                units.append((float(torch.maximum(q * low, q * high).sum()), members))
        return units

    got = selected_pairs(Layer(selector="quest", budget=budget), query, key, base, None)
    assert torch.equal(got, statement("quest", budget, query, key, valid, pages))


@pytest.mark.parametrize("route_queries", ["query", "key"])
def test_clusters_keep_whole_clusters_by_the_querys_routing(route_queries):
    from focus.attention.routers.routing import key_positions, route_call

    torch.manual_seed(0)
    layer = Layer(selector="clusters", budget=0.4, num_groups=4, route_queries=route_queries)
    layer.focus_centroids = torch.nn.Parameter(torch.randn(2, 4, 8), requires_grad=False)  # inference: no Sinkhorn
    layer.register_buffer("focus_group_bias", torch.zeros(2, 4))
    query, key, base, valid = case(padded=5)
    with torch.no_grad():
        routed = route_call(layer, query, key, base, key_positions(None, LENGTH, key.device))
    key_cluster = routed.key_log_assign.argmax(dim=-1)  # (B, K, L)
    per_query_head = routed.query_log_assign.shape[1] == 6

    def clusters(row, head, i):
        kv = head // 3
        scores = routed.query_log_assign[row, head if per_query_head else kv, i]
        distant = distant_keys(i, valid[row])
        units = [(float(scores[c]), [j for j in distant if key_cluster[row, kv, j] == c]) for c in range(4)]
        return [unit for unit in units if unit[1]]

    got = selected_pairs(layer, query, key, base, None)
    assert torch.equal(got, statement("clusters", 0.4, query, key, valid, clusters))


def test_budget_outside_zero_to_one_is_refused():
    with pytest.raises(ConfigError, match="budget"):
        FocusConfig(selector="quest", budget=1.5)
    with pytest.raises(ConfigError, match="route_on='key'"):
        FocusConfig(selector="clusters", route_on="value", route_queries="key", unrotate=False)


def test_a_selector_runs_on_the_dense_masked_kernel_and_only_in_hard_inference():
    config = FocusConfig(mode="hard", window=128, selector="quest")
    assert (explain(config, keys=4096).router, explain(config, keys=4096).kernel) == ("quest", "dense_masked")
    assert explain(config, keys=4096, queries=1, cache="native").kernel == "dense_masked"
    assert explain(config, keys=100).kernel == "unmodified"  # within the window
    assert explain(config.replace(mode="soft"), keys=4096).router == "eager"  # training keeps the centroids


@pytest.mark.parametrize("selector", ["streaming", "quest", "clusters", "indexer"])
def test_a_selector_model_is_the_dense_reference_under_its_pattern(smollm2, selector):
    """SmolLM2 with a selector: the logits are the model's attending densely over the selected pairs (each layer's
    attention recomputed by the explicit reference); budget 1 is the unmodified model; a FocusCache's generate()
    decodes as the whole sequence scores."""
    model, tokenizer = smollm2
    ids = tokenizer("The history of the city goes back to the Romans, who built a bridge over the river " * 6,
                    return_tensors="pt").input_ids[:, :200]
    with torch.no_grad():
        pretrained = model(ids).logits
        apply_focus(model, FocusConfig(mode="hard", window=32, selector=selector, budget=1.0), calibration_ids=ids)
        try:
            torch.testing.assert_close(model(ids).logits, pretrained, atol=2e-4, rtol=1e-4)
            for module in (m for m in model.modules() if hasattr(m, "focus_config")):
                module.focus_config = module.focus_config.replace(budget=0.25)
            checked = _check_layers_against_reference(model, ids)
            assert checked == model.config.num_hidden_layers
            prompt = ids[:, :150]
            out = model.generate(prompt, max_new_tokens=6, do_sample=False, past_key_values=FocusCache(model))
            whole = model(out).logits[0, prompt.shape[1] - 1 : -1].argmax(dim=-1)
            assert torch.equal(out[0, prompt.shape[1]:], whole)
        finally:
            remove_focus(model)


def _check_layers_against_reference(model, ids) -> int:
    """Run `model` once, each layer's Focus attention compared with `dense_attention` over `selected_pairs`."""
    import focus.attention.function as function

    checked = 0
    attend = function._attend

    def compared(module, query, key, value, attention_mask, scaling, dropout, softcap, **kwargs):
        nonlocal checked
        out = attend(module, query, key, value, attention_mask, scaling, dropout, softcap, **kwargs)
        base = None if attention_mask is None else attention_mask[..., : key.shape[-2]]
        allowed = selected_pairs(module, query, key, base, kwargs.get("position_ids"))
        torch.testing.assert_close(out, dense_attention(query, key, value, allowed, None, scaling), atol=2e-5,
                                   rtol=1e-4)
        checked += 1
        return out

    function._attend = compared
    try:
        model(ids)
    finally:
        function._attend = attend
    return checked
