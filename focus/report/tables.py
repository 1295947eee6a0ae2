"""Tables and figures of a pipeline run, built from the JSON records the stages wrote.

CSV files are the record (long form: one row per measurement); each has a Markdown sibling laid out for reading.
Figures are PNG (report, W&B) with an SVG sibling (papers).
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from focus.artifacts import markdown_table
from focus.eval.paired import paired_ratio
from focus.files import write_text
from focus.pipeline.methods import PRETRAINED

# Column order of the perplexity pivot: baselines first, then Focus variants as they come.
_BASELINES = ("pretrained", "full_finetune")


def perplexity_frame(records: list[str | Path]) -> pd.DataFrame:
    """One row per (model, method, domain) perplexity record, with its change against the pretrained model on the same
    windows (`change`, ratio - 1) and that change's paired 95% interval (`change_low`, `change_high`; empty for the
    pretrained model itself, or where no pretrained record of the model and domain is among `records`)."""
    loaded = [json.loads(Path(path).read_text()) for path in records]
    base = {(r["model"], r["domain"]): r for r in loaded if r["method"] == PRETRAINED}
    rows = []
    for record in loaded:
        row = {key: record.get(key) for key in ("model", "source", "method", "domain", "perplexity", "nll", "tokens",
                                                "context_length", "seconds")}
        reference = base.get((record["model"], record["domain"]))
        if record["method"] != PRETRAINED and reference is not None and len(record["window_nll"]) > 1:
            row["change"], row["change_low"], row["change_high"] = paired_ratio(record["window_nll"],
                                                                                reference["window_nll"])
        rows.append(row)
    return pd.DataFrame(rows)


def training_frame(summaries: list[str | Path]) -> pd.DataFrame:
    """One row per training run: model, variant, parameters, budget, final losses, wall time."""
    rows = []
    for path in summaries:
        summary = json.loads(Path(path).read_text())
        final, config = summary["final"], summary["train_config"]
        rows.append({
            "model": Path(path).parent.parent.name,
            "variant": Path(path).parent.name,
            "trainable_parameters": summary["trainable_parameters"],
            "steps": config["steps"],
            "batch_size": config["batch_size"],
            "seq_len": summary["seq_len"],
            "tokens": final.get("train/tokens"),
            "lr": config["lr"],
            "train_loss": final.get("train/loss"),
            "eval_loss": final.get("eval/loss"),
            "eval_ppl": final.get("eval/ppl"),
            "seconds": summary["seconds"],
            "resumed": summary["resumed"],
            "frozen_unchanged": _frozen_unchanged(summary),
        })
    return pd.DataFrame(rows)


def _frozen_unchanged(summary: dict) -> bool | None:
    """Whether the frozen weights' checksum was the same after training as before; None where none was recorded
    (a baseline that trains every weight, or a run from before the checksum)."""
    checksum = summary.get("frozen_checksum")
    return None if checksum is None else checksum["before"] == checksum["after"]


def perplexity_markdown(frame: pd.DataFrame) -> str:
    """Perplexity with one row per (model, domain) and one column per method."""
    methods = list(dict.fromkeys([m for m in _BASELINES if m in set(frame["method"])] + list(frame["method"])))
    pivot = frame.pivot_table(index=["model", "domain"], columns="method", values="perplexity", sort=False)
    return pivot[methods].reset_index().to_markdown(index=False, floatfmt=".2f") + "\n"


def write_tables(
    perplexity_records: list[str | Path],
    training_summaries: list[str | Path],
    perplexity_csv: str | Path,
    training_csv: str | Path,
) -> None:
    """Write the perplexity and training tables as CSV, each with a `.md` sibling."""
    frame = perplexity_frame(perplexity_records)
    write_text(perplexity_csv, frame.to_csv(index=False))
    write_text(Path(perplexity_csv).with_suffix(".md"), perplexity_markdown(frame))
    training = training_frame(training_summaries)
    write_text(training_csv, training.to_csv(index=False))
    write_text(Path(training_csv).with_suffix(".md"), markdown_table(training, ".4g") + "\n")
