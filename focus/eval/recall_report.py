"""The recall screen's record and figure: the distant attention mass each router keeps, against the pairs kept.

One panel per corpus (a row of the grid) and context length (a column), one curve per router
(`focus.eval.recall_screen.routing_recall`), the oracle (each query's heaviest distant keys) on top: no router keeps
more at the same count, so the gap to it is what a better router could still win.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from focus.artifacts import markdown_table, pyplot, save_figure
from focus.files import write_json, write_text
from focus.provenance import provenance, provenance_line


def plot_recall(frame: pd.DataFrame, figure: str | Path, patterns: pd.DataFrame | None = None) -> None:
    """`frame`: rows of corpus, length, router, kept, recall, oracle_recall (the screen's table); `patterns`: the
    perplexity rows of groups scored at their own top-k pattern (`budget_kind` "pattern": budget, the pairs kept, and
    recall), drawn as stars in their router's colour, the oracle at the same count hollow."""
    fig, axes, panels = _panels(frame, height=3.8)
    for ax, (corpus, length), part in panels:
        first = part["router"].iloc[0]
        oracle = part[part["router"] == first].sort_values("kept")
        ax.plot(oracle["kept"], oracle["oracle_recall"], "k--", marker=".", label="oracle (heaviest keys)")
        colours = {}
        for router, curve in part.groupby("router", sort=False):
            curve = curve.sort_values("kept")
            (line,) = ax.plot(curve["kept"], curve["recall"], marker="o", markersize=3, label=router)
            colours[router] = line.get_color()
        here = ([] if patterns is None else
                list(patterns[(patterns["corpus"] == corpus) & (patterns["length"] == length)].itertuples()))
        for row in here:
            colour = colours.get(row.pattern, "black")
            ax.plot(row.budget, row.recall, "*", markersize=10, color=colour,
                    markerfacecolor="none" if row.router == "oracle" else colour)
        if here:  # one legend entry each, not one per router
            ax.plot([], [], "*", markersize=10, color="black", label="a router at its top-k pattern")
            ax.plot([], [], "*", markersize=10, color="black", markerfacecolor="none",
                    label="the oracle at the same count")
        ax.plot([0, 1], [0, 1], color="grey", linewidth=0.6)  # chance: as much mass as pairs
        ax.set_xlim(0, max(0.55, float(part["kept"].max()) + 0.02))
        ax.set_ylim(0, 1.0)
        ax.set_title(f"{corpus}, {length:,} tokens", fontsize=10)
        ax.set_xlabel("share of distant pairs kept")
    _finish(fig, axes, "share of distant attention mass kept", figure)


def plot_recall_layers(layers: pd.DataFrame, figure: str | Path, share: float = 0.3, keys: int = 2048) -> None:
    """Where recall goes: per layer, each router's share of the oracle's mass at one budget (the screened one nearest
    `share` of the distant keys below 4K tokens, nearest `keys` per query from 4K), one panel per corpus and length."""
    fig, axes, panels = _panels(layers, height=3.4, sharey=True)
    for ax, (corpus, length), part in panels:
        target = keys if length >= 4096 else share
        budget = min(part["budget"].unique(), key=lambda b: abs(float(b) - target))
        for router, curve in part[part["budget"] == budget].groupby("router", sort=False):
            ax.plot(curve["layer"], curve["of_oracle"], marker="o", markersize=2, label=router)
        what = f"{budget:g} keys" if length >= 4096 else f"{float(budget):.0%} of the distant keys"
        ax.set_title(f"{corpus}, {length:,} tokens, {what}", fontsize=9)
        ax.set_xlabel("layer")
    _finish(fig, axes, "recall / the oracle's", figure)


def _panels(frame: pd.DataFrame, height: float, **options):
    """(figure, axes, [(axis, (corpus, length), rows)]): a grid of a row per corpus and a column per length (nine
    panels of three corpora at three lengths in one line are too wide to read), one row where there is one length;
    a corpus without a length leaves its panel blank."""
    parts = dict(list(frame.groupby(["corpus", "length"], sort=False)))
    corpora, lengths = list(dict.fromkeys(frame["corpus"])), sorted(frame["length"].unique())
    place = ({(corpus, length): (0, i) for i, corpus in enumerate(corpora) for length in lengths} if len(lengths) == 1
             else {(corpus, length): (i, j) for i, corpus in enumerate(corpora) for j, length in enumerate(lengths)})
    rows, columns = (max(i for i, _ in place.values()) + 1, max(j for _, j in place.values()) + 1)
    # (2 inches more for the legend beside the first row's last panel)
    fig, axes = pyplot().subplots(rows, columns, figsize=(4.2 * columns + 2, height * rows), squeeze=False, **options)
    for (corpus, length), (i, j) in place.items():
        if (corpus, length) not in parts:
            axes[i][j].set_visible(False)
    return fig, axes, [(axes[i][j], key, parts[key]) for key, (i, j) in place.items() if key in parts]


def _finish(fig, axes, ylabel: str, figure: str | Path) -> None:
    for ax in axes.flat:
        ax.grid(alpha=0.3)
    for row in axes:
        row[0].set_ylabel(ylabel)
    axes[0][-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0))  # beside the panels, off the curves
    save_figure(fig, figure)


def screen_scores_perplexity(ppl_shares: Sequence[float], ppl_keys: Sequence[int],
                             ppl_routers: Sequence[str] | None) -> bool:
    """Whether a recall screen asks for perplexity (budgets, or routers named: groups need none), so that rule
    recall_screen declares <stem>_perplexity.csv and `write_recall_tables` writes it (torch-free: the workflow asks)."""
    return bool(ppl_shares or ppl_keys or ppl_routers)


_SCORED_COLUMNS = ["corpus", "length", "router", "budget", "budget_kind", "ppl", "vs_pretrained", "low", "high", "rows"]
"""The perplexity table's columns (`focus.eval.router_screen.screen_routers`), for a screen that scored none."""


def write_recall_tables(found: list[dict], layers: list[dict], scored: list[dict] | None, stem: str | Path,
                        header: str, command: str, commit: str | None = None, figure: str | Path | None = None) -> None:
    """The screen's record: <stem>.csv (per router, corpus, length and budget), <stem>_layers.csv (per layer),
    <stem>_perplexity.csv (per router, corpus, length and budget; written whenever perplexity was asked, `scored` not
    None, even where no router was scored: a rule declares it from the profile), <stem>.md (the table, the
    perplexities when measured, `header` and the provenance line naming `command` and `commit`, the one the run
    started at),
    <stem>.provenance.json and the figures `figure` (default <stem>.png; and .svg: `plot_recall`) and
    <figure stem>_layers.png / .svg (`plot_recall_layers`)."""
    stem = Path(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    frame = pd.DataFrame(found)
    write_text(stem.with_suffix(".csv"), frame.to_csv(index=False))
    write_text(stem.parent / f"{stem.name}_layers.csv", pd.DataFrame(layers).to_csv(index=False))
    columns = ["corpus", "length", "router", "budget", "recall", "oracle_recall", "of_oracle", "kept"]
    text = f"{provenance_line(command, commit)}\n\n{header}\n\n{markdown_table(frame[columns], '.3g')}\n"
    perplexities = pd.DataFrame(scored or [], columns=None if scored else _SCORED_COLUMNS)
    if scored is not None:
        write_text(stem.parent / f"{stem.name}_perplexity.csv", perplexities.to_csv(index=False))
    if scored:
        text += ("\nPerplexity at a budget (a share of each query's distant keys, or keys per query: `budget_kind`; "
                 "`pattern`: the share of distant pairs a groups router's own hard top-k pattern keeps, scored for "
                 "the router and for the oracle that keeps as many in every query row, `recall` the distant mass "
                 "each keeps), the ratio to pretrained with its paired 95% interval over the rows:\n\n"
                 f"{markdown_table(perplexities, '.4g')}\n")
    write_text(stem.with_suffix(".md"), text)
    write_json(stem.with_suffix(".provenance.json"), {**provenance(), **({"git_commit": commit} if commit else {}),
                                                      "command": command})
    figure = Path(figure) if figure is not None else stem.with_suffix(".png")
    patterns = perplexities[perplexities["budget_kind"] == "pattern"] if "pattern" in perplexities else None
    plot_recall(frame, figure, patterns)
    plot_recall_layers(pd.DataFrame(layers), figure.parent / f"{figure.stem}_layers.png")
