"""Figures of a pipeline run: training loss curves and perplexity bars."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from focus.artifacts import panels, pyplot, save_figure
from focus.report.tables import _BASELINES


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
