"""The distant-attention recall of a Focus pattern, on tiny models and on the real SmolLM2."""

import pytest
import torch

from focus import FocusConfig, apply_focus, remove_focus
from focus.data import chunk_tokens, load_corpus, tokenize_corpus
from focus.diagnostics import distant_attention_recall
from focus.models import tiny_model


def rows(model, length=48, n=2, seed=0):
    return torch.randint(3, model.config.vocab_size, (n, length), generator=torch.Generator().manual_seed(seed))


def test_a_pattern_that_keeps_every_pair_recalls_everything_and_the_model_is_untouched(one_thread):
    model = tiny_model("qwen2", seed=0)
    ids = rows(model)
    with torch.no_grad():
        expected = model(input_ids=ids).logits
    apply_focus(model, FocusConfig(num_groups=2, top_k=2, window=4, route_queries="query"), calibration_ids=ids)
    found = distant_attention_recall(model, ids)
    assert found["recall"] == pytest.approx(1.0) and found["kept"] == pytest.approx(1.0)
    assert found["oracle_recall"] == pytest.approx(1.0)
    assert len(found["layers"]) == model.config.num_hidden_layers and 0 < found["distant_mass"] < 1
    assert model.config._attn_implementation == "focus"  # restored
    remove_focus(model)
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, expected)


def test_recall_and_cost_of_a_sparse_pattern_are_shares(one_thread):
    model = tiny_model("llama", seed=0)
    ids = rows(model)
    apply_focus(model, FocusConfig(num_groups=8, top_k=1, window=4), calibration_ids=ids)
    found = distant_attention_recall(model, ids)
    assert 0 < found["kept"] < 1 and 0 < found["recall"] < 1
    assert found["recall"] <= found["oracle_recall"] + 1e-9 <= 1 + 1e-9  # nothing keeps more at the same cost
    # Summed over layers the shares weigh every layer's pairs equally: the overall cost is their mean.
    assert found["kept"] == pytest.approx(sum(layer["kept"] for layer in found["layers"]) / len(found["layers"]))


@pytest.mark.slow
def test_on_smollm2_query_routing_keeps_far_more_distant_attention_than_key_routing(smollm2):
    """The study's mechanism, on real weights and text: a query routed by its key keeps about as much distant
    attention mass as pairs (no better than chance); routed by its own query vector it keeps several times more."""
    model, tokenizer = smollm2
    text = tokenize_corpus(load_corpus("books", "validation")[:60_000], tokenizer)
    calibration, held_out = chunk_tokens(text, 256)[:4], chunk_tokens(text, 256)[4:6]
    found = {}
    for routing in ("key", "query"):
        apply_focus(model, FocusConfig(num_groups=16, top_k=2, window=32, route_queries=routing, unrotate=False),
                    calibration_ids=calibration)
        try:
            found[routing] = distant_attention_recall(model, held_out, batch_size=2)
        finally:
            remove_focus(model)
    key, query = found["key"], found["query"]
    assert key["recall"] < 2 * key["kept"], key
    assert query["recall"] > 0.7 * query["oracle_recall"], query  # most of what any routing could keep
    assert query["recall"] > 4 * query["kept"] and query["recall"] > 2 * key["recall"], (key, query)
