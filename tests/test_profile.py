"""Pipeline profiles: the shipped ones resolve; each kind of bad profile is one ConfigError line naming the key."""

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from focus.config import ConfigError
from focus.pipeline.methods import method_kind, method_variant, parse_peer_name, peer_name
from focus.pipeline.microbenchmarks import microbenchmark_script
from focus.pipeline.profile import resolve_profile, with_base

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = yaml.safe_load((ROOT / "workflow" / "schemas" / "config.schema.yaml").read_text())


def tiny():
    return yaml.safe_load((ROOT / "configs" / "tiny.yaml").read_text())


def test_tiny_profile_resolves_every_model_variant_and_method():
    profile = resolve_profile(tiny(), SCHEMA)
    assert profile["results"] == "results/tiny"
    assert profile["methods"] == ["pretrained", "full_finetune", "focus-soft", "focus-hard"]
    smollm2 = profile["models"]["smollm2"]
    assert smollm2["variants"]["focus"]["window"] == 128 and smollm2["variants"]["focus"]["sink_tokens"] == 1
    assert smollm2["centroids"]["steps"] == 30 and smollm2["centroids"]["lr"] == 1e-2
    # The baseline inherits the model's own budget and overrides only the learning rate.
    gpt2 = profile["models"]["tiny-gpt2"]
    assert gpt2["centroids"]["steps"] == 10
    assert gpt2["full_finetune"]["steps"] == 10 and gpt2["full_finetune"]["lr"] == 3e-5
    # Random weights are scored on one corpus; the real model on every corpus the profile scores.
    assert gpt2["domains"] == ["books"] and "domains" not in smollm2  # absent where not narrowed: hashes stay


def test_validating_a_profile_imports_neither_torch_nor_transformers():
    """Snakemake validates the profile whenever it starts (a dry run, a reviewer's single rule): a fifth of a second,
    where importing torch and transformers would add about four."""
    code = (
        "import sys, yaml\n"
        "from focus.pipeline.profile import resolve_profile\n"
        f"resolve_profile(yaml.safe_load(open({str(ROOT / 'configs' / 'tiny.yaml')!r})), "
        f"yaml.safe_load(open({str(ROOT / 'workflow' / 'schemas' / 'config.schema.yaml')!r})))\n"
        "print(sorted(name for name in ('torch', 'transformers', 'pandas') if name in sys.modules))"
    )
    environ = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    result = subprocess.run([sys.executable, "-c", code], env=environ, capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]", result.stdout


def test_paper_profile_resolves_with_hub_access(monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    paper = yaml.safe_load((ROOT / "configs" / "paper.yaml").read_text())
    profile = resolve_profile(paper, SCHEMA)
    assert {"gpt2", "llama-3.1-8b", "mistral-7b", "qwen2.5-1.5b", "gemma-2-2b"} <= set(profile["models"])
    assert profile["models"]["llama-3.1-70b"]["gpus"] == 8 and profile["models"]["gpt2"]["gpus"] == 1
    assert profile["models"]["llama-3.1-70b"]["eval_gpus"] == 4 and profile["models"]["gpt2"]["eval_gpus"] == 1
    # The tiny profile asks for no GPU (a CPU partition runs it), unless a model or the profile says otherwise.
    tiny = yaml.safe_load((ROOT / "configs" / "tiny.yaml").read_text())
    assert {spec["gpus"] for spec in resolve_profile(tiny, SCHEMA)["models"].values()} == {0}
    tiny["models"]["smollm2"]["eval_gpus"] = 2
    smollm2 = resolve_profile({**tiny, "gpus": 1}, SCHEMA)["models"]["smollm2"]
    assert (smollm2["gpus"], smollm2["eval_gpus"]) == (1, 2)


def test_evaluation_profile_resolves_the_lora_grid_and_the_methods_of_each_stage():
    profile = resolve_profile(yaml.safe_load((ROOT / "configs" / "tiny-eval.yaml").read_text()), SCHEMA)
    grid = ["lora_r4_lr1e-4", "lora_r4_lr1e-3", "lora_r16_lr1e-4", "lora_r16_lr1e-3"]
    assert list(profile["lora"]["grid"]) == grid and profile["lora"]["grid"]["lora_r16_lr1e-3"]["alpha"] == 32
    peers = ["quest@0.21", "clusters@0.19", "streaming@0.25"]
    assert profile["models"]["smollm2"]["methods"] == ["pretrained", "focus-soft", "focus-hard", *grid, *peers]
    assert profile["harness"]["methods"] == ["pretrained", "focus-soft", "focus-hard", *grid]  # peers: no lm-eval
    assert profile["long_context"]["methods"] == ["pretrained", "focus-soft", "focus-hard", *peers]


def test_long_context_modes_leave_the_soft_mode_out_of_the_long_context_stages_alone():
    """`long_context.modes: [hard]` (configs/no_worse_test.yaml): the pass-key and long perplexity score the hard
    model only, perplexity at 512 both modes; unset, the key stays out of the resolved profile (its hash unchanged)."""
    config = yaml.safe_load((ROOT / "configs" / "tiny-eval.yaml").read_text())
    assert "modes" not in resolve_profile(config, SCHEMA)["long_context"]
    config["long_context"]["modes"] = ["hard"]
    profile = resolve_profile(config, SCHEMA)
    assert profile["long_context"]["methods"] == ["pretrained", "focus-hard", "quest@0.21", "clusters@0.19",
                                                  "streaming@0.25"]
    assert {"focus-soft", "focus-hard"} <= set(profile["models"]["smollm2"]["methods"])
    config["long_context"]["modes"] = ["dense"]
    with pytest.raises(ConfigError, match="long_context.modes"):
        resolve_profile(config, SCHEMA)


def test_peers_run_hard_under_the_first_variants_window_with_their_selector_and_budget():
    config = tiny()
    config["variants"] = {"w64": {"window": 64}, "w256": {"window": 256}}
    config["peers"] = {"models": ["smollm2"], "selectors": ["quest@0.3", "streaming@0"]}
    profile = resolve_profile(config, SCHEMA)
    assert profile["peers"] == {"models": ["smollm2"], "methods": ["quest@0.3", "streaming@0"]}
    smollm2, gpt2 = profile["models"]["smollm2"], profile["models"]["tiny-gpt2"]
    quest = smollm2["peers"]["quest@0.3"]
    assert (quest["selector"], quest["budget"], quest["mode"], quest["window"]) == ("quest", 0.3, "hard", 64)
    assert smollm2["peers"]["streaming@0"]["budget"] == 0
    assert smollm2["methods"][-2:] == ["quest@0.3", "streaming@0"]
    assert "peers" not in gpt2 and not any("@" in method for method in gpt2["methods"])
    assert method_variant("quest@0.3") is None and method_kind("quest@0.3") == "peer"
    assert parse_peer_name(peer_name("clusters", 0.25)) == ("clusters", 0.25)


def test_a_variant_with_adapter_of_reuses_a_trained_adapter_changed_at_inference_and_trains_nothing():
    """`adapter_of`: the trained variant's FocusConfig with the settings that need no training changed; no training
    of its own; scored hard only; peers may pair against it; resolved only where a profile has one (hashes)."""
    config = tiny()
    config["variants"] = {"top2": {"window": 64, "distill": 1.0}, "top2_at_top1": {"adapter_of": "top2", "top_k": 1}}
    config["peers"] = {"models": ["smollm2"], "selectors": ["quest@0.3"], "routers": ["top2", "top2_at_top1"]}
    profile = resolve_profile(config, SCHEMA)
    assert profile["evaluated"] == {"top2_at_top1": {"adapter_of": "top2", "changes": {"top_k": 1}}}
    assert profile["methods"] == ["pretrained", "full_finetune", "top2-soft", "top2-hard", "top2_at_top1-hard"]
    smollm2 = profile["models"]["smollm2"]
    trained, evaluated = smollm2["variants"]["top2"], smollm2["variants"]["top2_at_top1"]
    assert evaluated == {**trained, "top_k": 1} and trained["top_k"] == 2 and evaluated["distill"] == 1.0
    assert list(smollm2["training"]) == ["top2"]
    assert profile["peers"]["routers"] == ["top2", "top2_at_top1"]
    assert "evaluated" not in resolve_profile(tiny(), SCHEMA)


def test_study_profile_resolves_its_designs_and_the_splits_they_are_chosen_on():
    profile = resolve_profile(yaml.safe_load((ROOT / "configs" / "study.yaml").read_text()), SCHEMA)
    variants = profile["models"]["smollm2"]["variants"]
    assert variants["key_routing"]["route_queries"] == "key" and variants["query"]["route_queries"] == "query"
    assert variants["query_unrotated"]["unrotate"] and variants["query_neutral"]["gate"] == "neutral"
    assert variants["query_neutral_w256"]["window"] == 256 and variants["query_neutral_t005"]["temperature"] == 0.05
    assert profile["models"]["smollm2"]["centroids"]["steps"] == 300  # 10x the tiny profile's budget
    assert profile["perplexity"]["validation_domains"] == ["books"]  # WikiText-2 has no validation split here
    assert profile["study"] == {"model": "smollm2", "baseline": "key_routing", "domain": "books"}
    screen = profile["recall_screen"]  # part 4's oracle test: the straight-through groups at their own pattern
    assert screen["routers"] == {"straight": "variant:query_unrotated_straight"}
    assert screen["ppl_routers"] == ["straight"] and screen["ppl_shares"] == [] and screen["ppl_rows"] == 32
    assert resolve_profile(tiny(), SCHEMA)["perplexity"]["splits"] == ["test"]  # the default: test only


def test_routers_profile_trains_the_indexer_and_screens_it_beside_the_untrained_routers():
    path = ROOT / "configs" / "routers.yaml"
    profile = resolve_profile(with_base(yaml.safe_load(path.read_text()), [path.parent]), SCHEMA)
    indexer = profile["models"]["smollm2"]["variants"]["indexer32"]
    assert (indexer["selector"], indexer["indexer_rank"], indexer["route_queries"]) == ("indexer", 32, "kv_head")
    assert indexer["objective"] == "attention_recall" and indexer["mode"] == "hard"
    assert profile["train"]["seq_len"] == 2048  # the chosen router trains on rows of 2K (docs/routers.md)
    screen = profile["recall_screen"]
    assert screen["model"] == "smollm2" and screen["split"] == "validation" and screen["keys"] == [256, 1024, 2048]
    assert screen["routers"]["indexer32"] == "variant:indexer32" and 8192 in screen["lengths"]
    assert (screen["ppl_shares"], screen["ppl_keys"]) == ([0.3, 0.5], [2048])  # 50%: what 2K book text needs
    assert screen["ppl_routers"] == ["loki32", "indexer32_512", "indexer32"]
    short = profile["models"]["smollm2"]["training"]["indexer32_512"]  # the same router on rows of 512
    assert short["rows"]["seq_len"] == 512 and short["centroids"]["batch_size"] == 4
    assert resolve_profile(tiny(), SCHEMA).get("recall_screen") is None


def test_a_variant_trains_on_its_own_rows_corpus_and_budget():
    """A variant's `train` changes reach only its training job: row length, corpus mixture, TrainConfig; the others
    keep the profile's `train`."""
    config = tiny()
    config["data"]["domains"]["nonfiction"] = ["train", "test"]
    config["variants"] = {"focus": {}, "long": {"window": 64, "train": {
        "seq_len": 1024, "broad": "nonfiction", "broad_share": 0.5, "centroids": {"batch_size": 1, "steps": 7}}}}
    smollm2 = resolve_profile(config, SCHEMA)["models"]["smollm2"]
    base, long = smollm2["training"]["focus"], smollm2["training"]["long"]
    assert base["rows"]["seq_len"] == 512 and base["centroids"] == smollm2["centroids"] and base["broad"] is None
    assert long["rows"]["seq_len"] == 1024 and long["rows"]["broad_share"] == 0.5 and long["broad"] == "nonfiction"
    assert (long["centroids"]["batch_size"], long["centroids"]["steps"], long["centroids"]["lr"]) == (1, 7, 1e-2)
    assert smollm2["variants"]["long"]["window"] == 64 and "train" not in smollm2["variants"]["long"]


def test_the_no_worse_screen_is_a_profile_of_its_designs():
    """benchmarks/no_worse_screen.py's designs as variants: FocusConfig fields and training changes apart, every
    design on the same tokens (the 2K-row ones half the steps of one row)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("no_worse_screen", ROOT / "benchmarks" / "no_worse_screen.py")
    screen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(screen)
    DESIGNS = screen.DESIGNS  # noqa: N806 (the screen's name for them)
    path = ROOT / "configs" / "no_worse.yaml"
    profile = resolve_profile(with_base(yaml.safe_load(path.read_text()), [path.parent]), SCHEMA)
    smollm2 = profile["models"]["smollm2"]
    assert list(smollm2["variants"]) == list(DESIGNS)
    for name, design in DESIGNS.items():
        focus, training = smollm2["variants"][name], smollm2["training"][name]
        assert focus["distill"] == design.get("distill", 0.0) and focus["window"] == design.get("window", 128)
        assert (focus["num_groups"], focus["top_k"]) == (design.get("num_groups", 16), design.get("top_k", 2))
        assert training["rows"].get("broad_share", 0) == design.get("broad_share", 0)
        assert training["rows"]["retrieval_share"] == design.get("retrieval_share", 0.25)
        rows = training["rows"]["seq_len"] * training["centroids"]["batch_size"] * training["centroids"]["steps"]
        assert training["rows"]["seq_len"] == design.get("seq_len", 512) and rows == 300 * 2 * 512
    assert profile["study"]["baseline"] == "base" and smollm2["gpus"] == 1


def test_the_forgetting_screen_is_a_profile_of_every_row_it_scored():
    """configs/forgetting.yaml's trained variants are the adapters of
    benchmarks/results/forgetting_screen_validation.csv, each at the window it was trained at (its first row) and with
    the dense heads it was trained with; each later row of an adapter (dense heads or a window changed after training)
    is a variant with `adapter_of` that adapter, at that row's window and dense heads."""
    import pandas as pd

    screen = pd.read_csv(ROOT / "benchmarks" / "results" / "forgetting_screen_validation.csv").fillna(
        {"select": "", "dense_heads": ""})
    screen = screen[screen["adapter"] != "pretrained"]
    path = ROOT / "configs" / "forgetting.yaml"
    profile = resolve_profile(with_base(yaml.safe_load(path.read_text()), [path.parent]), SCHEMA)
    smollm2, evaluated = profile["models"]["smollm2"], profile["evaluated"]
    first = screen.groupby("adapter", sort=False).first()
    assert list(smollm2["training"]) == list(first.index)
    for name, row in first.iterrows():
        focus = smollm2["variants"][name]
        assert focus["window"] == row["window"], name
        heads = row["dense_heads"].split() if row["select"] == "trained" and row["dense"] else []
        assert list(focus["dense_heads"]) == heads, name
    later = screen[screen.duplicated("adapter")]
    scored = {(spec["adapter_of"], smollm2["variants"][name]["window"], " ".join(sorted(
        smollm2["variants"][name]["dense_heads"]))) for name, spec in evaluated.items()}
    assert scored == {(row.adapter, row.window, " ".join(sorted(row.dense_heads.split())))
                      for row in later.itertuples()}
    assert len(evaluated) == len(later) == 6
    assert smollm2["training"]["st300"]["rows"]["retrieval_share"] == 0 and smollm2["gpus"] == 1


def test_a_profile_includes_its_base_mappings_merged_its_own_values_first(tmp_path):
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "root.yaml").write_text("dtype: float16\ntrain: {seq_len: 64, domain: books}\n")
    (tmp_path / "base" / "mid.yaml").write_text("include: root.yaml\ntrain: {seq_len: 128, eval_rows: 2}\n"
                                                 "perplexity: {domains: [books]}\n")
    top = {"include": "base/mid.yaml", "train": {"eval_rows": 0}, "perplexity": {"domains": [], "batch_size": 1}}
    assert with_base(top, [tmp_path]) == {"dtype": "float16", "train": {"seq_len": 128, "domain": "books",
                                                                        "eval_rows": 0},
                                          "perplexity": {"domains": [], "batch_size": 1}}
    with pytest.raises(ConfigError, match="include: 'nowhere.yaml' is in none of"):
        with_base({"include": "nowhere.yaml"}, [tmp_path])


def test_a_microbenchmarks_entry_names_its_script_and_the_tag_its_table_is_named_by():
    assert microbenchmark_script("indexer_step") == ("indexer_step", None)
    assert microbenchmark_script("speed_anchors_fp32") == ("speed_anchors", "fp32")
    assert microbenchmark_script("profile_focus_native_top2") == ("profile_focus", "native_top2")


def test_method_variant():
    assert method_variant("pretrained") is None and method_variant("full_finetune") is None
    assert method_variant("focus-hard") == ("focus", "hard")
    assert method_variant("g32_w128-soft") == ("g32_w128", "soft")
    with pytest.raises(ValueError, match="unknown method 'focus-medium'"):
        method_variant("focus-medium")


def _broken(change):
    config = tiny()
    change(config)
    return config


BAD = {
    "unknown top-level key": (lambda c: c.update(modles={}), "Additional properties are not allowed ('modles'"),
    "wrong type": (lambda c: c["train"].update(seq_len="512"), "train.seq_len: '512' is not of type 'integer'"),
    "unknown FocusConfig key": (lambda c: c["focus"].update(windw=3), "unknown FocusConfig key 'windw'"),
    "bad FocusConfig value": (lambda c: c["focus"].update(top_k=99), "FocusConfig.top_k (99) must be <= num_groups"),
    "bad TrainConfig value": (lambda c: c["train"]["centroids"].update(lr=-1.0), "TrainConfig.lr must be"),
    "a learning rate YAML read as a string": (
        lambda c: c["train"]["centroids"].update(yaml.safe_load("lr: 1e-2")),
        "TrainConfig.lr must be float, got str '1e-2' (YAML reads 1e-2 as a string; write 1.0e-2 for the number 0.01)",
    ),
    "a LoRA learning rate YAML read as a string": (
        lambda c: c.update(lora=yaml.safe_load("{ranks: [4], lrs: [1e-4]}")),
        "lora.lrs.0: '1e-4' is not of type 'number' (YAML reads 1e-4 as a string; write 1.0e-4 for the number 0.0001)",
    ),
    "infinite temperature": (lambda c: c["focus"].update(temperature=float("inf")),
                             "FocusConfig.temperature must be a finite number > 0, got inf"),
    "unknown tiny family": (lambda c: c["models"]["smollm2"].update(source="tiny:bert"), "unknown tiny model family"),
    "unknown model": (lambda c: c["models"]["smollm2"].update(source="no-such-model"), "unknown model 'no-such-model'"),
    "missing split": (lambda c: c["data"]["domains"].pop("wikitext2"),
                      "data.domains.wikitext2: the profile needs split 'test'"),
    "benchmark of an unknown model": (lambda c: c["benchmark"].update(model="gpt9"),
                                      "benchmark.model: 'gpt9' is not one of this profile's models"),
    "benchmark setting with top_k > groups": (lambda c: c["benchmark"].update(settings=[[2, 64, 3]]),
                                              "benchmark.settings: FocusConfig.top_k (3) must be <= num_groups (2)"),
    "reserved variant name": (lambda c: c.update(variants={"pretrained": {}}), "variants"),
    "variant name taken by the LoRA grid": (lambda c: c.update(variants={"lora_r4": {}}), "variants"),
    "LoRA of an unknown model": (lambda c: c.update(lora={"models": ["gpt9"], "ranks": [4], "lrs": [1e-4]}),
                                 "lora.models: 'gpt9' is not one of this profile's models"),
    "unknown lm-eval task": (lambda c: c.update(harness={"tasks": ["mmlu"]}), "harness.tasks.0: 'mmlu' is not one of"),
    "long context on a corpus without a test split": (
        lambda c: c.update(long_context={"domain": "wikitext2", "context_lengths": [1024]})
        or c["data"]["domains"].update(wikitext2=["validation"]) or c["perplexity"].update(domains=["books"]),
        "data.domains.wikitext2: long_context needs split 'test'",
    ),
    "negative gpus": (lambda c: c["models"]["smollm2"].update(gpus=-1), "models.smollm2.gpus: -1 is less than the minimum"),
    "negative evaluation gpus": (lambda c: c.update(eval_gpus=-1), "eval_gpus: -1 is less than the minimum"),
    "study baseline that is no variant": (
        lambda c: c.update(study={"baseline": "nope", "domain": "books"}) or c["perplexity"].update(
            splits=["validation", "test"]),
        "study.baseline: 'nope' is not one of the variants",
    ),
    "study on a domain scored on test only": (
        lambda c: c.update(study={"baseline": "focus", "domain": "books"}),
        "study.domain: 'books' must be a perplexity domain scored on its validation split",
    ),
    "study of an unknown model": (
        lambda c: c.update(study={"model": "gpt9", "baseline": "focus", "domain": "books"}),
        "study.model: 'gpt9' is not one of this profile's models",
    ),
    "training longer than a model's positions": (
        lambda c: c["train"].update(seq_len=4096),
        "models.tiny-gpt2: train.seq_len 4096 exceeds the model's 2048 positions (max_position_embeddings)",
    ),
    "long context beyond a model's positions": (
        lambda c: c.update(long_context={"models": ["smollm2"], "domain": "books", "context_lengths": [1024, 16384]}),
        "models.smollm2: long_context.context_lengths 16384 exceeds the model's 8192 positions",
    ),
    "needle beyond a model's positions": (
        lambda c: c.update(long_context={"models": ["tiny-qwen2"], "domain": "books", "context_lengths": [512],
                                         "needle": {"lengths": [4096], "depths": [0.5], "trials": 1}}),
        "models.tiny-qwen2: long_context.needle.lengths 4096 exceeds the model's 2048 positions",
    ),
    "batch not shared equally by the gpus": (
        lambda c: c["models"]["smollm2"].update(gpus=3),
        "models.smollm2.centroids.batch_size (2) must be a multiple of models.smollm2.gpus (3)",
    ),
    "peer with an unknown selector": (lambda c: c.update(peers={"selectors": ["quest@0.3", "oracle@0.3"]}),
                                      "peers.selectors oracle@0.3: FocusConfig.selector must be one of"),
    "peer that is the trained router": (lambda c: c.update(peers={"selectors": ["centroids@0.3"]}),
                                        "peers.selectors centroids@0.3: 'centroids' is the trained router"),
    "peers paired against no variant": (lambda c: c.update(peers={"selectors": ["quest@0.3"], "routers": ["nope"]}),
                                        "peers.routers: ['nope'] name no variant of this profile"),
    "long context on a second corpus without a test split": (
        lambda c: c.update(long_context={"domain": "books", "domains": ["books", "wikitext2"], "context_lengths": [512]})
        or c["data"]["domains"].update(wikitext2=["validation"]) or c["perplexity"].update(domains=["books"]),
        "data.domains.wikitext2: long_context needs split 'test'",
    ),
    "pass-key of a method the long-context stages do not score": (
        lambda c: c.update(long_context={"domain": "books", "context_lengths": [512], "modes": ["hard"], "needle": {
            "lengths": [512], "depths": [0.5], "trials": 1, "methods": ["focus-soft"]}}),
        "long_context.needle.methods: ['focus-soft'] are not among the long-context methods",
    ),
    "long context on validation without a validation split": (
        lambda c: c.update(long_context={"domain": "wikitext2", "split": "validation", "context_lengths": [512]})
        or c["data"]["domains"].update(wikitext2=["test"]),
        "data.domains.wikitext2: long_context needs split 'validation'",
    ),
    "RULER of a method the long-context stages do not score": (
        lambda c: c.update(long_context={"domain": "books", "context_lengths": [512], "modes": ["hard"], "ruler": {
            "tasks": ["niah_single_1"], "lengths": [512], "limit": 1, "methods": ["pretrained", "focus-soft"]}}),
        "long_context.ruler.methods: ['focus-soft'] are not among the long-context methods",
    ),
    "peer budget above one": (lambda c: c.update(peers={"selectors": ["quest@1.5"]}),
                              "peers.selectors quest@1.5: FocusConfig.budget must be in [0, 1], got 1.5"),
    "peer without a budget": (lambda c: c.update(peers={"selectors": ["quest"]}),
                              "peers.selectors.0: 'quest' does not match"),
    "peers of an unknown model": (lambda c: c.update(peers={"models": ["gpt9"], "selectors": ["quest@0.3"]}),
                                  "peers.models: 'gpt9' is not one of this profile's models"),
    "screen of a variant the profile lacks": (
        lambda c: c.update(recall_screen={"domains": ["books"], "lengths": [512], "routers": {"a": "variant:nope"}}),
        "recall_screen.routers.a: 'variant:nope' names no variant of this profile",
    ),
    "screen of a corpus without its split": (
        lambda c: c.update(recall_screen={"domains": ["wikitext2"], "lengths": [512], "routers": {"q": "quest"}}),
        "recall_screen.domains: 'wikitext2' needs its 'validation' split",
    ),
    "screen perplexity of a router it does not screen": (
        lambda c: c.update(recall_screen={"domains": ["books"], "lengths": [512], "routers": {"q": "quest"},
                                          "ppl_routers": ["loki"]}),
        "recall_screen.ppl_routers: 'loki' is not one of its routers ['q']",
    ),
    "screen perplexity on rows and on tokens at once": (
        lambda c: c.update(recall_screen={"domains": ["books"], "lengths": [512], "routers": {"q": "quest"},
                                          "ppl_rows": 4, "ppl_tokens": 4096}),
        "recall_screen: give ppl_rows (rows at every length) or ppl_tokens (tokens at every length), not both",
    ),
    "screen router spec the screen cannot build": (
        lambda c: c.update(recall_screen={"domains": ["books"], "lengths": [512], "routers": {"x": "oracle"}}),
        "recall_screen.routers.x: 'oracle' does not match",
    ),
    "variant training on an unknown key": (
        lambda c: c.update(variants={"v": {"train": {"rows": 3}}}),
        "variants.v.train: Additional properties are not allowed ('rows' was unexpected)",
    ),
    "variant training on a split the data lacks": (
        lambda c: c.update(variants={"v": {"train": {"domain": "wikitext2"}}}),
        "data.domains.wikitext2: the profile needs split 'train'; list it there",
    ),
    "variant window over its own training row": (
        lambda c: c.update(variants={"v": {"window": 100, "train": {"seq_len": 64}}}),
        "models.smollm2 variant v: focus.window (100) must be < train.seq_len (64)",
    ),
    "microbenchmark of a script benchmarks/ has not as a rule": (
        lambda c: c.update(microbenchmarks={"recall_screen": {}}),
        "microbenchmarks: 'recall_screen' is not a script of benchmarks/ that rule microbenchmark runs",
    ),
    "microbenchmark of a tagged script without its tag": (
        lambda c: c.update(microbenchmarks={"speed_anchors": {}}),
        "microbenchmarks: 'speed_anchors' is not a script of benchmarks/ that rule microbenchmark runs (indexer_step, "
        "indexer_prompt, indexer_generate, train_step, matrix_units, flex_attention, speed_anchors_<tag>, "
        "profile_focus_<tag>)",
    ),
    "decoding benchmark timing a variant the profile has not": (
        lambda c: c.update(benchmark={"lengths": [64], "settings": [[4, 16, 1]], "model": "smollm2",
                                      "decode": {"cache_lengths": [64], "settings": [[4, 16, 1]], "variant": "x"}}),
        "benchmark.decode.variant: 'x' names no trained variant of this profile ['focus']",
    ),
    "microbenchmark timing a variant the profile has not": (
        lambda c: c.update(microbenchmarks={"indexer_generate": {"adapter": "indexer"}}),
        "microbenchmarks.indexer_generate.adapter: 'indexer' names no variant of this profile ['focus']",
    ),
    "microbenchmark prompts from a corpus without validation": (
        lambda c: c.update(microbenchmarks={"indexer_generate": {"tokens": "wikitext2"}}),
        "microbenchmarks.indexer_generate.tokens: 'wikitext2' needs its validation split",
    ),
    "model scored on a corpus the profile does not score": (
        lambda c: c["models"]["smollm2"].update(domains=["books", "books_by_book"]),
        "models.smollm2.domains: ['books_by_book'] are not in perplexity.domains ['books', 'wikitext2', 'nonfiction']",
    ),
    "peers of a model scored on fewer corpora": (
        lambda c: c.update(peers={"models": ["tiny-qwen2"], "selectors": ["quest@0.3"]}),
        "models.tiny-qwen2.domains: peers compares it on every perplexity domain; leave its domains out",
    ),
    "study of a model scored on fewer corpora": (
        lambda c: c.update(study={"model": "tiny-qwen2", "baseline": "focus", "domain": "books"})
        or c["perplexity"].update(splits=["validation", "test"]),
        "models.tiny-qwen2.domains: study compares it on every perplexity domain; leave its domains out",
    ),
    "adapter_of an unknown variant": (
        lambda c: c.update(variants={"a": {}, "b": {"adapter_of": "c", "top_k": 1}}),
        "variants.b.adapter_of: 'c' names no trained variant of this profile ['a']",
    ),
    "adapter_of a variant that is not trained": (
        lambda c: c.update(variants={"a": {}, "b": {"adapter_of": "a", "top_k": 1}, "c": {"adapter_of": "b"}}),
        "variants.c.adapter_of: 'b' names no trained variant of this profile ['a']",
    ),
    "adapter_of changing what needs a training": (
        lambda c: c.update(variants={"a": {}, "b": {"adapter_of": "a", "num_groups": 8, "train": {"seq_len": 64}}}),
        "variants.b: ['num_groups', 'train'] need a training of their own; a variant with adapter_of changes only",
    ),
    "adapter_of as the first variant": (
        lambda c: c.update(variants={"b": {"adapter_of": "a"}, "a": {}}),
        "variants.b.adapter_of: the first variant is the profile's main design and is trained",
    ),
    "decode timing of an untrained variant": (
        lambda c: c.update(variants={"a": {}, "b": {"adapter_of": "a", "top_k": 1}})
        or c["benchmark"].update(decode={**c["benchmark"].get("decode", {}), "variant": "b"}),
        "benchmark.decode.variant: 'b' names no trained variant of this profile ['a']",
    ),
    "window over the whole training row": (
        lambda c: c["focus"].update(window=512),
        "models.smollm2 variant focus: focus.window (512) must be < train.seq_len (512): a window over the whole row",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_profiles_fail_with_one_line_naming_the_key(case):
    change, expected = BAD[case]
    with pytest.raises(ConfigError) as info:
        resolve_profile(_broken(change), SCHEMA)
    message = str(info.value)
    assert expected in message and "\n" not in message


def test_missing_data_names_where_it_looked(tmp_path):
    config = tiny()
    config["data"]["mirror"] = str(tmp_path)
    (tmp_path / "MANIFEST.json").write_text("{}")  # a mirror, but an empty one
    with pytest.raises(ConfigError, match=f"data.domains.books: books split 'train' not found: .*{tmp_path}"):
        resolve_profile(config, SCHEMA)


def test_offline_hub_model_not_in_cache_is_refused(monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    config = copy.deepcopy(tiny())
    config["models"]["smollm2"]["source"] = "nobody/not-a-cached-model"
    with pytest.raises(ConfigError, match="not in the local hub cache and HF_HUB_OFFLINE=1"):
        resolve_profile(config, SCHEMA)


def test_the_packaged_models_position_limit_is_read_without_converting_it(tmp_path, monkeypatch):
    from focus.sources import PACKAGED_SMOLLM2, position_limit

    monkeypatch.setenv("FOCUS_CACHE", str(tmp_path))  # nothing converted here: the GGUF's metadata answers
    assert position_limit(PACKAGED_SMOLLM2) == 8192
    assert not any(tmp_path.iterdir())
    assert position_limit("nobody/not-a-cached-model") is None  # unknowable offline: the jobs check it


@pytest.mark.parametrize("config, limit", [
    ({"model_type": "llama", "max_position_embeddings": 4096}, 4096),
    ({"model_type": "gpt2", "n_positions": 1024}, 1024),  # GPT-2's name for it
    ({"model_type": "gemma3", "text_config": {"max_position_embeddings": 131072}}, 131072),  # the text model's
    ({"model_type": "mystery"}, None),  # not stated: the jobs check it once the model is loaded
])
def test_a_saved_folders_position_limit_is_read_from_its_config_json(tmp_path, config, limit):
    from focus.sources import position_limit

    (tmp_path / "config.json").write_text(json.dumps(config))
    assert position_limit(tmp_path) == limit
