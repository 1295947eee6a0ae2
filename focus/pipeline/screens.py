"""Screens as pipeline stages: the router recall screen (profile section `recall_screen`), one job per corpus and
length (rule recall_screen_cell: `recall_screen_cell`) gathered into its tables (rule recall_screen:
`gather_recall_screen`), so that a screen of hours resumes where it stopped and a cluster runs its cells side by side.
`recall_screen` runs every cell in one process (the same numbers: each cell seeds itself)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch

from focus.data import chunk_tokens
from focus.eval.recall_report import screen_scores_perplexity, write_recall_tables
from focus.eval.router_screen import screen_routers
from focus.files import write_text
from focus.models import inference_device, load_model
from focus.pipeline.jobs import _DTYPES, read_tokens
from focus.provenance import git_commit, machine_name, short_commit


def recall_screen(source: str, dtype: str, routers: Mapping[str, str], tokens: Mapping[str, str | Path],
                  train_tokens: str | Path, seq_len: int, calibration_rows: int, window: int, split: str,
                  lengths: Sequence[int], rows: int, stem: str | Path, command: str, figure: str | Path | None = None,
                  **budgets) -> None:
    """Screen `routers` ({name: spec}; `adapter:FOLDER` for a trained variant) of `source` on the `split` of each
    corpus in `tokens` ({corpus: prepare_tokens file}) at each of `lengths`, in one process: `recall_screen_cell`'s
    cells (`budgets`: its shares, keys, last_queries and ppl_* settings), then `gather_recall_screen`'s tables."""
    model, calibration = _screen_model(source, dtype, train_tokens, seq_len, calibration_rows)
    cells = [measure_cell(model, calibration, routers, read_tokens(path, split), corpus, length, window, split, rows,
                          **budgets) for corpus, path in tokens.items() for length in lengths]
    write_recall_screen(cells, source, dtype, window, split, rows, stem, command, figure, **budgets)


def recall_screen_cell(source: str, dtype: str, routers: Mapping[str, str], corpus: str, tokens: str | Path,
                       train_tokens: str | Path, seq_len: int, calibration_rows: int, window: int, split: str,
                       length: int, rows: int, out: str | Path, **budgets) -> None:
    """One cell of the screen: every router on `rows` rows of `length` tokens of `corpus` (`tokens`, its
    prepare_tokens file), written to `out` (JSON: the rows of the three tables, the commit and the machine)."""
    model, calibration = _screen_model(source, dtype, train_tokens, seq_len, calibration_rows)
    cell = measure_cell(model, calibration, routers, read_tokens(tokens, split), corpus, length, window, split, rows,
                        **budgets)
    write_text(out, json.dumps(cell) + "\n")  # (not write_json: its sorted keys would reorder the tables' columns)


def gather_recall_screen(cells: Sequence[str | Path], source: str, dtype: str, window: int, split: str, rows: int,
                         stem: str | Path, command: str, figure: str | Path | None = None, **budgets) -> None:
    """The screen's tables and figures (`write_recall_screen`) from the cells `recall_screen_cell` wrote."""
    write_recall_screen([json.loads(Path(path).read_text()) for path in cells], source, dtype, window, split, rows,
                        stem, command, figure, **budgets)


def measure_cell(model, calibration: torch.Tensor, routers: Mapping[str, str], ids: torch.Tensor, corpus: str,
                 length: int, window: int, split: str, rows: int, shares: Sequence[float], keys: Sequence[int],
                 last_queries: int, ppl_shares: Sequence[float] = (), ppl_keys: Sequence[int] = (), ppl_rows: int = 8,
                 ppl_routers: Sequence[str] | None = None, ppl_tokens: int | None = None) -> dict:
    """`screen_routers` at one corpus and length; the oracle's perplexity too on a validation split. Perplexity on
    `ppl_rows` rows, or on as many as `ppl_tokens` fill at this length (at least 2)."""
    commit = git_commit()  # (taken first: the checkout may move on while the cell runs)
    torch.manual_seed(0)  # each cell as if alone, whichever ran before it in this process
    ppl_rows = max(2, ppl_tokens // length) if ppl_tokens else ppl_rows
    found, layers, scored = screen_routers(model, routers, {corpus: ids}, [length], rows, shares, keys, window,
                                           calibration, last_queries=last_queries, ppl_shares=ppl_shares,
                                           ppl_keys=ppl_keys, ppl_rows=ppl_rows, ppl_oracle=split == "validation",
                                           ppl_routers=ppl_routers)
    return {"corpus": corpus, "length": length, "found": found, "layers": layers, "scored": scored,
            "commit": commit, "machine": machine_name()}


def write_recall_screen(cells: Sequence[dict], source: str, dtype: str, window: int, split: str, rows: int,
                        stem: str | Path, command: str, figure: str | Path | None = None, *, last_queries: int,
                        ppl_shares: Sequence[float] = (), ppl_keys: Sequence[int] = (),
                        ppl_routers: Sequence[str] | None = None, **_) -> None:
    """`cells` (`measure_cell`'s records, in the order of the table) as `stem`.csv / .md / _layers.csv and the
    figures (`figure`, default `stem`.png; `focus.eval.recall_report.write_recall_tables`)."""
    where = {}  # commit and machine -> the cells measured there (several only where a screen resumed elsewhere)
    for cell in cells:
        where.setdefault(f"commit {short_commit(cell['commit'])} on {cell['machine']}", []).append(
            f"{cell['corpus']} {cell['length']}")
    measured = "; ".join(place if len(where) == 1 else f"{place} ({', '.join(names)})"
                         for place, names in where.items())
    header = (f"{source}, {dtype}, {split} split, window {window}. Per router and budget: recall = the distant "
              "attention mass kept / the distant mass (beyond the window, sinks excluded), oracle_recall = the "
              "heaviest distant keys' mass at the same count per query, of_oracle = their ratio, kept = the share of "
              f"distant pairs. Budgets: shares of each query's distant keys below 4K tokens, keys per query from 4K "
              f"(the last {last_queries} queries of each row); {rows} rows per corpus and length. Measured at "
              f"{measured}.")
    asked = screen_scores_perplexity(ppl_shares, ppl_keys, ppl_routers)  # (the rule declares the table then)
    write_recall_tables([row for cell in cells for row in cell["found"]],
                        [row for cell in cells for row in cell["layers"]],
                        [row for cell in cells for row in cell["scored"]] if asked else None, stem, header, command,
                        cells[0]["commit"], figure)


def _screen_model(source: str, dtype: str, train_tokens: str | Path, seq_len: int, calibration_rows: int):
    """The model and the rows that calibrate its routers: the first `calibration_rows` rows of `seq_len` of
    `train_tokens`' train split (what a training job starts from)."""
    model, _ = load_model(source, _DTYPES[dtype], inference_device())
    return model, chunk_tokens(read_tokens(train_tokens, "train"), seq_len)[:calibration_rows]
