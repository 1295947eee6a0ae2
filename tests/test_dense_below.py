"""`FocusConfig.dense_below`: queries below it attend as the unmodified model does, later ones take Focus, on every
path (the dense masked oracle, the decomposition, the native prompt, the decoding steps); training ignores it."""

import json

import pytest
import torch
from test_attention import make_inputs, make_layer, reference_with_dense_heads, run_focus
from test_decoding import decode

import focus.attention.dispatch.kernel_runs
import focus.attention.dispatch.kernel_table
import focus.attention.function
from focus import FocusConfig, apply_focus, set_focus_mode
from focus.attention.cache.decoding import CACHE_INDEX_ATTRIBUTE, FocusCache
from focus.attention.cache.group_index import GroupIndex
from focus.attention.dispatch.fast_path import fast_path
from focus.attention.pattern.reference import unmodified_attention
from focus.config import ConfigError
from focus.models import tiny_model
from focus.retrofit import focus_disabled, focus_parameters

pytestmark = pytest.mark.usefixtures("one_thread")

LENGTH, WINDOW = 37, 5
BELOW = {"inside the window": 3, "beyond the window": 20, "beyond the sequence": LENGTH + 10}


def counting(monkeypatch, name: str) -> list:
    """Counts the calls of `<name>` in `focus.attention.dispatch.kernel_runs` (a kernel) or `focus.attention.function`
    (a router): which path a call took."""
    runs = focus.attention.dispatch.kernel_runs
    module = runs if hasattr(runs, name) else focus.attention.function
    calls, original = [], getattr(module, name)

    def counted(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(module, name, counted)
    return calls


def attend(layer, below: int, path: str, inputs) -> torch.Tensor:
    """One whole-sequence call (B, H, L, D) with `dense_below=below`: through the dense masked path ("dense"), the
    decomposition ("decomposed") or a FocusCache(native=True) prompt ("native": routed and attended natively)."""
    q, key, v, mask = inputs
    layer.focus_config = layer.focus_config.replace(dense_below=below)
    if path == "native":
        config = layer.focus_config
        index = GroupIndex(q.shape[0], key.shape[1], config.num_groups, config.top_k, config.sink_tokens, q.device,
                           native=True)
        setattr(layer, CACHE_INDEX_ATTRIBUTE, index)
    with torch.no_grad(), fast_path("dense" if path == "dense" else "auto"):
        out = run_focus(layer, q, key, v, mask, scaling=0.4)
    if path == "native":
        assert index.length == LENGTH  # every key indexed, dense rows or not
    return out


PATHS = {
    # mode, path, route_queries, dense_heads
    "soft dense": ("soft", "dense", "query", []),
    "hard dense": ("hard", "dense", "query", []),
    "hard decomposed": ("hard", "decomposed", "query", []),
    "hard decomposed key routed": ("hard", "decomposed", "key", []),
    "hard decomposed dense head": ("hard", "decomposed", "kv_head", ["l0h1"]),
    "hard native": ("hard", "native", "query", []),
    "hard native kv_head": ("hard", "native", "kv_head", []),
}
WHICH_CALL = {"dense": None, "decomposed": "decomposed_hard_attention", "native": "route_prompt_natively"}


@pytest.mark.parametrize("below", BELOW.values(), ids=BELOW.keys())
@pytest.mark.parametrize("case", PATHS.values(), ids=PATHS.keys())
def test_rows_below_are_the_unmodified_attention_and_rows_from_it_focus(case, below, monkeypatch):
    mode, path, route_queries, dense = case
    config = FocusConfig(num_groups=4, top_k=2, window=WINDOW, sink_tokens=1, mode=mode, route_queries=route_queries,
                         dense_heads=dense)
    layer = make_layer(config, 2, 8)
    layer.layer_idx = 0
    inputs = make_inputs(2, 6, 2, LENGTH, 8, pads=(0, 7))
    calls = counting(monkeypatch, WHICH_CALL[path]) if WHICH_CALL[path] else []
    focus_rows = attend(layer, 0, path, inputs)
    out = attend(layer, below, path, inputs)
    if WHICH_CALL[path]:  # the path under test ran, for the call with dense rows only where Focus rows remain
        assert len(calls) == (1 if below >= LENGTH else 2)
    # (B, L, H, D), so that a (B, L) mask picks rows
    out, focus_rows, own = (t.transpose(1, 2) for t in (out, focus_rows, unmodified_attention(*inputs, 0.4, 0.0, None)))
    real = inputs[3].any(dim=-1)[:, 0]  # (B, L) real queries (a padding row's output is never read)
    below_it, from_it = real & (torch.arange(LENGTH) < below), real & (torch.arange(LENGTH) >= below)
    torch.testing.assert_close(out[below_it], own[below_it], atol=2e-6, rtol=1e-5)
    torch.testing.assert_close(out[from_it], focus_rows[from_it], atol=2e-6, rtol=1e-5)
    if below == BELOW["beyond the window"]:  # Focus changes rows beyond its window: the test tells the two apart
        assert not torch.allclose(focus_rows[below_it], own[below_it], atol=1e-3)


@pytest.mark.parametrize("chunk", [1, 5])
@pytest.mark.parametrize("step", ["sparse", "masked"])
def test_decoding_steps_and_chunks_switch_where_the_position_crosses_it(chunk, step, monkeypatch):
    """A prompt of 12, then `chunk` tokens a call through the group index: queries before 15 (steps, or part of a chunk
    that starts mid-sequence) attend as the model, later ones as Focus (the dense reference of the whole sequence)."""
    monkeypatch.setattr(focus.attention.dispatch.kernel_table, "sparse_step_pays", lambda *args: step == "sparse")
    config = FocusConfig(num_groups=4, top_k=2, window=4, sink_tokens=1, mode="hard", dense_below=15,
                         dense_heads=["l0h1"])
    layer = make_layer(config, 3, 8)
    layer.layer_idx = 0
    q, key, v, mask = make_inputs(2, 6, 3, 30, 8, pads=(0, 5))
    with torch.no_grad():
        steps, index = decode(layer, q, key, v, mask, prompt=12, chunk=chunk)
        layer.focus_config = config.replace(dense_below=0)
        focus_rows = reference_with_dense_heads(layer, q, key, v, mask, scaling=0.4)
    own = unmodified_attention(q, key, v, mask, 0.4, 0.0, None)
    expected = torch.cat([own[:, :, 12:15], focus_rows[:, :, 15:]], dim=2)
    torch.testing.assert_close(steps, expected, atol=2e-5, rtol=1e-4)
    assert index.length == 30


# ---- inside a model ----------------------------------------------------------------------------------------------

SEQUENCE, DENSE_BELOW = 20, 10
SEGMENTS = {  # how a sequence is fed through a FocusCache: (begin, end) per forward pass, then one token a pass
    "switch while decoding": [(0, 6)],
    "switch inside the prefill": [(0, 14)],
    "switch inside a chunk": [(0, 7), (7, 13)],
}


def fed(model, ids, mask, segments, cache) -> torch.Tensor:
    """Logits (B, L, V) of `ids` fed through `cache` segment by segment, then token by token (teacher forcing)."""
    last = segments[-1][1]
    segments = segments + [(t, t + 1) for t in range(last, ids.shape[1])]
    return torch.cat([model(input_ids=ids[:, b:e], attention_mask=mask[:, :e], past_key_values=cache).logits
                      for b, e in segments], dim=1)


def focus_model(family: str, **changes):
    model = tiny_model(family, seed=0)
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(3, model.config.vocab_size, (2, SEQUENCE), generator=gen)
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    apply_focus(model, FocusConfig(num_groups=4, window=4, top_k=2, mode="hard", **changes), calibration_ids=ids)
    return model, ids, mask


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_a_full_forward_and_decoding_through_a_focus_cache_switch_at_the_same_position(family, monkeypatch):
    model, ids, mask = focus_model(family)
    native_steps, native_prompts = (counting(monkeypatch, name) for name in ("native_decoding_step",
                                                                            "route_prompt_natively"))
    real = mask.bool()
    with torch.no_grad():
        focus_everywhere = model(input_ids=ids, attention_mask=mask).logits
        set_focus_mode(model, "hard", dense_below=DENSE_BELOW)
        with fast_path("dense"):
            oracle = model(input_ids=ids, attention_mask=mask).logits
        with focus_disabled(model):
            unmodified = model(input_ids=ids, attention_mask=mask).logits
        full = model(input_ids=ids, attention_mask=mask).logits  # the decomposition
        runs = {(name, compile_step): fed(model, ids, mask, segments, FocusCache(model, native=compile_step))
                for name, segments in SEGMENTS.items() for compile_step in (False, True)}
    layers = model.config.num_hidden_layers
    # Native steps from the switch on (after the 14-token prompt, after the chunk to 13, after 6 tokens), a native
    # prompt only where it reaches past the switch.
    assert len(native_steps) == layers * ((SEQUENCE - 14) + (SEQUENCE - 13) + (SEQUENCE - DENSE_BELOW))
    assert len(native_prompts) == layers
    below = real.clone()
    below[:, DENSE_BELOW:] = False
    torch.testing.assert_close(oracle[below], unmodified[below], atol=1e-5, rtol=1e-4)  # dense up to the switch
    assert not torch.allclose(oracle[real], focus_everywhere[real], atol=1e-3)  # ... and Focus after it
    torch.testing.assert_close(full[real], oracle[real], atol=1e-5, rtol=1e-4)
    for run, logits in runs.items():
        torch.testing.assert_close(logits[real], oracle[real], atol=1e-5, rtol=1e-4, msg=lambda m: f"{run}: {m}")


def test_generate_switches_where_a_full_forward_of_its_tokens_does():
    model, ids, _ = focus_model("llama", dense_below=DENSE_BELOW)
    prompt = ids[:1, :6]
    for compile_step in (False, True):
        with torch.no_grad():
            out = model.generate(prompt, past_key_values=FocusCache(model, native=compile_step), do_sample=False,
                                 max_new_tokens=12, min_new_tokens=12, output_logits=True, return_dict_in_generate=True)
            with fast_path("dense"):
                full = model(input_ids=out.sequences[:, :-1]).logits
        torch.testing.assert_close(torch.stack(out.logits, dim=1), full[:, 5:], atol=1e-5, rtol=1e-4)


def test_beyond_the_sequence_the_model_is_the_unmodified_one():
    model, ids, mask = focus_model("llama", dense_below=SEQUENCE + 1)
    real = mask.bool()
    with torch.no_grad():
        with focus_disabled(model):
            unmodified = model(input_ids=ids, attention_mask=mask).logits
        full = model(input_ids=ids, attention_mask=mask).logits
        decoded = fed(model, ids, mask, [(0, 6)], FocusCache(model, native=True))
    torch.testing.assert_close(full[real], unmodified[real], atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(decoded[real], unmodified[real], atol=1e-5, rtol=1e-4)


def test_training_the_centroids_ignores_it():
    """Straight-through training: the loss and the centroids' gradients are those without `dense_below`, whose rows
    shorter than it would otherwise train nothing."""
    model, ids, _ = focus_model("llama")  # the default objective: straight-through
    biases = [m.focus_group_bias.clone() for m in model.modules() if hasattr(m, "focus_group_bias")]

    def loss_and_gradients(below: int):
        set_focus_mode(model, "hard", dense_below=below)
        for module, bias in zip((m for m in model.modules() if hasattr(m, "focus_group_bias")), biases):
            module.focus_group_bias.copy_(bias)  # (training moves the balance bias: each run starts from the same)
        model.zero_grad()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in focus_parameters(model)]

    loss, gradients = loss_and_gradients(0)
    dense_loss, dense_gradients = loss_and_gradients(SEQUENCE + 1)
    assert torch.equal(loss, dense_loss) and all(map(torch.equal, gradients, dense_gradients))
    assert any(g.abs().sum() > 0 for g in gradients)
    with torch.no_grad():  # (outside training the setting holds: the same model is then the unmodified one)
        with focus_disabled(model):
            unmodified = model(input_ids=ids, labels=ids).loss
        torch.testing.assert_close(model(input_ids=ids, labels=ids).loss, unmodified)


def test_a_negative_setting_is_one_line_naming_it():
    with pytest.raises(ConfigError, match=r"^FocusConfig.dense_below must be >= 0, got -1$"):
        FocusConfig(dense_below=-1)
    with pytest.raises(ConfigError, match=r"^FocusConfig.dense_below must be int, got str '8'"):
        FocusConfig.from_dict({"dense_below": "8"})
    model, _, _ = focus_model("llama")
    with pytest.raises(ConfigError, match="dense_below must be >= 0"):
        set_focus_mode(model, "hard", dense_below=-4)


def test_the_commands_set_it_over_the_adapters(tmp_path, capsys):
    from focus import save_focus
    from focus.cli import main
    from focus.models import load_model

    for argv, expected in ((["--adapter", str(tmp_path), "--dense_below", "-1"], "--dense_below must be >= 0, got -1"),
                           (["--dense_below", "8"], "--dense_below needs an --adapter")):
        assert main(["generate", "--model", "tiny:llama", "--prompt", "Hi", *argv]) == 2
        error = capsys.readouterr().err
        assert error.count("\n") == 1 and expected in error, error
    model, _ = load_model("tiny:llama")
    ids = torch.randint(3, 128, (2, 24), generator=torch.Generator().manual_seed(0))
    apply_focus(model, FocusConfig(num_groups=4, window=2, top_k=1, mode="hard"), calibration_ids=ids)
    save_focus(model, tmp_path / "adapter", base_model="tiny:llama")
    generate = ["generate", "--model", "tiny:llama", "--prompt", "Once upon a time", "--max_new_tokens", "8"]
    assert main(generate) == 0
    pretrained = capsys.readouterr().out
    assert main([*generate, "--adapter", str(tmp_path / "adapter"), "--dense_below", "2048", "--kernels", "native"]) == 0
    assert capsys.readouterr().out == pretrained  # dense below every position it reaches: the pretrained tokens

    evaluate = ["eval", "--model", "tiny:llama", "--split", "validation", "--context_length", "64",
                "--max_tokens", "128"]
    assert main([*evaluate, "--output", str(tmp_path / "pretrained.json")]) == 0
    assert main([*evaluate, "--adapter", str(tmp_path / "adapter"), "--dense_below", "64", "--output",
                 str(tmp_path / "dense.json")]) == 0
    plain, dense = (json.loads((tmp_path / name).read_text()) for name in ("pretrained.json", "dense.json"))
    assert dense["perplexity"] == plain["perplexity"] and dense["focus_config"]["dense_below"] == 64  # as recorded
