"""Routing designs screened without training: what each keeps of SmolLM2's attention, and what that costs.

    .venv/bin/python benchmarks/routing_screen.py                     # books validation, 512 tokens, window 64
    .venv/bin/python benchmarks/routing_screen.py --seq-len 1024 --window 256 --tag 1024
    .venv/bin/python benchmarks/routing_screen.py --window 128 --shapes 16x2 32x3 48x4 63x5 32x2 --corpus wikitext2 \
        --tag shapes_wikitext2

For every design (FocusConfig changes), centroids are k-means of calibration rows of the books train split (as
apply_focus initialises them), then on validation rows: the share of the pretrained model's distant attention mass
the hard pattern keeps, the share of distant pairs it keeps, the per-row oracle at that cost
(`focus.eval.diagnostics`), and hard-mode perplexity with every layer sparsified. `--shapes GROUPSxTOP_K ...` screens
the library's routing (query routing, rotary undone) at those numbers of groups and groups per token instead: the
capacity of the routing, read against the share of pairs each keeps. Writes <out>/routing_screen_<tag>.{csv,md}.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import pandas as pd
import torch

from focus import FocusConfig, apply_focus, remove_focus
from focus.artifacts import markdown_table
from focus.data import chunk_tokens, load_corpus, tokenize_corpus
from focus.eval.diagnostics import distant_attention_recall
from focus.files import write_text
from focus.models import PACKAGED_SMOLLM2, load_model
from focus.train.loop import evaluate_loss

DESIGNS = {
    "key routing (a query takes its key's groups)": {"route_queries": "key", "unrotate": False},
    "key routing, rotary undone": {"route_queries": "key", "unrotate": True},
    "key routing on values": {"route_queries": "key", "route_on": "value", "unrotate": False},
    "query routing": {"route_queries": "query", "unrotate": False},
    "query routing, rotary undone": {"route_queries": "query", "unrotate": True},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--window", type=int, default=64)
    parser.add_argument("--groups", type=int, default=16)
    parser.add_argument("--top-k", type=int, default=2)
    parser.add_argument("--shapes", nargs="*", default=[], help="GROUPSxTOP_K, e.g. 16x2 48x4")
    parser.add_argument("--corpus", default="books", help="the corpus whose validation rows are scored")
    parser.add_argument("--rows", type=int, default=8, help="validation rows scored")
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--tag", default="512")
    args = parser.parse_args()

    model, tokenizer = load_model(PACKAGED_SMOLLM2)
    train = chunk_tokens(tokenize_corpus(load_corpus("books", "train"), tokenizer), args.seq_len)
    validation = chunk_tokens(tokenize_corpus(load_corpus(args.corpus, "validation"), tokenizer), args.seq_len)
    calibration = train[torch.randperm(len(train), generator=torch.Generator().manual_seed(0))[:8]]
    rows = validation[torch.linspace(0, len(validation) - 1, args.rows).long()]  # spread over the split
    found = [{"design": "pretrained (full attention)", "hard_ppl": math.exp(evaluate_loss(model, rows, 4))}]
    designs = {f"{groups} groups, top-{top_k}": {"num_groups": int(groups), "top_k": int(top_k)}
               for groups, top_k in (shape.split("x") for shape in args.shapes)} or DESIGNS
    for name, changes in designs.items():
        tic = time.perf_counter()
        config = FocusConfig(num_groups=args.groups, window=args.window, top_k=args.top_k, mode="hard")
        config = config.replace(**changes)
        apply_focus(model, config, calibration_ids=calibration)
        try:
            recall = distant_attention_recall(model, rows)
            ppl = math.exp(evaluate_loss(model, rows, 4))
        finally:
            remove_focus(model)
        found.append({"design": name, "distant_recall": recall["recall"], "distant_kept": recall["kept"],
                      "oracle_recall": recall["oracle_recall"], "hard_ppl": ppl})
        print(f"{name}: recall {recall['recall']:.3f} of the distant mass at {recall['kept']:.3f} of the pairs "
              f"(oracle {recall['oracle_recall']:.3f}), hard ppl {ppl:.2f} ({time.perf_counter() - tic:.0f} s)")
    frame = pd.DataFrame(found)
    out = Path(args.out)
    shape = "" if args.shapes else f", {args.groups} groups, top-{args.top_k}"
    setting = (f"SmolLM2-135M-Instruct, {args.corpus} validation, {args.rows} rows of {args.seq_len} tokens, window "
               f"{args.window}{shape}, k-means centroids of books train rows (no training), float32")
    write_text(out / f"routing_screen_{args.tag}.csv", frame.to_csv(index=False))
    write_text(out / f"routing_screen_{args.tag}.md", f"{setting}\n\n{markdown_table(frame, '.3f')}\n")
    print((out / f"routing_screen_{args.tag}.md").read_text())


if __name__ == "__main__":
    main()
