"""RULER screen (issue 27): trained adapters' hard models against the pretrained model on lm-eval's RULER tasks that
build their haystacks offline, at each prompt length, with enough documents that a score's standard error is small.

    .venv/bin/python benchmarks/ruler_screen.py --adapter rr25_w5=/work/runs/rr25_w5/adapter --limit 25

The pretrained model is scored first (its rows are kept in the table and reused with --append), then each adapter in
hard mode with the dense heads it was trained with. A row per (model, task, length): lm-eval's string-match score,
its standard error and the documents scored, and the difference to pretrained in units of the two standard errors
combined. Writes <out>/ruler_screen_<tag>.{csv,md} after every model (a stopped screen keeps what it measured).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import pandas as pd
import torch

from focus import load_focus, remove_focus, set_focus_mode
from focus.artifacts import markdown_table
from focus.eval.ruler import run_ruler
from focus.files import write_text
from focus.models import PACKAGED_SMOLLM2, load_model
from focus.provenance import git_commit, provenance_line


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--adapter", action="append", default=[], help="NAME=FOLDER, repeatable")
    parser.add_argument("--tasks", nargs="+", default=["niah_single_1", "niah_multikey_2", "ruler_vt"])
    parser.add_argument("--lengths", type=int, nargs="+", default=[2048, 4096])
    parser.add_argument("--limit", type=int, default=25, help="documents per task and length")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--tag", default="screen")
    parser.add_argument("--append", action="store_true", help="keep the rows already in the table (pretrained too; "
                        "an adapter's rows are replaced only at the tasks and lengths scored again)")
    args = parser.parse_args()
    args.commit = git_commit()  # now: the checkout may move on while the screen runs

    model, tokenizer = load_model(PACKAGED_SMOLLM2, getattr(torch, args.dtype))
    table = Path(args.out) / f"ruler_screen_{args.tag}.csv"
    rows = pd.read_csv(table).to_dict("records") if args.append and table.exists() else []
    rows = [{key: value for key, value in row.items() if key != "gap_in_stderrs"} for row in rows]
    if not any(row["model"] == "pretrained" for row in rows):
        rows += _score(model, tokenizer, "pretrained", args)
        _write(rows, args)
    for spec in args.adapter:
        name, folder = spec.split("=", 1)
        load_focus(model, folder)
        set_focus_mode(model, "hard")
        fresh = _score(model, tokenizer, name, args)
        scored = {(row["model"], row["task"], row["length"]) for row in fresh}  # other lengths' rows stay
        rows = [row for row in rows if (row["model"], row["task"], row["length"]) not in scored] + fresh
        _write(rows, args)
        remove_focus(model)
    _write(rows, args)  # also rewrites a table kept with --append and no new adapter
    print((Path(args.out) / f"ruler_screen_{args.tag}.md").read_text())


def _score(model, tokenizer, name: str, args) -> list[dict]:
    tic = time.perf_counter()
    with torch.no_grad():
        scores, _ = run_ruler(model, tokenizer, args.tasks, args.lengths, args.limit)
    seconds = round(time.perf_counter() - tic)
    print(f"{name}: {seconds} s")
    return [{"model": name, "task": task, "length": int(length), **found, "seconds": seconds}
            for task, by_length in scores.items() for length, found in by_length.items()]


def _write(rows: list[dict], args) -> None:
    frame = pd.DataFrame(rows)
    # lm-eval leaves some standard errors out (N/A); those get the binomial one over documents, sqrt(p (1 - p) / n),
    # exact for the needle tasks (each document right or wrong), an approximation for variable tracking.
    missing = frame["stderr"].isna()
    frame.loc[missing, "stderr"] = (frame["score"] * (1 - frame["score"]) / frame["documents"]).pow(0.5)[missing]
    earlier = frame["stderr_from"] if "stderr_from" in frame else pd.Series("lm-eval", index=frame.index)
    frame["stderr_from"] = earlier.fillna("lm-eval").where(~missing, "binomial")
    base = frame[frame["model"] == "pretrained"].set_index(["task", "length"])
    differences = []
    for row in frame.itertuples():
        key = (row.task, row.length)
        if row.model == "pretrained" or key not in base.index:
            differences.append(float("nan"))
            continue
        pretrained = base.loc[key]
        spread = math.sqrt((row.stderr or 0.0) ** 2 + (pretrained["stderr"] or 0.0) ** 2)
        gap = row.score - pretrained["score"]
        differences.append(gap / spread if spread > 0 else (0.0 if gap == 0 else math.copysign(math.inf, gap)))
    frame["gap_in_stderrs"] = differences
    out = Path(args.out)
    setting = (f"SmolLM2-135M-Instruct, {args.dtype}, lm-eval RULER (offline tasks), greedy, {args.limit} documents "
               "per task and length; hard Focus with each adapter's own dense heads. gap_in_stderrs: (score - "
               "pretrained) / sqrt(stderr^2 + pretrained stderr^2); within 2 is 'within two standard errors'.")
    write_text(out / f"ruler_screen_{args.tag}.csv", frame.to_csv(index=False))
    stamp = provenance_line("python " + " ".join(sys.argv), args.commit)
    write_text(out / f"ruler_screen_{args.tag}.md", f"{stamp}\n\n{setting}\n\n{markdown_table(frame, '.3g')}\n")


if __name__ == "__main__":
    main()
