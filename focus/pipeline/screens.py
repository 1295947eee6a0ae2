"""Screens as pipeline stages: the router recall screen (rule recall_screen, profile section `recall_screen`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import torch

from focus.data import chunk_tokens
from focus.eval.recall_report import screen_scores_perplexity, write_recall_tables
from focus.eval.router_screen import screen_routers
from focus.models import inference_device, load_model
from focus.pipeline.jobs import _DTYPES, read_tokens
from focus.provenance import git_commit


def recall_screen(
    source: str,
    dtype: str,
    routers: Mapping[str, str],
    tokens: Mapping[str, str | Path],
    train_tokens: str | Path,
    seq_len: int,
    calibration_rows: int,
    window: int,
    split: str,
    lengths: Sequence[int],
    rows: int,
    shares: Sequence[float],
    keys: Sequence[int],
    last_queries: int,
    stem: str | Path,
    command: str,
    ppl_shares: Sequence[float] = (),
    ppl_keys: Sequence[int] = (),
    ppl_rows: int = 8,
    ppl_routers: Sequence[str] | None = None,
    figure: str | Path | None = None,
) -> None:
    """Screen `routers` ({name: spec}; `adapter:FOLDER` for a trained variant) of `source` on the `split` of each
    corpus in `tokens` ({corpus: prepare_tokens file}), calibrated on the first `calibration_rows` rows of
    `seq_len` of `train_tokens`' train split (what a training job starts from), and score their perplexity at
    `ppl_shares` / `ppl_keys` on `ppl_rows` rows (`ppl_routers`, default every selecting one; a groups router named
    there at its own pattern; the oracle's too on a validation split); writes `stem`.csv / .md / _layers.csv and the
    figures (`figure`, default `stem`.png; `focus.eval.recall_report.write_recall_tables`) once every corpus and
    length is measured."""
    commit = git_commit()  # the checkout may move on while the screen runs
    torch.manual_seed(0)
    model, _ = load_model(source, _DTYPES[dtype], inference_device())
    calibration = chunk_tokens(read_tokens(train_tokens, "train"), seq_len)[:calibration_rows]
    corpora = {corpus: read_tokens(path, split) for corpus, path in tokens.items()}
    found, layers, scored = screen_routers(model, routers, corpora, lengths, rows, shares, keys, window, calibration,
                                           last_queries=last_queries, ppl_shares=ppl_shares, ppl_keys=ppl_keys,
                                           ppl_rows=ppl_rows, ppl_oracle=split == "validation",
                                           ppl_routers=ppl_routers)
    header = (f"{source}, {dtype}, {split} split, window {window}. Per router and budget: recall = the distant "
              "attention mass kept / the distant mass (beyond the window, sinks excluded), oracle_recall = the "
              "heaviest distant keys' mass at the same count per query, of_oracle = their ratio, kept = the share of "
              f"distant pairs. Budgets: shares of each query's distant keys below 4K tokens, keys per query from 4K "
              f"(the last {last_queries} queries of each row); {rows} rows per corpus and length.")
    asked = screen_scores_perplexity(ppl_shares, ppl_keys, ppl_routers)  # (the rule declares the table then)
    write_recall_tables(found, layers, scored if asked else None, stem, header, command, commit, figure)
