"""The peers table: the trained routers against the training-free selectors on the same windows (issue 47).

One row per (model, domain, context length, design, router): the trained Focus variants in hard mode (the routers) and
every peer (`<selector>@<budget>`), each with its perplexity change against the pretrained model and against each
router other than itself, both with paired 95% intervals over the same windows, and the share of distant pairs each
keeps (its budget). Kept free of torch, as the other report modules: it reads the perplexity records only.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from focus.artifacts import markdown_table
from focus.eval.paired import paired_ratio
from focus.files import write_text
from focus.pipeline.methods import PRETRAINED, parse_peer_name
from focus.report.study import plot_tradeoff


def peers_frame(records: list[str | Path], routers: str | list[str]) -> pd.DataFrame:
    """Rows of the `routers` (trained Focus methods, e.g. ["focus-hard"]; the first is the main one) and of every peer
    method among the perplexity `records`, per model, domain and context length where the pretrained model and a
    router were scored too; the peers in the order of their first record.

    Columns: model, domain, context_length, design, kind ("trained" or "peer"), perplexity, distant_kept, change /
    change_low / change_high (against pretrained), router, against_router / against_router_low / against_router_high
    (the design's perplexity over `router`'s - 1: above zero, the router is better). A design has one row per router
    other than itself (none: one row, router empty).
    """
    routers = [routers] if isinstance(routers, str) else list(routers)
    by_cell: dict[tuple[str, str, int | None], dict[str, dict]] = {}
    for path in records:
        record = json.loads(Path(path).read_text())
        cell = (record["model"], record["domain"], record.get("context_length"))
        by_cell.setdefault(cell, {})[record["method"]] = record
    rows = []
    for (model, domain, context), methods in sorted(by_cell.items(), key=lambda item: (*item[0][:2], item[0][2] or 0)):
        present = [router for router in routers if router in methods]
        if PRETRAINED not in methods or not present:
            continue
        base = methods[PRETRAINED]["window_nll"]
        for design in [*present, *(m for m in methods if parse_peer_name(m) is not None)]:
            record = methods[design]
            change = paired_ratio(record["window_nll"], base)
            row = {"model": model, "domain": domain, "context_length": context, "design": design,
                   "kind": "trained" if design in routers else "peer", "perplexity": record["perplexity"],
                   "distant_kept": record.get("distant_kept"),
                   "change": change[0], "change_low": change[1], "change_high": change[2]}
            references = [router for router in present if router != design]
            rows += [row] if not references else []
            for router in references:
                against = paired_ratio(record["window_nll"], methods[router]["window_nll"])
                rows.append({**row, "router": router, "against_router": against[0], "against_router_low": against[1],
                             "against_router_high": against[2]})
    return pd.DataFrame(rows)


def write_peers(records: list[str | Path], routers: str | list[str], csv: str | Path, figure: str | Path | None,
                domain: str, other: str | None) -> pd.DataFrame:
    """`peers_frame` of the perplexity `records` as CSV and Markdown (one row per design and cell, a column per router
    it is paired against), and (`figure` given) the trade-off figure: every design's change on `domain` (the training
    domain) against its change on `other` (another scored domain), for the first model at its shortest context.
    Returns the frame."""
    frame = peers_frame(records, routers)
    write_text(csv, frame.to_csv(index=False))
    write_text(Path(csv).with_suffix(".md"), markdown_table(_shown(frame), ".3g") + "\n")
    if figure is None:
        return frame
    model = frame["model"].iloc[0]
    part = frame[(frame["model"] == model) & (frame["context_length"] == frame["context_length"].min())]
    part = part.drop_duplicates(["domain", "design"])  # (one row per router paired against: the change is the same)
    mine, theirs = part[part["domain"] == domain].set_index("design"), part[part["domain"] == other]
    points = pd.DataFrame({"design": mine.index, "domain_change": mine["change"].values,
                           "other_change": theirs.set_index("design")["change"].reindex(mine.index).values,
                           "distant_kept": mine["distant_kept"].values})
    plot_tradeoff(points, figure, f"{domain} (test)", f"{other} (test)",
                  note=f"{model}: the trained router and the training-free selectors under the same window and sinks")
    return frame


def _shown(frame: pd.DataFrame) -> pd.DataFrame:
    """The table as read: one row per (model, domain, context, design), its change against pretrained and against each
    router ("against <router> (95%)"), both with their paired intervals."""
    keys = ["model", "domain", "context_length", "design"]
    designs = frame.drop_duplicates(keys)  # (a design's rows differ only in the router paired against)
    shown = designs[[*keys, "distant_kept", "perplexity"]].assign(**{
        "change (95%)": [_interval(r.change, r.change_low, r.change_high) for r in designs.itertuples()]})
    if "router" in frame:
        paired = frame.dropna(subset=["router"])
        for router in dict.fromkeys(frame.loc[frame["kind"] == "trained", "design"]):  # (in the profile's order)
            pairs = paired[paired["router"] == router]
            if pairs.empty:
                continue
            column = pairs.set_index(keys).apply(
                lambda r: _interval(r["against_router"], r["against_router_low"], r["against_router_high"]), axis=1)
            shown[f"against {router} (95%)"] = shown.set_index(keys).index.map(column).fillna("")
    return shown.rename(columns={"context_length": "context"})


def _interval(value, low, high) -> str:
    return "" if pd.isna(value) else f"{value:+.2%} [{low:+.2%}, {high:+.2%}]"
