"""apply_focus / remove_focus on every supported family, built tiny and random."""

import copy
import json

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from focus import (
    ConfigError,
    FocusConfig,
    apply_focus,
    focus_config,
    focus_parameter_count,
    focus_parameters,
    load_focus,
    remove_focus,
    save_focus,
    set_focus_mode,
)
from focus.attention.routers.centroids import undo_rotary
from focus.models import tiny_model
from focus.retrofit import attention_modules
from focus.sources import TINY_FAMILIES

LENGTH = 24


def padded_batch(vocab: int, seed: int = 0):
    """Two sequences; the second left-padded by 5 tokens."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (2, LENGTH), generator=gen)
    mask = torch.ones_like(ids)
    mask[1, :5] = 0
    ids[1, :5] = 0
    return ids, mask


def logits(model, ids, mask):
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask).logits


@pytest.fixture(scope="module", params=TINY_FAMILIES)
def family(request):
    return request.param


@pytest.mark.parametrize("mode", ["soft", "hard"])
@pytest.mark.parametrize("setting", ["window_covers", "one_group"])
def test_focus_equals_unmodified_model_when_nothing_is_pruned(family, mode, setting):
    model = tiny_model(family, seed=0)
    ids, mask = padded_batch(model.config.vocab_size)
    expected = logits(model, ids, mask)
    config = (
        FocusConfig(window=LENGTH, num_groups=4, top_k=1, mode=mode)
        if setting == "window_covers"
        # One group, every token in it: the whole routing path runs and still prunes nothing.
        else FocusConfig(window=2, num_groups=1, top_k=1, mode=mode)
    )
    apply_focus(model, config, calibration_ids=ids, calibration_mask=mask)
    got = logits(model, ids, mask)
    real = mask.bool()
    torch.testing.assert_close(got[real], expected[real], atol=1e-5, rtol=1e-4)


def test_focus_with_a_small_window_changes_the_output(family):
    model = tiny_model(family, seed=0)
    ids, mask = padded_batch(model.config.vocab_size)
    expected = logits(model, ids, mask)
    apply_focus(model, FocusConfig(window=2, num_groups=4, top_k=1, mode="hard"), calibration_ids=ids)
    assert not torch.allclose(logits(model, ids, mask)[mask.bool()], expected[mask.bool()], atol=1e-4)


def test_generate_matches_unmodified_greedy_output(family):
    model = tiny_model(family, seed=0)
    prompt, mask = padded_batch(model.config.vocab_size, seed=1)
    kwargs = dict(attention_mask=mask, max_new_tokens=12, do_sample=False, pad_token_id=0)
    expected = model.generate(prompt, **kwargs)
    apply_focus(model, FocusConfig(window=64, mode="hard"), calibration_ids=prompt)
    assert torch.equal(model.generate(prompt, **kwargs), expected)


ROUTINGS = {  # the routing designs, as FocusConfig changes
    "key": {},
    "query": {"route_queries": "query"},
    "query-unrotated": {"route_queries": "query", "unrotate": True},
}


@pytest.mark.parametrize("routing", list(ROUTINGS))
@pytest.mark.parametrize("mode", ["soft", "hard"])
def test_kv_cache_decoding_equals_full_recompute(mode, routing):
    """Cached keys keep their groups: step-by-step decoding sees what a full forward pass sees."""
    model = tiny_model("llama", seed=0)
    ids, _ = padded_batch(model.config.vocab_size)
    config = FocusConfig(window=3, num_groups=4, top_k=1, mode=mode, **ROUTINGS[routing])
    apply_focus(model, config, calibration_ids=ids)
    ids = ids[:1]
    full = logits(model, ids, None)
    with torch.no_grad():
        out = model(input_ids=ids[:, :10], use_cache=True)
        steps, cache = [out.logits], out.past_key_values
        for t in range(10, LENGTH):
            out = model(input_ids=ids[:, t : t + 1], past_key_values=cache, use_cache=True)
            steps.append(out.logits)
            cache = out.past_key_values
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("routing", ["query", "query-unrotated"])
def test_every_family_runs_each_routing_and_padded_rows_equal_unpadded_ones(family, routing, one_thread):
    """A left-padded row gives what the same tokens give alone: the positions of padded keys (unrotate) and the
    per-query-head groups (route_queries) are right under padding, in every architecture."""
    model = tiny_model(family, seed=0)
    ids, mask = padded_batch(model.config.vocab_size)
    apply_focus(model, FocusConfig(window=3, num_groups=4, top_k=1, mode="hard", **ROUTINGS[routing]),
                calibration_ids=ids)
    positions = (mask.cumsum(-1) - 1).clamp_min(0)  # as generate() numbers a left-padded row
    with torch.no_grad():
        batch = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits
        alone = model(input_ids=ids[1:, 5:]).logits
    torch.testing.assert_close(batch[1, 5:], alone[0], atol=1e-4, rtol=1e-4)


def test_unrotated_routing_ignores_where_a_text_stands():
    """Shifting every position leaves the first layer's routing logits unchanged with unrotate (its keys are the
    token embeddings' projections, turned by position) and changes them without."""
    model = tiny_model("llama", seed=0)
    ids, _ = padded_batch(model.config.vocab_size)
    apply_focus(model, FocusConfig(window=3, num_groups=4, route_queries="query", unrotate=True), calibration_ids=ids)
    first = attention_modules(model)[0]
    traced = {}
    for unrotate in (True, False):
        set_focus_mode(model, "hard", unrotate=unrotate)
        for shift in (0, 37):
            first.focus_trace = []
            with torch.no_grad():
                model(input_ids=ids[:1], position_ids=torch.arange(LENGTH)[None] + shift)
            traced[unrotate, shift] = first.focus_trace[0]
    del first.focus_trace
    torch.testing.assert_close(traced[True, 0], traced[True, 37], atol=1e-4, rtol=1e-4)
    assert not torch.allclose(traced[False, 0], traced[False, 37], atol=1e-2)


def test_undo_rotary_inverts_the_models_rotary_embedding():
    model = tiny_model("qwen2", seed=0)
    from transformers.models.qwen2.modeling_qwen2 import apply_rotary_pos_emb

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 11, model.config.head_dim, generator=gen)
    positions = torch.arange(11)[None].repeat(2, 1) + torch.tensor([[0], [400]])
    cos, sin = model.model.rotary_emb(x, positions)
    rotated, _ = apply_rotary_pos_emb(x, x, cos, sin)
    torch.testing.assert_close(undo_rotary(rotated, positions, model.model.rotary_emb.inv_freq), x, atol=1e-5, rtol=1e-4)


def test_gpt2_has_no_rotation_to_undo(caplog):
    model = tiny_model("gpt2", seed=0)
    with caplog.at_level("INFO", logger="focus.retrofit"):
        apply_focus(model, FocusConfig(num_groups=4, route_queries="query", unrotate=True), init_centroids=False)
    assert "no rotary embedding to undo" in caplog.text


def test_adapters_written_before_query_routing_load_as_key_routed(tmp_path):
    model = tiny_model("llama", seed=0)
    apply_focus(model, FocusConfig(num_groups=4, window=3), init_centroids=False)
    save_focus(model, tmp_path)
    record = json.loads((tmp_path / "focus_config.json").read_text())
    for added in ("route_queries", "unrotate", "gate"):  # as an adapter of focus 0.1.0 wrote it
        del record["focus_config"][added]
    (tmp_path / "focus_config.json").write_text(json.dumps(record))
    fresh = tiny_model("llama", seed=0)
    load_focus(fresh, tmp_path)
    config = focus_config(fresh)
    assert (config.route_queries, config.unrotate, config.gate) == ("key", False, "overlap")


def test_only_centroids_train_and_remove_restores_the_model_exactly():
    model = tiny_model("qwen2", seed=0)
    model.lm_head.weight.requires_grad_(False)  # a flag apply/remove must give back as it was
    flags = {n: p.requires_grad for n, p in model.named_parameters()}
    ids, mask = padded_batch(model.config.vocab_size)
    expected = logits(model, ids, mask)
    state = copy.deepcopy(model.state_dict())
    apply_focus(model, FocusConfig(window=3, num_groups=4), calibration_ids=ids)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all(n.endswith("focus_centroids") for n in trainable)
    assert len(trainable) == model.config.num_hidden_layers
    loss = model(input_ids=ids, attention_mask=mask, labels=ids).loss
    loss.backward()
    torch.optim.SGD(focus_parameters(model), lr=1.0).step()
    remove_focus(model)
    assert {n: p.requires_grad for n, p in model.named_parameters()} == flags
    assert model.state_dict().keys() == state.keys()
    assert all(torch.equal(model.state_dict()[k], v) for k, v in state.items())
    assert torch.equal(logits(model, ids, mask), expected)


def test_a_frozen_focus_model_multiplies_the_last_position_without_copying_the_output_weights():
    """A prompt's last position reaches the output embeddings as a view with the prompt's strides, which
    torch.matmul multiplies through bmm with the weight copied once the weight is frozen (as apply_focus freezes it).
    The Focus model's output embeddings take it as one matrix product; remove_focus takes the hook away."""
    from torch.profiler import ProfilerActivity, profile

    model = tiny_model("llama", seed=0)
    ids, mask = padded_batch(model.config.vocab_size)
    weight = tuple(model.get_output_embeddings().weight.shape[::-1])

    def weight_copies() -> int:
        with torch.no_grad(), profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            model(input_ids=ids, attention_mask=mask, logits_to_keep=1)
        return sum(e.name == "aten::bmm" and tuple(e.input_shapes[1][-2:]) == weight for e in prof.events())

    model.requires_grad_(False)
    assert weight_copies() == 1  # the quirk itself, on the frozen unmodified model
    model.requires_grad_(True)
    with torch.no_grad():
        expected = model(input_ids=ids, attention_mask=mask, logits_to_keep=1).logits
    apply_focus(model, FocusConfig(window=LENGTH), calibration_ids=ids)  # nothing pruned: the same logits
    assert weight_copies() == 0
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=ids, attention_mask=mask, logits_to_keep=1).logits, expected)
    remove_focus(model)
    assert not model.get_output_embeddings()._forward_pre_hooks


def test_parameter_counts():
    with torch.device("meta"):  # GPT-2 124M shape (12 layers x 12 heads x 64 dims), no weights needed
        gpt2 = GPT2LMHeadModel(GPT2Config())
    apply_focus(gpt2, FocusConfig(num_groups=16), init_centroids=False)
    assert focus_parameter_count(gpt2) == 12 * 12 * 16 * 64 == 147_456  # the paper's "148K"
    tiny = tiny_model("llama")
    apply_focus(tiny, FocusConfig(num_groups=8, shared_centroids=True), init_centroids=False)
    assert focus_parameter_count(tiny) == tiny.config.num_hidden_layers * 8 * tiny.config.head_dim


@pytest.mark.parametrize("design", [{}, {"route_queries": "query", "unrotate": True, "gate": "neutral"}], ids=str)
def test_adapter_round_trip_reproduces_logits(tmp_path, design):
    model = tiny_model("mistral", seed=0)
    ids, mask = padded_batch(model.config.vocab_size)
    apply_focus(model, FocusConfig(window=3, num_groups=4, mode="hard", **design), calibration_ids=ids)
    with torch.no_grad():
        for p in focus_parameters(model):
            p.add_(torch.randn_like(p))  # as if trained: not what k-means would give again
    expected = logits(model, ids, mask)
    save_focus(model, tmp_path / "adapter", base_model="tiny-mistral")
    files = sorted(p.name for p in (tmp_path / "adapter").iterdir())
    assert files == ["focus_centroids.safetensors", "focus_config.json"]
    config_text = (tmp_path / "adapter" / "focus_config.json").read_text()
    assert '"base_model": "tiny-mistral"' in config_text and '"git_commit"' in config_text

    fresh = tiny_model("mistral", seed=0)
    load_focus(fresh, tmp_path / "adapter")
    assert focus_config(fresh) == focus_config(model)
    assert torch.equal(logits(fresh, ids, mask), expected)


def test_loading_onto_a_different_shape_fails_clearly(tmp_path):
    model = tiny_model("llama", seed=0)
    apply_focus(model, FocusConfig(num_groups=4))
    save_focus(model, tmp_path)
    other = tiny_model("gpt2", seed=0)
    with pytest.raises(ValueError, match="this model needs"):
        load_focus(other, tmp_path)
    with pytest.raises(FileNotFoundError, match="no Focus adapter"):
        load_focus(other, tmp_path / "missing")


def test_bad_input_gets_one_clear_error():
    model = tiny_model("llama")
    with pytest.raises(ValueError, match="unsupported architecture Linear"):
        apply_focus(torch.nn.Linear(2, 2), FocusConfig())
    apply_focus(model, FocusConfig(num_groups=4))
    with pytest.raises(ValueError, match="already has Focus"):
        apply_focus(model, FocusConfig())
    with pytest.raises(ConfigError, match="top_k"):
        set_focus_mode(model, "hard", top_k=5)
    with pytest.raises(ConfigError, match="unknown FocusConfig key 'windw'"):
        FocusConfig.from_dict({"windw": 3})
    with pytest.raises(ConfigError, match="window must be int"):
        FocusConfig.from_dict({"window": "3"})
    with pytest.raises(ConfigError, match="num_groups must be >= 1"):
        FocusConfig(num_groups=0)
    with pytest.raises(ConfigError, match="window must be >= 0"):
        FocusConfig(window=-1)
    with pytest.raises(ConfigError, match="route_queries='query' needs window >= 1"):
        FocusConfig(window=0, route_queries="query")
    with pytest.raises(ConfigError, match="unrotate needs route_on='key'"):
        FocusConfig(route_on="value", route_queries="key", unrotate=True)
    with pytest.raises(ConfigError, match="route_queries='query' needs route_on='key'.*set route_queries='key'"):
        FocusConfig(route_on="value")
    with pytest.raises(ConfigError, match="gate must be one of"):
        FocusConfig(gate="sigmoid")
