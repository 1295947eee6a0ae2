"""One picture of the design study's trade-off: every design measured so far, gain on books against forgetting on
WikiText-2, from the committed tables (issue 27).

    .venv/bin/python benchmarks/study_tradeoff.py

Reads benchmarks/results/study/tables/study.csv (configs/study.yaml's snapshot, parts 1-4: books validation, WikiText-2
test, pass-key of 12 trials at 1K and 2K), forgetting_screen_validation.csv (books and WikiText-2 validation, pass-key at 1K-4K),
no_worse_validation.csv and no_worse_screen{2,3,4}_validation.csv (issue 44: the held-out novel and WikiText-2
validation, centroids trained on five novels; screen4: the routing's shape and the teacher's share),
oracle_floor/tables/recall_screen_perplexity.csv (the oracle at fixed shares of the distant pairs, the same splits:
configs/oracle_floor.yaml's snapshot), and draws
benchmarks/results/study_tradeoff.{png,svg} with its table study_tradeoff.md
(`focus.report.study`'s trade-off figure, which the study rule draws for a run).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from focus.artifacts import markdown_table
from focus.files import write_text
from focus.report.study import plot_tradeoff, tradeoff_points


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", default="benchmarks/results")
    args = parser.parse_args()
    results = Path(args.results)

    points = tradeoff_points(pd.read_csv(results / "study" / "tables" / "study.csv"), "books", "wikitext2")
    points["design"] = "parts 1-4: " + points["design"]
    screen = results / "forgetting_screen_validation.csv"
    if screen.exists():
        rows = pd.read_csv(screen)
        rows = rows[rows["adapter"] != "pretrained"]
        passkey = [c for c in rows if c.startswith("needle_")]
        points = pd.concat([points, pd.DataFrame({
            "design": "screen: " + rows["adapter"] + ", " + rows["dense"].astype(str) + " dense heads"
                      + rows["select"].fillna("").map(lambda s: f" ({s})" if s else "")
                      + rows.get("window", pd.Series(64, index=rows.index)).fillna(64).astype(int).map(
                          lambda w: "" if w == 64 else f", window {w}"),
            "domain_change": rows["books_change"], "other_change": rows["wikitext2_change"],
            "distant_kept": rows["distant_kept"],
            "passkey": rows[passkey].apply(lambda r: sum(_share(v) for v in r) / len(r), axis=1),
        })])
    for name, budget in (("no_worse_validation.csv", ""), ("no_worse_screen2_validation.csv", ", 100 steps"),
                         ("no_worse_screen3_validation.csv", ", rows of 2,048"),
                         ("no_worse_screen4_validation.csv", "")):  # its steps per row
        if not (results / name).exists():
            continue
        rows = pd.read_csv(results / name).dropna(subset=["books_by_book_change"])
        rows = rows[rows["design"] != "pretrained"]
        points = pd.concat([points, pd.DataFrame({
            "design": "by book: " + rows["design"] + ", window 128" + (
                rows["steps"].map(lambda steps: f", {int(steps)} steps" if steps != 300 else "") if "steps" in rows
                else budget),
            "domain_change": rows["books_by_book_change"], "other_change": rows["wikitext2_change"],
            "distant_kept": rows["distant_kept"],
            "passkey": rows["needle"].map(lambda cell: _shares(cell) if isinstance(cell, str) and " of " in cell
                                          else float("nan")),
        })])
    floor = results / "oracle_floor" / "tables" / "recall_screen_perplexity.csv"
    if floor.exists():  # the oracle at a fixed share: what any routing choosing pairs by attention weight reaches
        rows = pd.read_csv(floor)
        rows = rows[(rows["router"] == "oracle") & (rows["budget_kind"] == "share")]
        by_corpus = rows.pivot_table(index="budget", columns="corpus", values="vs_pretrained")
        points = pd.concat([points, pd.DataFrame({
            "design": [f"oracle (any routing) at {kept:.0%} of distant pairs" for kept in by_corpus.index],
            "domain_change": by_corpus["books_by_book"].values, "other_change": by_corpus["wikitext2"].values,
            "distant_kept": by_corpus.index.values, "passkey": float("nan"),
        })])
    note = ("parts 1-4: books validation against WikiText-2 test, pass-key of 12 trials at 1K-2K; screen: both "
            "validation splits, pass-key at 1K-4K; window 64 unless named. by book (issue 44): the held-out novel's "
            "validation (a book the centroids never saw) against WikiText-2 validation; oracle: the heaviest distant "
            "pairs by the true attention logits at a fixed share (float32). SmolLM2-135M-Instruct, 16 groups, "
            "top-2 unless named, bfloat16.")
    plot_tradeoff(points, results / "study_tradeoff.png", "books", "WikiText-2", note)
    write_text(results / "study_tradeoff.md", f"{note}\n\n{markdown_table(points, '.3g')}\n")
    print((results / "study_tradeoff.md").read_text())


def _shares(cell: str) -> float:
    """'10/8/5 of 10' -> the mean share found over the lengths."""
    counts, trials = cell.split(" of ")
    return sum(int(c) for c in counts.split("/")) / (int(trials) * len(counts.split("/")))


def _share(cell: str) -> float:
    """'7/10' -> 0.7."""
    correct, trials = str(cell).split("/")
    return int(correct) / int(trials)


if __name__ == "__main__":
    main()
