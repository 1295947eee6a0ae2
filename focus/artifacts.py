"""How tables and figures are written: Markdown tables, pyplot on Agg, PNG figures with an SVG sibling."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from focus.files import atomic_write


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


def token_axis(ax, lengths) -> None:
    """A log-2 x axis ticked at the measured token counts (4K, 8K, ...) and a line at speedup 1."""
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_xscale("log", base=2)
    ax.minorticks_off()
    ticks = sorted(set(lengths))
    ax.set_xticks(ticks, [f"{n // 1024}K" if n >= 1024 else str(n) for n in ticks])
