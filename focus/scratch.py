"""Train a small Llama-style model from random initialisation with full attention and with Focus, and compare.

The paper's from-scratch claim (arXiv 2604.03260): a 7B model trained on 2B tokens reaches perplexity 13.82 with
Focus against 13.89 with full attention. This stage makes the same comparison at a size a CPU trains in minutes.
Per seed, both methods start from identical weights (Focus only adds centroids), train on identical batches
(`focus.training` draws the batch order from the seed and the rows alone) with the same optimizer and schedule, and
are scored on the same validation rows at the training length. Focus trains every weight and the centroids, with
soft routing (Sinkhorn-balanced groups, the soft gate on distant pairs). Validation perplexity is exp(mean next-token
loss); Focus gets two numbers, under these method names:

    full        full causal attention
    focus       Focus soft, as trained: the soft gate on every distant pair, each token routed causally by its own
                logits plus the running balance bias (training's whole-sequence Sinkhorn would look ahead)
    focus-hard  Focus hard top-k: distant pairs only between tokens sharing a group (the inference pattern)

One difference from a jointly optimised router: `focus.attention.route` detaches the routing vectors, so the
centroids learn through the gate while keys learn only through attention itself, as in the retrofit.

    train_from_scratch  one (method, seed) -> metrics.jsonl (validation loss every eval_every steps), summary.json
    summarize_scratch   every run -> table (CSV + Markdown), figure (validation curves), summary JSON for the claims
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, PreTrainedModel

from .config import ConfigError, FocusConfig, check_types, from_dict, to_dict
from .experiments import default_device, run_training, training_rows, write_training_summary
from .files import write_json, write_text
from .models import load_tokenizer
from .report import markdown_table, pyplot, save_figure
from .retrofit import apply_focus, focus_parameter_count, set_focus_mode
from .training import TrainConfig, evaluate_loss

METHODS = ("full", "focus")
EVALUATED = {"full": "full causal attention", "focus": "Focus soft (as trained)", "focus-hard": "Focus hard top-k"}
"""Method names of the results, and what attention each was evaluated with."""


@dataclass(frozen=True)
class ScratchModel:
    """Shape of the Llama-style decoder trained from scratch. The vocabulary is the tokenizer's; embeddings are tied."""

    layers: int = field(default=4, metadata={"help": "Decoder layers."})
    hidden: int = field(default=128, metadata={"help": "Hidden size (heads x head size)."})
    heads: int = field(default=4, metadata={"help": "Query heads."})
    kv_heads: int = field(default=2, metadata={"help": "Key/value heads (grouped-query attention; = heads for MHA)."})
    ffn: int | None = field(
        default=None, metadata={"help": "MLP inner size; default 8/3 x hidden rounded up to a multiple of 64."}
    )

    def __post_init__(self) -> None:
        check_types(self)
        for name in ("layers", "hidden", "heads", "kv_heads", "ffn"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"ScratchModel.{name} must be >= 1, got {value}")
        if self.hidden % self.heads:
            raise ConfigError(f"ScratchModel.hidden ({self.hidden}) must be a multiple of heads ({self.heads})")
        if self.heads % self.kv_heads:
            raise ConfigError(f"ScratchModel.heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})")

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "ScratchModel":
        return from_dict(cls, values)

    @property
    def intermediate(self) -> int:
        return self.ffn or -(-8 * self.hidden // (3 * 64)) * 64


def llama_config(shape: ScratchModel, vocab_size: int, max_positions: int) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,  # as SmolLM2: at 49,152 tokens the embeddings are most of a small model
    )


def build_model(shape: ScratchModel, vocab_size: int, max_positions: int, seed: int) -> PreTrainedModel:
    """A randomly initialised Llama-style causal LM (float32, SDPA attention, eval mode), identical for equal `seed`.

    The global torch RNG is left untouched.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(
            llama_config(shape, vocab_size, max_positions), dtype=torch.float32, attn_implementation="sdpa"
        )
    return model.eval()


def unigram_loss(train_rows: torch.Tensor, eval_rows: torch.Tensor, vocab_size: int) -> float:
    """Mean next-token loss of a model without context: token frequencies of `train_rows` (add-one smoothed), scored
    on the tokens `evaluate_loss` scores (positions 1..L-1 of each of `eval_rows` (M, L)). The level a trained
    model must get well below."""
    counts = torch.bincount(train_rows.reshape(-1), minlength=vocab_size).double() + 1.0
    log_p = counts.log() - counts.sum().log()
    return -log_p[eval_rows[:, 1:].reshape(-1)].mean().item()


def train_from_scratch(
    method: str,
    seed: int,
    model: dict[str, Any],
    focus: dict[str, Any],
    train: dict[str, Any],
    tokens: str | Path,
    tokenizer: str,
    domain: str,
    seq_len: int,
    calibration_rows: int,
    train_rows: int | None,
    eval_rows: int,
    metrics: str | Path,
    summary: str | Path,
    progress: bool = True,
) -> dict:
    """Train `model` (ScratchModel fields) from seed `seed` with `method` ("full" or "focus"); resumable.

    Rows are seq_len tokens of the train split of `tokens` (a `prepare_tokens` file of `tokenizer`, whose vocabulary
    sizes the model): the first `calibration_rows` k-means-initialise the Focus centroids and neither method trains
    on them; then at most `train_rows` rows (None: all) are trained on. `train` is a TrainConfig without its seed:
    `seed` sets the initial weights, the batch order and the global RNGs. The first `eval_rows` validation rows are
    scored every `train["eval_every"]` steps and at the end. Writes `metrics` (JSON lines) and `summary`: the
    validation loss and perplexity of each evaluated method (see the module docstring), the unigram reference on
    the same tokens, the model shape and parameter counts, configs, wall time and provenance.
    """
    if method not in METHODS:
        raise ValueError(f"unknown from-scratch method {method!r}; known: {', '.join(METHODS)}")
    if eval_rows < 1:
        raise ValueError(f"eval_rows must be >= 1 to compare validation perplexity, got {eval_rows}")
    shape = ScratchModel.from_dict(model)
    config = TrainConfig.from_dict({**train, "seed": seed})
    vocab_size = len(load_tokenizer(tokenizer))
    calibration, rows, eval_data = training_rows(tokens, seq_len, calibration_rows, eval_rows)
    rows = rows[:train_rows] if train_rows else rows
    net = build_model(shape, vocab_size, seq_len, seed).to(default_device())
    record: dict[str, Any] = {"method": method, "seed": seed, "domain": domain, "tokenizer": tokenizer}
    if method == "focus":
        focus_config = FocusConfig.from_dict(focus)
        if focus_config.window >= seq_len:
            raise ValueError(f"Focus window {focus_config.window} >= seq_len {seq_len}: Focus would be full attention")
        apply_focus(net, focus_config, calibration_ids=calibration if calibration_rows else None, seed=seed)
        record["focus_config"] = to_dict(focus_config)
    # From scratch every weight trains (apply_focus froze the network; the centroids train beside it).
    net.requires_grad_(True)
    record.update(run_training(net, rows, config, Path(metrics), eval_data, progress))
    validation = {method: {"loss": record["final"]["eval/loss"], "ppl": record["final"]["eval/ppl"]}}
    if method == "focus":
        set_focus_mode(net, "hard")
        loss = evaluate_loss(net, eval_data, config.eval_batch_size)
        validation["focus-hard"] = {"loss": loss, "ppl": math.exp(loss)}
    unigram = unigram_loss(rows, eval_data, vocab_size)
    record.update(
        validation=validation,
        unigram={"loss": unigram, "ppl": math.exp(unigram)},
        eval_rows=eval_data.shape[0],
        model_config={**to_dict(shape), "ffn": shape.intermediate, "vocab_size": vocab_size, "max_positions": seq_len},
        parameters=sum(p.numel() for p in net.parameters()),
        centroid_parameters=focus_parameter_count(net),
    )
    return write_training_summary(summary, f"scratch:llama seed {seed}", record, Path(metrics))


def summarize_scratch(
    summaries: list[str | Path], table_csv: str | Path, figure: str | Path, summary_json: str | Path
) -> dict:
    """Compare the runs of `train_from_scratch` (their summaries, with `metrics.jsonl` beside each).

    Writes `table_csv` (one row per evaluated method and seed) with a Markdown sibling (mean, spread and per-seed
    values, paired differences to full attention), `figure` (validation perplexity curves per method, mean over
    seeds with the range as a band; train loss beside it) with an SVG sibling, and `summary_json`:
    {"setting": one line, "methods": {name: {"mean", "std", "seeds": {seed: ppl}}}, "paired_difference": {...},
    "unigram": ppl, "metric": what the numbers are}; std is the sample standard deviation over seeds (null for one).
    """
    runs = [json.loads(Path(path).read_text()) for path in summaries]
    if not runs:
        raise ValueError("summarize_scratch needs at least one training summary")
    frame = _results_frame(runs)
    methods = {
        name: _spread(dict(zip(part["seed"], part["perplexity"])))
        for name, part in frame.groupby("method", sort=False)
    }
    differences = {}
    if "full" in methods:
        for name in methods.keys() - {"full"}:
            seeds = methods[name]["seeds"].keys() & methods["full"]["seeds"].keys()
            differences[name] = _spread({s: methods[name]["seeds"][s] - methods["full"]["seeds"][s] for s in seeds})
    record = {
        "setting": _setting(runs),
        "metric": "validation perplexity = exp(mean next-token loss) on held-out rows at the training length",
        "methods": methods,
        "paired_difference": {f"{name} - full": value for name, value in sorted(differences.items())},
        "unigram": runs[0]["unigram"]["ppl"],
    }
    write_text(table_csv, frame.to_csv(index=False))
    write_text(Path(table_csv).with_suffix(".md"), _scratch_markdown(record, frame))
    _plot(runs, summaries, record, figure)
    write_json(summary_json, record)
    return record


def _results_frame(runs: list[dict]) -> pd.DataFrame:
    rows = []
    for run in runs:
        for name, result in run["validation"].items():
            rows.append({
                "method": name,
                "evaluated_with": _evaluated_with(name, run),
                "seed": run["seed"],
                "perplexity": result["ppl"],
                "loss": result["loss"],
                "train_loss": run["final"]["train/loss"],
                "steps": run["train_config"]["steps"],
                "tokens": run["final"]["train/tokens"],
                "parameters": run["parameters"],
                "seconds": run["seconds"],
                "resumed": run["resumed"],
            })
    rows.sort(key=lambda row: (list(EVALUATED).index(row["method"]), row["seed"]))
    return pd.DataFrame(rows)


def _evaluated_with(name: str, run: dict) -> str:
    if name == "focus-hard":
        return f"Focus hard top-{run['focus_config']['top_k']}"
    return EVALUATED[name]


def _spread(values: dict[int, float]) -> dict:
    series = pd.Series(values, dtype=float)
    std = float(series.std(ddof=1)) if len(series) > 1 else None
    return {"mean": float(series.mean()), "std": std, "seeds": {int(s): float(v) for s, v in sorted(values.items())}}


def _setting(runs: list[dict]) -> str:
    run = next((r for r in runs if r["method"] == "focus"), runs[0])
    m, t = run["model_config"], run["train_config"]
    seeds = sorted({r["seed"] for r in runs})
    text = (
        f"Llama-style decoder from random init, {m['layers']} layers, hidden {m['hidden']}, {m['heads']} heads "
        f"({m['kv_heads']} key/value), MLP {m['ffn']}, {run['parameters'] - run['centroid_parameters']:,} parameters "
        f"(tied {m['vocab_size']:,}-token embeddings); {run['domain']} train split, {t['steps']} steps x "
        f"{t['batch_size']} x {run['seq_len']} tokens = {run['final']['train/tokens']:,} tokens, lr {t['lr']:g} "
        f"{t['schedule']}; validation {run['eval_rows']} x {run['seq_len']} tokens"
    )
    focus = run.get("focus_config")
    if focus:
        text += (f"; Focus window {focus['window']} of {run['seq_len']}, {focus['num_groups']} groups, "
                 f"hard top-{focus['top_k']}")
    return text + f"; seeds {', '.join(map(str, seeds))}"


def _scratch_markdown(record: dict, frame: pd.DataFrame) -> str:
    seeds = sorted({int(s) for s in frame["seed"]})
    evaluated_with = dict(zip(frame["method"], frame["evaluated_with"]))
    rows = []
    for name, result in record["methods"].items():
        std = "" if result["std"] is None else f" ± {result['std']:.2f}"
        rows.append({"method": name, "evaluated with": evaluated_with[name],
                     "perplexity, mean ± std": f"{result['mean']:.2f}{std}",
                     **{f"seed {s}": result["seeds"].get(s, float("nan")) for s in seeds}})
    table = markdown_table(pd.DataFrame(rows), ".2f")
    lines = [f"Setting: {record['setting']}.", "", table, ""]
    for name, diff in record["paired_difference"].items():
        std = "" if diff["std"] is None else f" ± {diff['std']:.2f}"
        per_seed = ", ".join(f"seed {s}: {v:+.2f}" for s, v in diff["seeds"].items())
        lines.append(f"- {name} (same initial weights and batches per seed): {diff['mean']:+.2f}{std} ({per_seed})")
    lines.append(f"- unigram model (train token frequencies) on the same tokens: {record['unigram']:.1f}")
    return "\n".join(lines) + "\n"


def _plot(runs: list[dict], summaries: list[str | Path], record: dict, figure: str | Path) -> None:
    plt = pyplot()
    curves: dict[str, list[pd.DataFrame]] = {}
    for run, path in zip(runs, summaries):
        lines = (Path(path).parent / "metrics.jsonl").read_text().splitlines()
        curves.setdefault(run["method"], []).append(pd.DataFrame([json.loads(line) for line in lines]))
    fig, (val_ax, train_ax) = plt.subplots(1, 2, figsize=(11, 4.2))
    for method in (m for m in METHODS if m in curves):
        label = f"{method}: {EVALUATED[method]}"
        for ax, key in ((val_ax, "eval/ppl"), (train_ax, "train/loss")):
            per_seed = [f.dropna(subset=[key]).set_index("step")[key] for f in curves[method] if key in f]
            table = pd.concat(per_seed, axis=1)  # (steps, seeds)
            (line,) = ax.plot(table.index, table.mean(axis=1), marker="o" if key == "eval/ppl" else None,
                              markersize=3, label=label)
            if table.shape[1] > 1:  # with few seeds each one matters: its own thin line inside the range band
                ax.fill_between(table.index, table.min(axis=1), table.max(axis=1), color=line.get_color(), alpha=0.15)
                ax.plot(table.index, table.to_numpy(), color=line.get_color(), linewidth=0.7, alpha=0.6)
    hard = record["methods"].get("focus-hard")
    if hard:
        last = max(int(f["step"].max()) for f in curves["focus"])
        low, high = min(hard["seeds"].values()), max(hard["seeds"].values())
        val_ax.errorbar([last], [hard["mean"]], yerr=[[hard["mean"] - low], [high - hard["mean"]]], marker="x",
                        color="black", linestyle="none", capsize=3, label="focus-hard: Focus hard top-k (final)")
    val_ax.axhline(record["unigram"], color="grey", linestyle="--", linewidth=0.8, label="unigram")
    val_ax.set(yscale="log", xlabel="step", ylabel="validation perplexity (log scale)",
               title="validation perplexity (mean and each seed, band: range)")
    train_ax.set(xlabel="step", ylabel="train loss (nats)", title="train loss (mean and each seed, band: range)",
                 ylim=(None, math.log(record["unigram"]) + 1))  # the first steps (from log(vocab)) are off the top
    for ax in (val_ax, train_ax):
        ax.legend(fontsize="small")
    save_figure(fig, figure)
