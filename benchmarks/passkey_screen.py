"""Pass-key retrieval of adapters' hard models beside the pretrained model, on one filler text (issue 47: the peers).

    .venv/bin/python benchmarks/passkey_screen.py --tokens DIR --adapter quest=FOLDER --adapter focus=FOLDER --tag peers

A five-digit key hidden at 5 depths of a filler of the held-out novel's `--split`, `--trials` per depth and length
(`focus.eval.needle.needle_trials`, greedy): one row per model, the keys found per length out of the trials, and the
mean log-probability of the key. Writes <out>/passkey_<tag>.{csv,md} after every model.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import pandas as pd
import torch

from focus import load_focus, remove_focus, set_focus_mode
from focus.artifacts import markdown_table
from focus.eval.needle import needle_trials
from focus.files import write_text
from focus.models import PACKAGED_SMOLLM2, load_model
from focus.pipeline.jobs import read_tokens
from focus.provenance import git_commit, provenance_line

DEPTHS = [0.1, 0.3, 0.5, 0.7, 0.9]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", required=True, help="folder of <corpus>.tokens.safetensors (no_worse_screen.py)")
    parser.add_argument("--adapter", action="append", default=[], help="NAME=FOLDER, repeatable")
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048, 4096])
    parser.add_argument("--trials", type=int, default=2, help="per depth and length")
    parser.add_argument("--split", default="test", choices=["validation", "test"])
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--tag", default="screen")
    args = parser.parse_args()
    commit = git_commit()  # now: the checkout may move on while the screen runs
    model, tokenizer = load_model(PACKAGED_SMOLLM2, getattr(torch, args.dtype))
    filler = read_tokens(Path(args.tokens) / "books_by_book.tokens.safetensors", args.split)
    rows = []
    for spec in ["pretrained", *args.adapter]:
        name, _, folder = spec.partition("=")
        if folder:
            load_focus(model, folder)
            set_focus_mode(model, "hard")
        tic = time.perf_counter()
        with torch.no_grad():
            trials = pd.DataFrame(needle_trials(model, tokenizer, filler, args.lengths, DEPTHS, args.trials,
                                                progress=False))
        if folder:
            remove_focus(model)
        found = trials.groupby("length")["correct"].sum()
        rows.append({"model": name, **{f"found_{n}": int(found[n]) for n in args.lengths},
                     "trials_per_length": len(DEPTHS) * args.trials, "key_logprob": trials["key_logprob"].mean(),
                     "seconds": round(time.perf_counter() - tic)})
        print(rows[-1], flush=True)
        frame = pd.DataFrame(rows)
        setting = (f"SmolLM2-135M-Instruct, {args.dtype}, hard mode for every adapter; a five-digit pass-key at depths "
                   f"{DEPTHS} of the held-out novel's {args.split} split, {args.trials} trials per depth and length, "
                   f"greedy; found_N: keys found of trials_per_length at N tokens. `benchmarks/passkey_screen.py "
                   f"--lengths {' '.join(map(str, args.lengths))} --tag {args.tag}`.")
        out = Path(args.out)
        write_text(out / f"passkey_{args.tag}.csv", frame.to_csv(index=False))
        stamp = provenance_line("python " + " ".join(sys.argv), commit)
        write_text(out / f"passkey_{args.tag}.md", f"{stamp}\n\n{setting}\n\n{markdown_table(frame, '.3g')}\n")


if __name__ == "__main__":
    main()
