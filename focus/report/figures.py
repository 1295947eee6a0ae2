"""Figures of a pipeline run: training loss curves and perplexity changes against the pretrained model."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from focus.artifacts import panels, pyplot, save_figure
from focus.pipeline.methods import PRETRAINED
from focus.report.tables import _BASELINES


def plot_figures(
    metrics_files: list[str | Path], perplexity_csv: str | Path, loss_curves: str | Path, perplexity: str | Path
) -> None:
    """Loss curves (one panel per model; per trained variant, train loss solid and validation loss dashed where
    measured) and perplexity changes against pretrained (`plot_perplexity_changes`), each as PNG plus an SVG
    sibling."""
    plt = pyplot()

    curves: dict[str, dict[str, pd.DataFrame]] = {}
    for path in metrics_files:
        frame = pd.DataFrame([json.loads(line) for line in Path(path).read_text().splitlines()])
        curves.setdefault(Path(path).parent.parent.name, {})[Path(path).parent.name] = frame
    fig, axes = panels(plt, len(curves))
    for ax, (model, variants) in zip(axes, curves.items()):
        for variant, frame in variants.items():
            color = None  # the train curve's, for the validation curve (a run of 0 steps has no train curve)
            if "train/loss" in frame:
                train = frame.dropna(subset=["train/loss"])
                (line,) = ax.plot(train["step"], train["train/loss"], marker="o", markersize=3,
                                  label=f"{variant} train")
                color = line.get_color()
            if "eval/loss" in frame:
                evals = frame.dropna(subset=["eval/loss"])
                ax.plot(evals["step"], evals["eval/loss"], linestyle="--", marker="s", color=color,
                        label=f"{variant} validation")
        ax.set(title=model, xlabel="step", ylabel="loss")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="small")
    save_figure(fig, loss_curves)

    plot_perplexity_changes(pd.read_csv(perplexity_csv), perplexity)


def plot_perplexity_changes(table: pd.DataFrame, figure: str | Path) -> None:
    """Each method's perplexity change against the pretrained model (%) with its paired 95% interval over the scored
    windows, one marker per domain, one panel per real model. Models of random weights (sources `tiny:...`) are
    plumbing checks, their perplexity in the thousands: they are named under the figure and left to the table."""
    plt = pyplot()
    sources = table["source"] if "source" in table else pd.Series("", index=table.index)  # tables before the column
    plumbing = sources.fillna("").str.startswith("tiny:")
    real = table[~plumbing & table["method"].ne(PRETRAINED)].dropna(subset=["change"])
    models = list(dict.fromkeys(real["model"]))
    fig, axes = panels(plt, max(1, len(models)))
    for ax, model in zip(axes, models):
        rows = real[real["model"] == model]
        methods = list(dict.fromkeys(m for m in list(_BASELINES) + list(rows["method"]) if m in set(rows["method"])))
        domains = list(dict.fromkeys(rows["domain"]))
        for offset, domain in enumerate(domains):
            at = rows[rows["domain"] == domain].set_index("method").reindex(methods)
            y = [i + (offset - (len(domains) - 1) / 2) * 0.2 for i in range(len(methods))]
            change, low, high = (100 * at[c] for c in ("change", "change_low", "change_high"))
            ax.errorbar(change, y, xerr=[change - low, high - change], fmt="o", capsize=3, label=domain)
        ax.axvline(0, color="black", linestyle="--", linewidth=0.8)
        ax.set_yticks(range(len(methods)), methods)
        ax.invert_yaxis()
        ax.set(title=f"{model}: test perplexity (left of 0 is better)",
               xlabel="change against pretrained (%), paired 95% interval")
        ax.legend(fontsize="small", title="test corpus")
    if not models:
        axes[0].text(0.5, 0.5, "no pretrained model with real weights in this run", ha="center", transform=axes[0].transAxes)
        axes[0].set_axis_off()
    checks = sorted(set(table.loc[plumbing, "model"]))
    if checks:
        fig.text(0.01, 0.005, f"Random-weight models ({', '.join(checks)}) are plumbing checks: see "
                 "tables/perplexity.md.", fontsize=7)
    save_figure(fig, figure)
