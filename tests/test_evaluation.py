"""The evaluation stages: lm-eval on a live Focus model, LoRA adapters, the needle check, the claims report."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pandas as pd
import pytest
import torch
from safetensors.torch import save_file
from test_recall import untrained_job

from focus import FocusConfig, apply_focus, set_focus_mode
from focus.artifacts import markdown_table
from focus.data import find_mirror
from focus.eval.harness import run_tasks, write_mirror_tasks
from focus.eval.needle import needle_trials
from focus.models import load_model, tiny_model
from focus.pipeline.jobs import TrainingJob
from focus.pipeline.methods import lora_name, method_variant, parse_lora_name
from focus.pipeline.stages import evaluate_benchmarks, load_method, train_lora
from focus.report.claims import BEYOND_THE_PAPER, CLAIMS, FAILS, HOLDS, UNTESTED, judge_claims
from focus.report.figures import plot_figures
from focus.report.peers import peers_frame, write_peers
from focus.report.tables import training_frame
from focus.train.config import TrainConfig

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture(scope="module")
def tasks(tmp_path_factory):
    if find_mirror() is None:
        pytest.skip("no data mirror (../shared/data)")
    folder = tmp_path_factory.mktemp("tasks")
    write_mirror_tasks(folder)
    return folder


def _loglikelihoods(samples: dict[str, list[dict]]) -> torch.Tensor:
    return torch.tensor([float(resp[0][0]) for task in sorted(samples) for doc in samples[task] for resp in doc["resps"]])


@pytest.mark.parametrize("mode", ["soft", "hard"])
def test_lm_eval_with_focus_window_beyond_every_prompt_equals_the_plain_model(tasks, monkeypatch, mode):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model, tokenizer = load_model("tiny:llama")
    names = ["arc_easy", "truthfulqa_mc1", "hellaswag"]
    plain_metrics, plain = run_tasks(model, tokenizer, names, tasks, limit=4, batch_size=4)
    assert plain_metrics["hellaswag"] == {"skipped": "not in the data mirror and the hub is offline"}
    assert plain_metrics["arc_easy"]["documents"] == 4 and 0 <= plain_metrics["arc_easy"]["acc"] <= 1

    apply_focus(model, FocusConfig(num_groups=4, window=4096, top_k=1))  # longer than any prompt here
    set_focus_mode(model, mode)
    focus_metrics, focus = run_tasks(model, tokenizer, names, tasks, limit=4, batch_size=4)
    assert focus_metrics == plain_metrics
    torch.testing.assert_close(_loglikelihoods(focus), _loglikelihoods(plain), atol=1e-4, rtol=1e-5)

    set_focus_mode(model, mode, window=8)  # shorter than every prompt: now Focus must change the scores
    _, narrow = run_tasks(model, tokenizer, names, tasks, limit=4, batch_size=4)
    assert (_loglikelihoods(narrow) - _loglikelihoods(plain)).abs().max() > 1e-3


def test_chat_template_wraps_truthfulqa_prompts(tasks, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model, tokenizer = load_model("tiny:llama")
    _, samples = run_tasks(model, tokenizer, ["truthfulqa_mc2"], tasks, limit=1, chat_template=True)
    context = samples["truthfulqa_mc2"][0]["arguments"][0][0]
    assert context.startswith("<|im_start|>system") and context.rstrip().endswith("<|im_start|>assistant")
    assert "Q: What is human life expectancy" in context  # the stock 6-shot preamble, inside the user turn


def test_a_base_model_without_chat_template_scores_chat_tasks_as_plain_completions(tasks, tmp_path, monkeypatch,
                                                                                   tiny_tokenizer):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    tiny_model("llama").save_pretrained(tmp_path / "base")
    tiny_tokenizer.save_pretrained(tmp_path / "base")  # no chat template, like GPT-2's
    record = evaluate_benchmarks(str(tmp_path / "base"), "float32", "pretrained", [], ["truthfulqa_mc1"],
                                 tmp_path / "record.json", tmp_path / "samples", limit=1, batch_size=1)
    assert record["tasks"]["truthfulqa_mc1"]["chat_template"] is False
    context = json.loads((tmp_path / "samples" / "truthfulqa_mc1.jsonl").read_text())["arguments"][0][0]
    assert context.startswith("Q: What is human life expectancy")


def test_lora_names_round_trip_and_are_not_focus_methods():
    for rank, lr in ((4, 1e-4), (16, 3e-4), (64, 1e-3), (8, 2.5e-5)):
        name = lora_name(rank, lr)
        assert re.fullmatch(r"lora_r\d+_lr[\d.]+e-\d+", name)
        assert parse_lora_name(name) == (rank, pytest.approx(lr))
        assert method_variant(name) is None
    assert lora_name(8, 1e-4) == "lora_r8_lr1e-4"
    assert parse_lora_name("focus-hard") is None


def test_lora_stage_writes_a_peft_adapter_that_reloads(tmp_path):
    tokens = tmp_path / "tokens.safetensors"
    generator = torch.Generator().manual_seed(0)
    save_file({"train": torch.randint(3, 4000, (16 * 64,), generator=generator, dtype=torch.int32),
               "validation": torch.randint(3, 4000, (4 * 64,), generator=generator, dtype=torch.int32)}, str(tokens))
    train = TrainConfig(steps=3, batch_size=2, lr=1e-2, log_every=1, checkpoint_every=0)
    job = TrainingJob(tokens, 64, train, tmp_path / "metrics.jsonl", tmp_path / "summary.json", calibration_rows=2,
                      eval_rows=2, progress=False)
    with pytest.raises(ValueError, match="retrieval rows need the Focus window"):  # the default mixes them in
        train_lora("tiny:llama", "float32", 4, 8.0, ["q_proj", "v_proj"], 0.0, job, tmp_path / "adapter")
    assert not (tmp_path / "adapter").exists()
    summary = train_lora("tiny:llama", "float32", 4, 8.0, ["q_proj", "v_proj"], 0.0, job, tmp_path / "adapter",
                         retrieval_window=8)
    assert summary["train_rows"] == 14 + 5 and summary["retrieval"] == {"share": 0.25, "weight": 5.0}  # a quarter
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert config["r"] == 4 and config["lora_alpha"] == 8 and sorted(config["target_modules"]) == ["q_proj", "v_proj"]
    assert (tmp_path / "adapter" / "adapter_model.safetensors").is_file()
    assert summary["final"]["step"] == 3

    from peft import PeftModel

    base, _ = load_model("tiny:llama")
    # Only the adapters trained: A (r x in) and B (out x r) on every q_proj and v_proj.
    expected = sum(4 * (m.in_features + m.out_features) for name, m in base.named_modules() if name.endswith(("q_proj", "v_proj")))
    assert summary["trainable_parameters"] == expected
    reloaded = PeftModel.from_pretrained(base, str(tmp_path / "adapter"))
    b_weights = [p for n, p in reloaded.named_parameters() if "lora_B" in n]
    assert b_weights and all(p.abs().max() > 0 for p in b_weights)  # trained: B starts at zero
    merged, _ = load_method("tiny:llama", "float32", lora_name(4, 1e-2), tmp_path / "adapter")
    plain, _ = load_model("tiny:llama")
    ids = torch.randint(3, 4000, (1, 32))
    with torch.no_grad():
        torch.testing.assert_close(merged(ids).logits, reloaded(input_ids=ids).logits, atol=1e-5, rtol=1e-5)
        assert (merged(ids).logits - plain(ids).logits).abs().max() > 1e-4


def test_needle_prompts_are_exactly_the_requested_length(tmp_path):
    model, tokenizer = load_model("tiny:llama")
    filler = torch.randint(3, 4000, (5000,), generator=torch.Generator().manual_seed(0))
    seen = []
    forward = model.forward

    def spy(*args, **kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        seen.append(ids.shape[1])
        return forward(*args, **kwargs)

    model.forward = spy
    records = needle_trials(model, tokenizer, filler, [128, 256], [0.0, 1.0], trials=2, progress=False)
    assert len(records) == 2 * 2 * 2 and {r["length"] for r in records} == {128, 256}
    assert all(len(r["key"]) == 5 and isinstance(r["correct"], bool) and r["key_logprob"] < 0 for r in records)
    assert 128 in seen and 256 in seen  # the generate call's prompt
    deep, shallow = (r for r in records if r["length"] == 256 and r["trial"] == 0)
    assert deep["distance"] > shallow["distance"]  # depth 0: the needle is as far from the question as it gets
    model.forward = forward
    with pytest.raises(ValueError, match="exceeds llama's 2048 positions"):
        needle_trials(model, tokenizer, filler, [4096], [0.5], trials=1, progress=False)


# ---- the claims report ---------------------------------------------------------------------------------------


def _paper_claims() -> list[tuple[str, str]]:
    for folder in (ROOT.parent / "shared", ROOT / "shared"):
        if (folder / "PAPER.md").is_file():
            text = (folder / "PAPER.md").read_text()
            table = text.split("## The claims, as numbers")[1].split("\n## ")[0]
            rows = [line.strip().strip("|").split("|") for line in table.splitlines() if line.startswith("|")]
            return [(claim.strip(), paper.strip()) for claim, paper in rows[2:]]  # header and rule skipped
    pytest.skip("PAPER.md not found beside the repository")


def test_tables_print_unmeasured_cells_as_a_dash_and_counts_as_integers():
    # The long-context table spans every context length, but the needle is tested at only some of them.
    frame = pd.DataFrame({"method": ["pretrained", "focus-hard"], "tokens": [16384, 256], "1024": [0.8333, float("nan")]})
    rows = [[cell.strip() for cell in line.split("|")[1:-1]] for line in markdown_table(frame, ".4g").splitlines()[2:]]
    assert rows == [["pretrained", "16384", "0.8333"], ["focus-hard", "256", "—"]]


def test_claims_report_lists_every_claim_of_the_paper():
    paper = _paper_claims()
    assert len(paper) == 8
    assert [(c.claim, c.paper) for c in CLAIMS] == paper
    frame = judge_claims({"main_model": "m", "train_domain": "books"})  # nothing measured
    assert list(frame["claim"]) == [claim for claim, _ in paper] + [claim.claim for claim in BEYOND_THE_PAPER]
    assert (frame["verdict"] == UNTESTED).all()


def test_a_claim_on_the_training_domain_is_untested_where_that_domain_was_not_scored():
    """configs/speed.yaml trains on the novels and scores WikiText-2 alone: its speed is measured, its domain not."""
    ppl = pd.DataFrame({"model": ["m"] * 4, "domain": ["wikitext2"] * 4, "perplexity": [31.0, 34.0, 31.6, 30.0],
                        "method": ["pretrained", "focus-soft", "focus-hard", "full_finetune"]})
    prefill = pd.DataFrame({"length": [4096, 8192], "top_k": [1, 1], "speedup": [1.2, 1.5]})
    verdicts = judge_claims({"main_model": "m", "train_domain": "books", "perplexity": ppl,
                             "speed_prefill": prefill}).set_index("claim")["verdict"]
    assert verdicts["hard top-k inference"] == verdicts["124M model, domain perplexity"] == UNTESTED
    assert verdicts["downstream benchmarks after retrofit"] == FAILS  # (judged on the other domain, as measured)


def _perplexity_records(folder: Path, shifts: dict[str, dict[str, float]], kept: dict[str, float]) -> list[Path]:
    """Perplexity records of one model on two domains: pretrained's window NLLs, each method's shifted per domain
    (with a little per-window noise, so that paired intervals have a width)."""
    base = [3.0 + 0.1 * i for i in range(8)]
    paths = []
    for method, by_domain in {"pretrained": {"books": 0.0, "wikitext2": 0.0}, **shifts}.items():
        for domain, shift in by_domain.items():
            nll = [value + shift + 0.001 * len(method) * (-1) ** i for i, value in enumerate(base)]
            record = {"model": "m", "domain": domain, "method": method, "window_nll": nll,
                      "perplexity": float(torch.tensor(nll).mean().exp()), "distant_kept": kept.get(method)}
            paths.append(folder / f"{method}_{domain}.json")
            paths[-1].write_text(json.dumps(record))
    return paths


def test_peers_table_pairs_each_peer_with_the_trained_router_on_the_same_windows(tmp_path):
    shifts = {"focus-hard": {"books": 0.01, "wikitext2": 0.02}, "quest@0.3": {"books": 0.03, "wikitext2": 0.05},
              "focus-soft": {"books": 0.0, "wikitext2": 0.0}}
    records = _perplexity_records(tmp_path, shifts, {"focus-hard": 0.3, "quest@0.3": 0.31})
    frame = write_peers(records, "focus-hard", tmp_path / "peers.csv", tmp_path / "peers.png", "books", "wikitext2")
    assert sorted(zip(frame["domain"], frame["design"], frame["kind"])) == [
        ("books", "focus-hard", "trained"), ("books", "quest@0.3", "peer"),
        ("wikitext2", "focus-hard", "trained"), ("wikitext2", "quest@0.3", "peer")]  # not the soft mode
    quest = frame.set_index(["design", "domain"]).loc[("quest@0.3", "wikitext2")]
    assert quest["against_router"] == pytest.approx(math.expm1(0.03))  # the NLL gap, per window
    assert quest["against_router_low"] < quest["against_router"] < quest["against_router_high"]
    assert quest["change"] == pytest.approx(math.expm1(0.05)) and quest["distant_kept"] == 0.31
    assert "+3.05% [" in (tmp_path / "peers.md").read_text() and (tmp_path / "peers.png").stat().st_size > 10_000


def test_peers_table_pairs_every_design_with_each_router_at_each_length(tmp_path):
    """`peers.routers`: a second router (a lower budget) is a design paired against the first and a reference for
    every peer; records at a second context length (the long-context stages') make cells of their own."""
    shifts = {"focus-hard": {"books": 0.01, "wikitext2": 0.02}, "top1-hard": {"books": 0.04, "wikitext2": 0.06},
              "quest@0.1": {"books": 0.05, "wikitext2": 0.09}}
    kept = {"focus-hard": 0.3, "top1-hard": 0.1, "quest@0.1": 0.1}
    (tmp_path / "long").mkdir()
    records = []
    for folder, length in ((tmp_path, 512), (tmp_path / "long", 2048)):  # (the same windows at both: only the cells)
        for path in _perplexity_records(folder, shifts, kept):
            path.write_text(json.dumps({**json.loads(path.read_text()), "context_length": length}))
            records.append(path)
    frame = write_peers(records, ["focus-hard", "top1-hard"], tmp_path / "peers.csv", None, "books", "wikitext2")
    pairs = frame.set_index(["context_length", "domain", "design", "router"])
    assert len(frame) == 2 * 2 * 4  # lengths x domains x (each router against the other, the peer against both)
    assert pairs.loc[(2048, "wikitext2", "quest@0.1", "top1-hard"), "against_router"] == pytest.approx(math.expm1(0.03))
    assert pairs.loc[(512, "books", "top1-hard", "focus-hard"), "against_router"] == pytest.approx(math.expm1(0.03))
    table = (tmp_path / "peers.md").read_text()
    assert "against focus-hard (95%)" in table and "against top1-hard (95%)" in table
    assert len([line for line in table.splitlines() if "| quest@0.1" in line]) == 4  # one row per cell, not per pair


@pytest.mark.parametrize(("quest_books", "verdict"), [(0.03, HOLDS), (0.005, FAILS)])
def test_learned_router_verdict_compares_peers_at_its_budget(tmp_path, quest_books, verdict):
    shifts = {"focus-hard": {"books": 0.01, "wikitext2": 0.02},
              "quest@0.3": {"books": quest_books, "wikitext2": 0.05},
              "streaming@0": {"books": 0.5, "wikitext2": 0.5}}  # loses with a third of the pairs: says nothing
    kept = {"focus-hard": 0.30, "quest@0.3": 0.29, "streaming@0": 0.1}
    peers = peers_frame(_perplexity_records(tmp_path, shifts, kept), "focus-hard")
    claim = "a learned router beats training-free selection at the same budget"
    row = judge_claims({"main_model": "m", "train_domain": "books", "peers": peers}).set_index("claim").loc[claim]
    assert row["verdict"] == verdict and "focus-hard keeps 30% of distant pairs" in row["setting"]
    assert f"smallest margin quest@0.3 on books {math.expm1(quest_books - 0.01):+.2%} [" in row["ours"]
    assert "streaming@0 (kept 10%) +61.6% at worst" in row["ours"]


@pytest.mark.parametrize(("streaming_kept", "verdict"), [(0.1, FAILS), (0.5, UNTESTED)])
def test_a_peer_that_wins_refutes_the_router_only_with_no_more_pairs(tmp_path, streaming_kept, verdict):
    shifts = {"focus-hard": {"books": 0.01, "wikitext2": 0.02}, "quest@0.3": {"books": 0.03, "wikitext2": 0.05},
              "streaming@0.5": {"books": 0.0, "wikitext2": 0.03}}  # better than the router on the books
    kept = {"focus-hard": 0.30, "quest@0.3": 0.30, "streaming@0.5": streaming_kept}
    peers = peers_frame(_perplexity_records(tmp_path, shifts, kept), "focus-hard")
    claim = "a learned router beats training-free selection at the same budget"
    row = judge_claims({"main_model": "m", "train_domain": "books", "peers": peers}).set_index("claim").loc[claim]
    assert row["verdict"] == verdict
    assert ("streaming@0.5 wins with more pairs than focus-hard" in row["ours"]) == (verdict == UNTESTED)


@pytest.mark.parametrize(("wikitext2", "verdict"), [(20.09, HOLDS), (20.5, FAILS)])
def test_no_degradation_counts_perplexity_on_text_the_centroids_never_saw(wikitext2, verdict):
    """Off the training domain hard Focus must stay within +0.5% of pretrained; the training domain does not count."""
    ppl = pd.DataFrame({"model": "m", "method": ["pretrained", "focus-hard", "focus-soft"] * 2,
                        "domain": ["wikitext2"] * 3 + ["books"] * 3,
                        "perplexity": [20.0, wikitext2, 25.0, 30.0, 35.0, 29.0]})
    training = pd.DataFrame({"model": ["m", "m", "other"], "variant": ["full_finetune", "focus", "focus"],
                             "steps": [30, 300, 10], "tokens": [30720, 307200, 10240]})
    row = judge_claims({"main_model": "m", "train_domain": "books", "perplexity": ppl, "training": training}
                       ).set_index("claim").loc["downstream benchmarks after retrofit"]
    assert row["verdict"] == verdict and f"wikitext2 {wikitext2 / 20 - 1:+.1%} (focus-hard)" in row["ours"]
    assert "trained on books, centroids trained on 307,200 tokens (300 steps), no worse" in row["setting"]  # its budget


@pytest.mark.parametrize("eval_rows", [2, 0])  # 0: the routing screens', whose recall screen scores the rows
def test_the_training_table_and_loss_curves_take_a_run_of_no_steps(tmp_path, eval_rows):
    _, job, summary = untrained_job(tmp_path, eval_rows)
    row = training_frame([job.summary]).iloc[0]
    assert row["steps"] == 0 and row["train_loss"] is None
    assert row["eval_loss"] == summary["final"].get("eval/loss") and (row["eval_loss"] is None) == (eval_rows == 0)
    perplexity = tmp_path / "perplexity.csv"
    perplexity.write_text("model,source,method,domain,perplexity,change,change_low,change_high\n"
                          "tiny,tiny:llama,pretrained,books,9.0,,,\ntiny,tiny:llama,kmeans-hard,books,9.9,0.1,0.0,0.2\n")
    plot_figures([job.metrics], perplexity, tmp_path / "loss_curves.png", tmp_path / "perplexity.png")
    assert (tmp_path / "loss_curves.png").stat().st_size > 0


def test_a_variant_that_trained_no_step_is_judged_on_nothing():
    """Untrained k-means groups (`steps: 0`, a routing screen) are no evidence about trained centroids: a profile of
    them alone tests no claim, and beside a trained variant only the trained one is judged."""
    ppl = pd.DataFrame({"model": "m", "method": ["pretrained", "kmeans-hard", "kmeans-soft", "focus-hard"],
                        "domain": "wikitext2", "perplexity": [20.0, 21.0, 22.0, 20.05]})
    training = pd.DataFrame({"model": "m", "variant": ["kmeans", "focus"], "steps": [0, 300], "tokens": [None, 307200],
                             "trainable_parameters": 9, "frozen_unchanged": True})
    results = {"main_model": "m", "train_domain": "books", "perplexity": ppl}
    alone = judge_claims({**results, "perplexity": ppl[:3], "training": training[:1]}).set_index("claim")["verdict"]
    assert set(alone) == {UNTESTED}
    both = judge_claims({**results, "training": training}).set_index("claim")
    assert both.loc["downstream benchmarks after retrofit", "verdict"] == HOLDS  # focus-hard +0.25%, not kmeans +5%
    assert "(focus-hard)" in both.loc["downstream benchmarks after retrofit", "ours"]
    assert "for 1 of 1 trainings" in both.loc["retrofit, centroid-only training, frozen weights", "setting"]


@pytest.mark.parametrize(("unchanged", "verdict"), [([True, True], HOLDS), ([True, False], FAILS),
                                                    ([None, None], UNTESTED)])
def test_retrofit_verdict_comes_from_the_frozen_weights_checksums(unchanged, verdict):
    training = pd.DataFrame({"model": ["m", "tiny"], "variant": ["focus", "focus"], "trainable_parameters": [9, 4],
                             "frozen_unchanged": unchanged})
    full = pd.DataFrame({"model": ["m"], "variant": ["full_finetune"], "trainable_parameters": [100],
                         "frozen_unchanged": [None]})  # trains every weight: nothing frozen to check
    frame = judge_claims({"main_model": "m", "train_domain": "books", "training": pd.concat([training, full])})
    row = frame.set_index("claim").loc["retrofit, centroid-only training, frozen weights"]
    assert row["verdict"] == verdict
    if verdict == FAILS:
        assert "changed: tiny" in row["setting"]


def test_a_centroid_training_leaves_the_frozen_weights_checksum_as_it_was(tmp_path):
    from focus.distributed import frozen_checksum
    from focus.train.config import TrainConfig
    from focus.train.loop import train_parameters

    model = apply_focus(tiny_model("llama", seed=0), FocusConfig(num_groups=4, window=4))
    before = frozen_checksum(model)
    train_parameters(model, torch.randint(0, 100, (8, 24)), TrainConfig(steps=3, batch_size=2, lr=1e-1), tmp_path,
                     progress=False)
    assert frozen_checksum(model) == before
    with torch.no_grad():
        model.model.layers[0].mlp.up_proj.weight[0, 0] += 1e-3  # one weight, barely moved
    assert frozen_checksum(model) != before


def _bench(values: dict[str, tuple[float, float]], task="truthfulqa_mc1", model="m") -> pd.DataFrame:
    rows = []
    for method, (value, stderr) in values.items():
        kind = "lora" if method.startswith("lora_") else ("pretrained" if method == "pretrained" else "focus-hard")
        rows.append({"model": model, "method": method, "kind": kind, "task": task, "value": value, "stderr": stderr,
                     "documents": 100, "chat_template": True})
    return pd.DataFrame(rows)


@pytest.mark.parametrize(
    ("values", "verdict"),
    [
        ({"pretrained": (0.40, 0.02), "focus-hard": (0.39, 0.02), "lora_r4_lr1e-4": (0.35, 0.02)}, HOLDS),
        ({"pretrained": (0.40, 0.02), "focus-hard": (0.30, 0.02), "lora_r4_lr1e-4": (0.35, 0.02)}, FAILS),  # Focus loses
        ({"pretrained": (0.40, 0.02), "focus-hard": (0.40, 0.02), "lora_r4_lr1e-4": (0.41, 0.02)}, FAILS),  # LoRA keeps
    ],
)
def test_alignment_verdict_follows_its_rule(values, verdict):
    frame = judge_claims({"main_model": "m", "train_domain": "books", "truthfulqa": _bench(values)})
    assert frame.set_index("claim").loc["alignment", "verdict"] == verdict


def test_alignment_is_judged_on_the_model_the_lora_grid_trained():
    # A base model (no LoRA cells) on which Focus loses TruthfulQA must not decide the instruction-tuned model's verdict.
    base = _bench({"pretrained": (0.30, 0.02), "focus-hard": (0.10, 0.02)}, model="base")
    tuned = _bench({"pretrained": (0.40, 0.02), "focus-hard": (0.39, 0.02), "lora_r4_lr1e-4": (0.35, 0.02)}, model="tuned")
    frame = judge_claims({"main_model": "base", "train_domain": "b", "truthfulqa": pd.concat([base, tuned])})
    row = frame.set_index("claim").loc["alignment"]
    assert row["verdict"] == HOLDS and row["setting"].startswith("tuned, chat template")


def test_zero_degradation_verdict_allows_noise_and_reports_prompt_coverage():
    within = _bench({"pretrained": (0.50, 0.05), "focus-hard": (0.45, 0.05)}, task="arc_easy")
    lengths = pd.DataFrame({"task": ["arc_easy", "truthfulqa_mc1"], "share_focus_differs": [0.25, 1.0]})
    row = judge_claims({"main_model": "m", "train_domain": "b", "benchmarks": within, "prompt_lengths": lengths}).iloc[1]
    assert row["verdict"] == HOLDS and "25% of prompts" in row["ours"]
    beyond = _bench({"pretrained": (0.50, 0.01), "focus-hard": (0.40, 0.01)}, task="arc_easy")
    assert judge_claims({"main_model": "m", "train_domain": "b", "benchmarks": beyond}).iloc[1]["verdict"] == FAILS


def _ruler(values: dict[str, tuple[float, float]]) -> pd.DataFrame:
    """A RULER table: one task at two lengths, {kind: (score, stderr)} at both."""
    return pd.DataFrame([
        {"model": "m", "method": kind, "kind": kind, "task": "niah_single_1", "context_length": length,
         "value": value, "stderr": stderr, "documents": 4}
        for kind, (value, stderr) in values.items() for length in (1024, 2048)
    ])


def test_zero_degradation_is_judged_on_ruler_long_prompts_too():
    claim = "downstream benchmarks after retrofit"
    short = _bench({"pretrained": (0.50, 0.05), "focus-hard": (0.50, 0.05)}, task="arc_easy")
    within = _ruler({"pretrained": (1.0, 0.0), "focus-hard": (0.75, 0.25)})
    row = judge_claims({"main_model": "m", "train_domain": "b", "ruler": within}).set_index("claim").loc[claim]
    assert row["verdict"] == HOLDS and "RULER focus-hard -0.25 mean Δscore" in row["ours"]
    assert row["setting"] == "RULER 1 tasks at 1024/2048 tokens, 4 docs each"
    beyond = _ruler({"pretrained": (1.0, 0.0), "focus-hard": (0.25, 0.25)})  # short prompts alike, long ones not
    results = {"main_model": "m", "train_domain": "b", "benchmarks": short, "ruler": beyond}
    row = judge_claims(results).set_index("claim").loc[claim]
    assert row["verdict"] == FAILS and row["setting"].startswith("1 tasks, zero-shot, 100 docs each; RULER")


def test_hub_only_tasks_are_skipped_at_once_when_the_hub_does_not_answer(monkeypatch):
    from huggingface_hub import constants

    from focus.eval.harness import hub_unavailable

    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # nothing listens on the discard port
    assert hub_unavailable().startswith("not in the data mirror and the hub is unreachable")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert hub_unavailable() == "not in the data mirror and the hub is offline"


@pytest.mark.parametrize(("focus", "full", "verdict"), [((13.82, 0.1), (13.89, 0.1), HOLDS), ((15.0, 0.1), (13.9, 0.2), FAILS),
                                                        ((13.9, None), (13.8, None), FAILS)])
def test_from_scratch_verdict_reads_the_scratch_summary(focus, full, verdict):
    def method(mean, std):
        return {"mean": mean, "std": std, "seeds": {0: mean} if std is None else {0: mean - std, 1: mean + std}}

    scratch = {"setting": "s", "methods": {"focus": method(*focus), "full": method(*full)}}
    row = judge_claims({"main_model": "m", "train_domain": "b", "scratch": scratch}).iloc[3]
    assert row["claim"] == "trained from scratch, 7B on 2B tokens" and row["verdict"] == verdict


@pytest.mark.parametrize(("wikitext2", "of_oracle", "verdict"), [(0.0, 0.97, HOLDS), (0.02, 0.97, FAILS),
                                                                  (0.02, 0.90, UNTESTED)])
def test_a_router_at_the_oracles_recall_must_be_no_worse(tmp_path, wikitext2, of_oracle, verdict):
    from focus.report.tables import perplexity_frame

    records = _perplexity_records(tmp_path, {"idx-hard": {"books": 0.0, "wikitext2": wikitext2}}, {})
    screen = pd.DataFrame({"corpus": "wikitext2", "length": 512, "router": "idx", "budget_kind": "share",
                           "spec": "adapter:results/r/train/m/idx/adapter", "budget": [0.1, 0.3, 0.5],
                           "of_oracle": [0.9, of_oracle, 0.99]})
    claim = "a router that reaches the oracle's recall is no worse at <= 30% of the distant pairs"
    row = judge_claims({"main_model": "m", "train_domain": "books", "recall_screen": screen,
                        "perplexity": perplexity_frame(records)}).set_index("claim").loc[claim]
    assert row["verdict"] == verdict
    if verdict != UNTESTED:
        assert f"idx: {of_oracle:.1%} of the oracle's mass at 30% of the distant keys" in row["setting"]
        assert ("worse beyond the noise: idx-hard on wikitext2" in row["ours"]) == (verdict == FAILS)


@pytest.mark.parametrize(("low", "kept", "verdict"), [(-0.001, 0.27, HOLDS), (0.002, 0.27, FAILS),
                                                      (0.002, 0.45, HOLDS)])
def test_the_screens_long_perplexity_joins_the_oracle_recall_verdict(tmp_path, low, kept, verdict):
    """The screen's perplexity of the router at 8K and 2,048 keys per query counts where those keys keep at most 30%
    (+2%) of the distant pairs: worse beyond the noise there fails the claim; at a larger share it is not asked."""
    from focus.report.tables import perplexity_frame

    records = _perplexity_records(tmp_path, {"idx-hard": {"books": 0.0, "wikitext2": 0.0}}, {})
    screen = pd.DataFrame({"corpus": "wikitext2", "length": [512, 512, 8192], "router": "idx",
                           "budget_kind": ["share", "share", "keys"], "spec": "adapter:results/r/train/m/idx/adapter",
                           "budget": [0.1, 0.3, 2048], "of_oracle": [0.9, 0.97, 0.97], "kept": [0.1, 0.3, kept]})
    long = pd.DataFrame({"corpus": ["wikitext2"], "length": [8192], "router": ["idx"], "budget": [2048],
                         "budget_kind": ["keys"], "vs_pretrained": [low + 0.001], "low": [low], "high": [low + 0.002]})
    claim = "a router that reaches the oracle's recall is no worse at <= 30% of the distant pairs"
    row = judge_claims({"main_model": "m", "train_domain": "books", "recall_screen": screen,
                        "recall_screen_perplexity": long, "perplexity": perplexity_frame(records)}
                       ).set_index("claim").loc[claim]
    assert row["verdict"] == verdict
    assert ("idx at 8192, 2048 keys, on wikitext2" in row["ours"]) == (kept < 0.3)
