"""Figures and the example page of the interpretability stage (`focus.eval.interpret`), from its tables.

Heatmaps colour log2 lift (a group's share of a category over that category's share of all tokens: red = the
group holds more of it than the text does) and print the share itself, so both "what is in this group" and "what is
special about it" read off one picture. PNG (report, W&B) with an SVG sibling, as in `focus.report.tables`.
"""

from __future__ import annotations

import html
from pathlib import Path

import numpy as np
import pandas as pd

from focus.artifacts import pyplot, save_figure
from focus.eval.categories import CATEGORY_NAMES
from focus.eval.interpret import ROUTINGS
from focus.files import atomic_write, write_text

_LIFT_RANGE = 3.0  # colour scale of log2 lift: +-3 is 8x over- or under-represented
_ROUTING_LABELS = {"focus": "Focus (learnt bias, inference)", "sinkhorn": "Sinkhorn (as in training)",
                   "raw": "no balancing (raw softmax)"}


def _lift_colours():
    """Diverging blue-white-red for log2 lift; grey for cells holding no tokens."""
    import matplotlib

    return matplotlib.colormaps["RdBu_r"].with_extremes(bad="#dddddd")


def _matrix(tables: dict[str, pd.DataFrame], layer: int, head: int, column: str) -> np.ndarray:
    """(G, categories) `column` of one layer and head (rows come in group, then category order)."""
    categories = tables["categories"]
    part = categories[(categories["layer"] == layer) & (categories["head"] == head)]
    return part[column].to_numpy().reshape(-1, len(CATEGORY_NAMES))


def _nmi_title(tables: dict[str, pd.DataFrame], layer: int, head: int) -> str:
    layers = tables["layers"]
    row = layers[(layers["layer"] == layer) & (layers["head"] == head) & (layers["routing"] == "focus")].iloc[0]
    return f"NMI {row['nmi_category']:.3f} (shuffled {row['nmi_category_shuffled']:.3f})"


def plot_group_categories(tables: dict[str, pd.DataFrame], layer: int, path: str | Path) -> None:
    """Group x category heatmap of one layer, one panel per key/value head; a first row for all tokens."""
    plt = pyplot()
    heads = sorted(tables["categories"]["head"].unique())
    counts = _matrix(tables, layer, heads[0], "count")
    overall = counts.sum(axis=0) / counts.sum()
    num_groups = counts.shape[0]
    fig, axes = plt.subplots(1, len(heads), figsize=(5.2 * len(heads), 0.34 * num_groups + 2.6), squeeze=False,
                             layout="constrained")
    for ax, head in zip(axes[0], heads):
        share = np.vstack([overall, _matrix(tables, layer, head, "share")])
        lift = np.vstack([np.ones_like(overall), _matrix(tables, layer, head, "lift")])
        image = ax.imshow(_log_lift(lift), cmap=_lift_colours(), vmin=-_LIFT_RANGE, vmax=_LIFT_RANGE, aspect="auto")
        for (i, j), value in np.ndenumerate(share):
            if value >= 0.005:
                ax.text(j, i, f"{100 * value:.0f}", ha="center", va="center", fontsize=7)
        sizes = _matrix(tables, layer, head, "count").sum(axis=1) / counts.sum()
        ax.set_yticks(range(num_groups + 1), ["all tokens"] + [f"g{g} ({100 * s:.1f}%)" for g, s in enumerate(sizes)],
                      fontsize=8)
        ax.set_xticks(range(len(CATEGORY_NAMES)), CATEGORY_NAMES, rotation=45, ha="right", fontsize=8)
        ax.axhline(0.5, color="black", linewidth=1)
        ax.set_title(f"layer {layer}, head {head}: {_nmi_title(tables, layer, head)}", fontsize=9)
    fig.colorbar(image, ax=axes[0].tolist(), shrink=0.6, label="log2 lift over all tokens")
    fig.suptitle("What each group holds: % of the group's tokens per category (colour: over/under-representation)",
                 fontsize=10)
    _save_untight(fig, path)


def plot_category_overview(tables: dict[str, pd.DataFrame], layers: list[int], path: str | Path) -> None:
    """Small multiples: the log2-lift heatmap of every plotted layer (rows) and key/value head (columns)."""
    plt = pyplot()
    heads = sorted(tables["categories"]["head"].unique())
    fig, axes = plt.subplots(len(layers), len(heads), figsize=(2.6 * len(heads) + 1, 2.3 * len(layers) + 1),
                             squeeze=False, layout="constrained")
    for r, layer in enumerate(layers):
        for c, head in enumerate(heads):
            ax = axes[r, c]
            image = ax.imshow(_log_lift(_matrix(tables, layer, head, "lift")), cmap=_lift_colours(), vmin=-_LIFT_RANGE,
                              vmax=_LIFT_RANGE, aspect="auto")
            ax.set_title(f"L{layer} h{head}: " + _nmi_title(tables, layer, head).replace(" (shuffled", "\n(shuffled"),
                         fontsize=7)
            ax.set_yticks([])
            if r == len(layers) - 1:
                ax.set_xticks(range(len(CATEGORY_NAMES)), CATEGORY_NAMES, rotation=60, ha="right", fontsize=6)
            else:
                ax.set_xticks([])
        axes[r, 0].set_ylabel(f"layer {layer}\ngroups", fontsize=8)
    fig.colorbar(image, ax=axes.ravel().tolist(), shrink=0.5, label="log2 lift")
    _save_untight(fig, path)


def plot_balance(tables: dict[str, pd.DataFrame], layer: int, head: int, path: str | Path) -> None:
    """Group balance with and without Sinkhorn. Top: shares per group in the representative layer/head and in the
    head that is least balanced without balancing; bottom, per layer (line: mean over heads, band: least to most
    balanced head), the normalised entropy of the group shares and the largest group's share."""
    plt = pyplot()
    shares, layers = tables["shares"], tables["layers"]
    raw = layers[layers["routing"] == "raw"]
    worst = raw.loc[raw["normalised_entropy"].idxmin()]
    fig, axes = plt.subplots(2, 2, figsize=(14, 8.5))
    for ax, (lay, hd, what) in zip(axes[0], ((layer, head, "representative"),
                                             (int(worst["layer"]), int(worst["head"]), "least balanced without balancing"))):
        part = shares[(shares["layer"] == lay) & (shares["head"] == hd)]
        order = part[part["routing"] == "raw"].sort_values("share", ascending=False)["group"].tolist()
        width = 0.8 / len(ROUTINGS)
        for i, routing in enumerate(ROUTINGS):
            values = part[part["routing"] == routing].set_index("group").loc[order, "share"]
            ax.bar(np.arange(len(order)) + (i - 1) * width, values, width, label=_ROUTING_LABELS[routing])
        ax.axhline(1 / len(order), color="black", linestyle="--", linewidth=1, label="even share 1/G")
        ax.set_xticks(range(len(order)), [f"g{g}" for g in order], fontsize=7)
        ax.set(title=f"share of tokens per group: layer {lay}, head {hd}\n({what})", ylabel="share of tokens (top-1)")
    axes[0, 0].legend(fontsize="small")
    for ax, column, label in ((axes[1, 0], "normalised_entropy", "entropy of group shares / log G"),
                              (axes[1, 1], "max_share", "largest group's share")):
        for routing in ROUTINGS:
            stats = layers[layers["routing"] == routing].groupby("layer")[column].agg(["mean", "min", "max"])
            (line,) = ax.plot(stats.index, stats["mean"], marker="o", markersize=3, label=_ROUTING_LABELS[routing])
            ax.fill_between(stats.index, stats["min"], stats["max"], color=line.get_color(), alpha=0.2)
        ax.set(xlabel="layer", ylabel=label, title=f"{label} per layer (band: over heads)")
    axes[1, 1].axhline(1 / shares["group"].nunique(), color="black", linestyle="--", linewidth=1)
    axes[1, 0].set_ylim(top=1.005)
    save_figure(fig, path)


def plot_alignment(tables: dict[str, pd.DataFrame], path: str | Path) -> None:
    """NMI of the Focus groups with token category, token identity and position per layer (line: mean over heads,
    band: over heads), each beside its chance level with shuffled labels (dashed)."""
    plt = pyplot()
    layers = tables["layers"]
    focus = layers[layers["routing"] == "focus"]
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.2), sharey=True)
    for ax, label in zip(axes, ("category", "token", "position")):
        stats = focus.groupby("layer")[f"nmi_{label}"].agg(["mean", "min", "max"])
        (line,) = ax.plot(stats.index, stats["mean"], marker="o", markersize=3, label="Focus groups")
        ax.fill_between(stats.index, stats["min"], stats["max"], color=line.get_color(), alpha=0.2)
        chance = focus.groupby("layer")[f"nmi_{label}_shuffled"].mean()
        ax.plot(chance.index, chance, linestyle="--", color="grey", label="shuffled labels (chance)")
        ax.set(xlabel="layer", title=f"group vs {label}" + (" (eighth of the row)" if label == "position" else ""))
    axes[0].set_ylabel("normalised mutual information")
    axes[0].legend(fontsize="small")
    save_figure(fig, path)


def write_examples_html(
    path: str | Path,
    texts: list[str],
    categories: list[str],
    blocks: dict[tuple[int, int], tuple[list[int], list[float]]],
    num_groups: int,
    title: str,
) -> None:
    """A self-contained page of the same text once per (layer, head), each token on the colour of its group.

    Args:
        texts: the tokens' text; categories: their category names.
        blocks: {(layer, head): (hard group per token, its soft probability)}.
    """
    colours = _group_colours(num_groups)
    legend = " ".join(f'<span class="t" style="background:{colours[g]}">g{g}</span>' for g in range(num_groups))
    sections = []
    for (layer, head), (groups, probs) in blocks.items():
        spans = "".join(
            f'<span class="t" style="background:{colours[g]}" title="group {g}, p={p:.2f}, {c}">'
            f"{html.escape(t).replace(chr(10), '⏎')}</span>{'<br>' if chr(10) in t else ''}"
            for t, c, g, p in zip(texts, categories, groups, probs)
        )
        sections.append(f"<h2>layer {layer}, head {head}</h2>\n<p class=\"text\">{spans}</p>")
    page = f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>
body {{ font-family: sans-serif; max-width: 70em; margin: 1em auto; }}
.text {{ font-family: monospace; line-height: 1.9; }}
.t {{ padding: 1px 0; border-right: 1px solid #fff; white-space: pre-wrap; }}
</style></head><body>
<h1>{html.escape(title)}</h1>
<p>Each token on the colour of its hard (top-1) Focus group, routed as at inference; hover for the group, its soft
probability and the token's category. ⏎ is a newline. Groups: {legend}</p>
{chr(10).join(sections)}
</body></html>
"""
    write_text(path, page)


def _group_colours(num_groups: int) -> list[str]:
    """Light, distinct background colours: tab20 mixed 45% with white (hues around the circle past 20 groups)."""
    import matplotlib

    if num_groups <= 20:
        base = [matplotlib.colormaps["tab20"](i)[:3] for i in range(num_groups)]
    else:
        base = [matplotlib.colors.hsv_to_rgb((g / num_groups, 0.6, 0.9)) for g in range(num_groups)]
    return [matplotlib.colors.to_hex(0.55 * np.asarray(rgb) + 0.45) for rgb in base]


def _log_lift(lift: np.ndarray) -> np.ma.MaskedArray:
    """log2 lift clipped to the colour range; cells with no tokens are masked (drawn grey, not as -inf)."""
    with np.errstate(divide="ignore"):
        return np.ma.masked_where(lift <= 0, np.clip(np.log2(lift), -_LIFT_RANGE, _LIFT_RANGE))


def _save_untight(fig, png: str | Path) -> None:
    """`focus.artifacts.save_figure` for figures with a colorbar across panels, which tight_layout cannot place."""
    import matplotlib.pyplot as plt

    for path in (Path(png), Path(png).with_suffix(".svg")):
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, lambda tmp, suffix=path.suffix[1:]: fig.savefig(tmp, format=suffix, dpi=120,
                                                                          bbox_inches="tight"))
    plt.close(fig)
