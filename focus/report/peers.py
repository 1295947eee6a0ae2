"""The peers table: the trained router against the training-free selectors on the same windows (issue 47).

One row per (model, domain, design): the trained Focus variant in hard mode and every peer (`<selector>@<budget>`),
each with its perplexity change against the pretrained model and, for the peers, against the trained router, both
with paired 95% intervals over the same windows, and the share of distant pairs each keeps (its budget). Kept free of
torch, as the other report modules: it reads the perplexity records only.
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


def peers_frame(records: list[str | Path], router: str) -> pd.DataFrame:
    """Rows of `router` (the trained Focus method, e.g. "focus-hard") and every peer method among the perplexity
    `records`, per model and domain where the pretrained model and `router` were scored too.

    Columns: model, domain, design, kind ("trained" or "peer"), perplexity, distant_kept, change / change_low /
    change_high (against pretrained), against_router / against_router_low / against_router_high (a peer's perplexity
    over the router's - 1: above zero, the trained router is better; empty for the router itself).
    """
    loaded = [json.loads(Path(path).read_text()) for path in records]
    by_cell: dict[tuple[str, str], dict[str, dict]] = {}
    for record in loaded:
        by_cell.setdefault((record["model"], record["domain"]), {})[record["method"]] = record
    rows = []
    for (model, domain), methods in sorted(by_cell.items()):
        if PRETRAINED not in methods or router not in methods:
            continue
        base, trained = methods[PRETRAINED]["window_nll"], methods[router]["window_nll"]
        designs = [router, *sorted(m for m in methods if parse_peer_name(m) is not None)]
        for design in designs:
            record = methods[design]
            change = paired_ratio(record["window_nll"], base)
            row = {"model": model, "domain": domain, "design": design,
                   "kind": "trained" if design == router else "peer", "perplexity": record["perplexity"],
                   "distant_kept": record.get("distant_kept"),
                   "change": change[0], "change_low": change[1], "change_high": change[2]}
            if design != router:
                against = paired_ratio(record["window_nll"], trained)
                row.update(against_router=against[0], against_router_low=against[1], against_router_high=against[2])
            rows.append(row)
    return pd.DataFrame(rows)


def write_peers(records: list[str | Path], router: str, csv: str | Path, figure: str | Path | None, domain: str,
                other: str | None) -> pd.DataFrame:
    """`peers_frame` of the perplexity `records` as CSV and Markdown, and (`figure` given) the trade-off figure: every
    design's change on `domain` (the training domain) against its change on `other` (another scored domain), for the
    first model. Returns the frame."""
    frame = peers_frame(records, router)
    write_text(csv, frame.to_csv(index=False))
    shown = frame.assign(**{
        "change (95%)": [_interval(r.change, r.change_low, r.change_high) for r in frame.itertuples()],
        "peer against trained (95%)": [_interval(r.against_router, r.against_router_low, r.against_router_high)
                                       for r in frame.itertuples()] if "against_router" in frame else "",
    })[["model", "domain", "design", "distant_kept", "perplexity", "change (95%)", "peer against trained (95%)"]]
    write_text(Path(csv).with_suffix(".md"), markdown_table(shown, ".3g") + "\n")
    if figure is None:
        return frame
    model = frame["model"].iloc[0]
    part = frame[frame["model"] == model]
    mine, theirs = part[part["domain"] == domain].set_index("design"), part[part["domain"] == other]
    points = pd.DataFrame({"design": mine.index, "domain_change": mine["change"].values,
                           "other_change": theirs.set_index("design")["change"].reindex(mine.index).values,
                           "distant_kept": mine["distant_kept"].values})
    plot_tradeoff(points, figure, f"{domain} (test)", f"{other} (test)",
                  note=f"{model}: the trained router and the training-free selectors under the same window and sinks")
    return frame


def _interval(value, low, high) -> str:
    return "" if pd.isna(value) else f"{value:+.2%} [{low:+.2%}, {high:+.2%}]"
