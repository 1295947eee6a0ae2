"""The from-scratch comparison's table, figure and summary, from every `train_from_scratch` run."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

from focus.artifacts import markdown_table, pyplot, save_figure
from focus.files import write_json, write_text
from focus.pipeline.methods import SCRATCH_EVALUATED as EVALUATED
from focus.pipeline.methods import SCRATCH_METHODS as METHODS


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
