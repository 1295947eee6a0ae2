"""Tables and figures of a pipeline run, built from the JSON records the stages wrote.

CSV files are the record (long form: one row per measurement); each has a Markdown sibling laid out for reading.
Figures are PNG (report, W&B) with an SVG sibling (papers).
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from .files import atomic_write, write_text

# Column order of the perplexity pivot: baselines first, then Focus variants as they come.
_BASELINES = ("pretrained", "full_finetune")


def perplexity_frame(records: list[str | Path]) -> pd.DataFrame:
    """One row per (model, method, domain) perplexity record."""
    rows = []
    for path in records:
        record = json.loads(Path(path).read_text())
        rows.append({key: record[key] for key in ("model", "method", "domain", "perplexity", "nll", "tokens",
                                                  "context_length", "seconds")})
    return pd.DataFrame(rows)


def training_frame(summaries: list[str | Path]) -> pd.DataFrame:
    """One row per training run: model, variant, parameters, budget, final losses, wall time."""
    rows = []
    for path in summaries:
        summary = json.loads(Path(path).read_text())
        final, config = summary["final"], summary["train_config"]
        rows.append({
            "model": Path(path).parent.parent.name,
            "variant": Path(path).parent.name,
            "trainable_parameters": summary["trainable_parameters"],
            "steps": config["steps"],
            "batch_size": config["batch_size"],
            "seq_len": summary["seq_len"],
            "tokens": final.get("train/tokens"),
            "lr": config["lr"],
            "train_loss": final.get("train/loss"),
            "eval_loss": final.get("eval/loss"),
            "eval_ppl": final.get("eval/ppl"),
            "seconds": summary["seconds"],
            "resumed": summary["resumed"],
        })
    return pd.DataFrame(rows)


def perplexity_markdown(frame: pd.DataFrame) -> str:
    """Perplexity with one row per (model, domain) and one column per method."""
    methods = list(dict.fromkeys([m for m in _BASELINES if m in set(frame["method"])] + list(frame["method"])))
    pivot = frame.pivot_table(index=["model", "domain"], columns="method", values="perplexity", sort=False)
    return pivot[methods].reset_index().to_markdown(index=False, floatfmt=".2f") + "\n"


def write_tables(
    perplexity_records: list[str | Path],
    training_summaries: list[str | Path],
    perplexity_csv: str | Path,
    training_csv: str | Path,
) -> None:
    """Write the perplexity and training tables as CSV, each with a `.md` sibling."""
    frame = perplexity_frame(perplexity_records)
    write_text(perplexity_csv, frame.to_csv(index=False))
    write_text(Path(perplexity_csv).with_suffix(".md"), perplexity_markdown(frame))
    training = training_frame(training_summaries)
    write_text(training_csv, training.to_csv(index=False))
    write_text(Path(training_csv).with_suffix(".md"), markdown_table(training, ".4g") + "\n")


def plot_figures(
    metrics_files: list[str | Path], perplexity_csv: str | Path, loss_curves: str | Path, perplexity: str | Path
) -> None:
    """Loss curves (one panel per model; per trained variant, train loss solid and validation loss dashed where
    measured) and perplexity bars (one panel per
    model, bars per method, grouped by test corpus), each as PNG plus an SVG sibling."""
    plt = pyplot()

    curves: dict[str, dict[str, pd.DataFrame]] = {}
    for path in metrics_files:
        frame = pd.DataFrame([json.loads(line) for line in Path(path).read_text().splitlines()])
        curves.setdefault(Path(path).parent.parent.name, {})[Path(path).parent.name] = frame
    fig, axes = panels(plt, len(curves))
    for ax, (model, variants) in zip(axes, curves.items()):
        for variant, frame in variants.items():
            train = frame.dropna(subset=["train/loss"])
            (line,) = ax.plot(train["step"], train["train/loss"], marker="o", markersize=3, label=f"{variant} train")
            if "eval/loss" in frame:
                evals = frame.dropna(subset=["eval/loss"])
                ax.plot(evals["step"], evals["eval/loss"], linestyle="--", marker="s", color=line.get_color(),
                        label=f"{variant} validation")
        ax.set(title=model, xlabel="step", ylabel="loss")
        ax.legend(fontsize="small")
    save_figure(fig, loss_curves)

    table = pd.read_csv(perplexity_csv)
    models = list(dict.fromkeys(table["model"]))
    fig, axes = panels(plt, len(models))
    for ax, model in zip(axes, models):
        pivot = table[table["model"] == model].pivot_table(index="domain", columns="method", values="perplexity",
                                                           sort=False)
        order = [m for m in _BASELINES if m in pivot.columns] + [m for m in pivot.columns if m not in _BASELINES]
        pivot[order].plot.bar(ax=ax, rot=0, logy=True)
        ax.set(title=model, xlabel="test corpus", ylabel="perplexity (log scale)")
        ax.legend(fontsize="small")
    save_figure(fig, perplexity)


def pyplot():
    """matplotlib.pyplot on the Agg backend: figures are written to files, and clusters and CI have no display."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def markdown_table(frame: pd.DataFrame, floatfmt: str) -> str:
    """A Markdown table: integer columns as integers, floats by `floatfmt`, a missing value (a cell that was never
    measured, e.g. a needle length the profile does not test) as a dash rather than "nan". (tabulate reads an
    all-numeric frame as one float array and would print 16384 as 1.64e+04; object columns keep each value's type.)"""
    formats = ["d" if pd.api.types.is_integer_dtype(dtype) else floatfmt for dtype in frame.dtypes]
    cells = frame.astype(object).where(frame.notna(), None)
    return cells.to_markdown(index=False, floatfmt=formats, missingval="—")


def panels(plt, count: int):
    columns = min(count, 3)
    rows = -(-count // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(5 * columns, 3.8 * rows), squeeze=False)
    for ax in axes.flat[count:]:
        ax.set_visible(False)
    return fig, list(axes.flat[:count])


def save_figure(fig, png: str | Path) -> None:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    for path in (Path(png), Path(png).with_suffix(".svg")):
        atomic_write(path, lambda tmp, suffix=path.suffix[1:]: fig.savefig(tmp, format=suffix, dpi=120))
    plt.close(fig)


def write_speed_tables(attention: list[dict], prefill: list[dict], attention_csv: str | Path, prefill_csv: str | Path,
                       device: str) -> None:
    """Benchmark rows as CSV, each with a Markdown sibling headed by the device they were measured on."""
    for rows, path in ((attention, attention_csv), (prefill, prefill_csv)):
        frame = pd.DataFrame(rows)
        write_text(path, frame.to_csv(index=False))
        body = markdown_table(frame, ".3g") if len(frame) else "(not measured)"
        write_text(Path(path).with_suffix(".md"), f"Measured on: {device}\n\n{body}\n")


def token_axis(ax, lengths) -> None:
    """A log-2 x axis ticked at the measured token counts (4K, 8K, ...) and a line at speedup 1."""
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_xscale("log", base=2)
    ax.minorticks_off()
    ticks = sorted(set(lengths))
    ax.set_xticks(ticks, [f"{n // 1024}K" if n >= 1024 else str(n) for n in ticks])


def plot_speedup(attention_csv: str | Path, figure: str | Path) -> None:
    """Measured speedup of the decomposition over full causal SDPA against sequence length, one line per
    (groups, window, top-k, routing), with the pair-count limit dashed in the same colour. PNG plus SVG sibling."""
    plt = pyplot()

    frame = pd.read_csv(attention_csv)
    if "routing" not in frame:  # tables measured before query-side routing existed
        frame["routing"] = "key"
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for (groups, window, top_k, routing), part in frame.groupby(["groups", "window", "top_k", "routing"]):
        label = f"G={groups} w={window} top-{top_k}, {routing} routing"
        (line,) = ax.plot(part["length"], part["speedup"], marker="o", label=label)
        ax.plot(part["length"], part["theoretical"], linestyle="--", color=line.get_color(), alpha=0.7)
    token_axis(ax, frame["length"])
    ax.set(xlabel="sequence length (tokens)", ylabel="speedup over full causal SDPA",
           title="Focus hard top-k, two-call decomposition (dashed: pair-count limit)")
    ax.legend(fontsize="small")
    save_figure(fig, figure)
