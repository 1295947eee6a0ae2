"""The distant-attention recall of a Focus pattern, on tiny models and on the real SmolLM2."""

import pytest
import torch
from test_attention import make_inputs, make_layer

from focus import FocusConfig, apply_focus, remove_focus, set_focus_mode
from focus.attention.pattern.reference import dense_attention, hard_allowed
from focus.attention.routers.centroids import top_k_groups
from focus.attention.routers.routing import sink_keys
from focus.data import chunk_tokens, load_corpus, tokenize_corpus
from focus.eval.diagnostics import (
    _heaviest,
    _oracle_attention,
    distant_attention_recall,
    distant_pairs_kept,
    heads_by_loss,
    heads_by_lost_attention,
    heads_by_needle_attention,
    oracle_selection,
)
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


@pytest.mark.parametrize("family, config", [
    ("llama", FocusConfig(num_groups=8, top_k=1, window=4, sink_tokens=1)),
    ("qwen2", FocusConfig(num_groups=4, top_k=2, window=6, route_queries="query", dense_heads=["l0h0"])),
    ("llama", FocusConfig(num_groups=8, top_k=1, window=4, selector="quest", budget=0.3)),
])
def test_the_pairs_kept_alone_are_the_recalls_share_kept(one_thread, family, config):
    """`distant_pairs_kept` (the pattern alone: what the perplexity records spend) is exactly the share
    `distant_attention_recall` reports beside the attention mass, for Focus's groups and a training-free selector,
    over several rows of a batch; the model's attention is back afterwards."""
    model = tiny_model(family, seed=0)
    ids = rows(model, n=3)
    apply_focus(model, config, calibration_ids=ids)
    set_focus_mode(model, "hard")
    expected = distant_attention_recall(model, ids, batch_size=2)["kept"]
    assert 0 < expected < 1
    assert distant_pairs_kept(model, ids, batch_size=2) == expected
    assert distant_pairs_kept(model, ids, batch_size=3) == pytest.approx(expected, abs=1e-12)
    assert model.config._attn_implementation == "focus"


def test_per_head_tallies_sum_to_the_layer_and_dense_heads_keep_every_distant_pair(one_thread):
    model = tiny_model("llama", seed=0)
    ids = rows(model)
    apply_focus(model, FocusConfig(num_groups=8, top_k=1, window=4), calibration_ids=ids)
    found = distant_attention_recall(model, ids)
    heads = found["heads"][0]
    assert len(heads) == model.config.num_key_value_heads
    assert found["layers"][0]["kept"] == pytest.approx(sum(h["kept"] for h in heads) / len(heads))  # equal pair counts
    ranked = heads_by_lost_attention(model, ids)
    assert len(ranked) == model.config.num_hidden_layers * model.config.num_key_value_heads
    assert [score for _, score in ranked] == sorted((score for _, score in ranked), reverse=True)
    most = ranked[0][0]
    set_focus_mode(model, "hard", dense_heads=[most])
    layer, head = int(most[1:].split("h")[0]), int(most.split("h")[1])
    dense = distant_attention_recall(model, ids)["heads"][layer][head]
    assert dense["kept"] == pytest.approx(1.0) and dense["recall"] == pytest.approx(1.0) and dense["lost"] == 0


def test_heads_by_loss_is_the_loss_each_dense_head_saves(one_thread):
    """Each head's score is the mean next-token loss of the hard model minus that with the head (besides the dense
    ones) kept dense; the model's dense heads are back afterwards."""
    model = tiny_model("llama", seed=0)
    ids = rows(model, n=3)
    apply_focus(model, FocusConfig(num_groups=8, top_k=1, window=4, mode="hard", dense_heads=["l0h0"]),
                calibration_ids=ids)

    def loss(dense):
        set_focus_mode(model, "hard", dense_heads=dense)
        with torch.no_grad():
            return float(model(input_ids=ids, labels=ids).loss)

    base = loss(["l0h0"])
    ranked = heads_by_loss(model, ids, batch_size=2)
    assert list(model.model.layers[0].self_attn.focus_config.dense_heads) == ["l0h0"]
    assert len(ranked) == model.config.num_hidden_layers * model.config.num_key_value_heads - 1  # not l0h0
    assert [score for _, score in ranked] == sorted((score for _, score in ranked), reverse=True)
    name, score = ranked[0]
    assert score == pytest.approx(base - loss(["l0h0", name]), abs=1e-5)


def test_needle_attention_is_the_mass_the_last_queries_put_on_the_span(one_thread):
    """Against transformers' eager attention weights, averaged over each key/value head's query heads."""
    model = tiny_model("llama", seed=0)
    ids = rows(model, length=40)
    spans = [(10, 14), (20, 23)]
    model.set_attn_implementation("eager")
    with torch.no_grad():
        weights = [model(input_ids=row[None], output_attentions=True).attentions for row in ids]
    model.set_attn_implementation("sdpa")
    apply_focus(model, FocusConfig(num_groups=4, top_k=1, window=4), calibration_ids=ids)
    found = dict(heads_by_needle_attention(model, ids, spans, last=3))
    r = model.config.num_attention_heads // model.config.num_key_value_heads
    for layer in range(model.config.num_hidden_layers):
        for head in range(model.config.num_key_value_heads):
            expected = sum(w[layer][0, head * r : (head + 1) * r, -3:, s:e].sum(-1).mean().item()
                           for w, (s, e) in zip(weights, spans)) / len(spans)
            assert found[f"l{layer}h{head}"] == pytest.approx(expected, rel=1e-4)
    assert model.config._attn_implementation == "focus"  # restored


@pytest.mark.parametrize("share", [None, 0.5])
def test_the_oracle_keeps_the_heaviest_distant_pairs_as_many_per_row_as_the_pattern_keeps_or_its_share(share,
                                                                                                        one_thread):
    config = FocusConfig(num_groups=4, top_k=1, window=3, sink_tokens=1, mode="hard", route_queries="query")
    layer = make_layer(config, 2, 8)
    q, key, v, mask = make_inputs(2, 4, 2, 20, 8, pads=(0, 4))
    with torch.no_grad():
        out = _oracle_attention(layer, q, key, v, mask, scaling=0.4, share=share)[0].transpose(1, 2)
        # The pattern, routed as the layer routes at inference (query heads by their query, keys by theirs).
        logits_k = torch.einsum("bkld,kgd->bklg", torch.nn.functional.normalize(key, dim=-1),
                                torch.nn.functional.normalize(layer.focus_centroids, dim=-1)) / config.temperature
        groups = top_k_groups(torch.log_softmax(logits_k + layer.focus_group_bias[None, :, None], -1), 1)
        centroids = layer.focus_centroids.repeat_interleave(2, dim=0)  # per query head
        logits_q = torch.einsum("bhqd,hgd->bhqg", torch.nn.functional.normalize(q, dim=-1),
                                torch.nn.functional.normalize(centroids, dim=-1)) / config.temperature
        valid = mask.any(dim=-2)[:, 0]
        sinks = sink_keys(valid, 20, 1)
        kept = hard_allowed(top_k_groups(logits_q, 1), groups, 4, 3, mask, sinks)  # (B, H, Q, L)
        chosen = torch.zeros_like(kept)
        for b in range(2):
            for h in range(4):
                for i in range(20):
                    allowed = [j for j in range(20) if mask[b, 0, i, j]]
                    free = [j for j in allowed if i - j < 3 or sinks[b, j]]
                    distant = [j for j in allowed if j not in free]
                    count = (sum(bool(kept[b, h, i, j]) for j in distant) if share is None
                             else round(len(distant) * share))
                    scores = {j: float(q[b, h, i] @ key[b, h // 2, j]) for j in distant}
                    for j in free + sorted(distant, key=scores.get, reverse=True)[:count]:
                        chosen[b, h, i, j] = True
        expected = dense_attention(q, key, v, chosen, None, 0.4)
    real = valid[:, None, :, None].expand_as(out)
    torch.testing.assert_close(out[real], expected[real], atol=1e-5, rtol=1e-4)
    assert not torch.equal(chosen, kept)  # the oracle chose other pairs than the routing: the test tells them apart


def test_the_oracles_cut_keeps_exactly_its_count_per_row_and_nothing_lighter_than_what_it_leaves():
    """The oracle's top-k cut against ranking every row by a sort: the same pairs where scores do not tie; where they
    tie at the cut (float32 logits of distinct keys do at times), still exactly `count`, none below one left out.
    Rows where nothing is eligible or nothing is kept included."""
    generator = torch.Generator().manual_seed(0)
    ties = torch.randint(0, 6, (2, 3, 40, 50), generator=generator).float()  # few values: ties everywhere
    for scores in (torch.randn(ties.shape, generator=generator), ties):
        scores[torch.rand(scores.shape, generator=generator) < 0.3] = float("-inf")  # not eligible
        scores[0, 0, 0] = float("-inf")  # a row with nothing eligible
        eligible = (scores > float("-inf")).sum(dim=-1, keepdim=True)
        count = (eligible * torch.rand(eligible.shape, generator=generator)).round()
        count[0, 1, 0] = 0
        chosen = _heaviest(scores, count)
        assert torch.equal(chosen.sum(dim=-1, keepdim=True), count.long())
        lightest_kept = scores.masked_fill(~chosen, float("inf")).amin(dim=-1)
        heaviest_left = scores.masked_fill(chosen, float("-inf")).amax(dim=-1)
        assert bool((lightest_kept >= heaviest_left).all())
    ranked = torch.randn(4, 30, generator=generator)
    count = torch.tensor([[0], [1], [17], [30]])
    assert torch.equal(_heaviest(ranked, count), ranked.argsort(dim=-1, descending=True).argsort(dim=-1) < count)


def test_an_oracle_over_a_pattern_that_keeps_every_pair_is_the_unmodified_model(one_thread):
    model = tiny_model("llama", seed=0)
    ids = rows(model)
    with torch.no_grad():
        expected = model(input_ids=ids).logits
    apply_focus(model, FocusConfig(num_groups=2, top_k=2, window=4, mode="hard"), calibration_ids=ids)
    with torch.no_grad(), oracle_selection(model):
        torch.testing.assert_close(model(input_ids=ids).logits, expected, atol=1e-5, rtol=1e-5)
    assert model.config._attn_implementation == "focus"  # restored
    set_focus_mode(model, "hard", top_k=1)  # a sparse pattern, which a share of one ignores
    with torch.no_grad(), oracle_selection(model, share=1.0):
        torch.testing.assert_close(model(input_ids=ids).logits, expected, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="share must be within"), oracle_selection(model, share=1.5):
        pass


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
