"""Recall as the screen (issue 54): the distant attention mass each router keeps at a budget, beside the oracle's.

    .venv/bin/python benchmarks/recall_screen.py --tokens DIR/wikitext2.tokens.safetensors \\
        --routers loki16=indexer:16 loki32=indexer:32 groups=centroids quest=quest streaming=streaming \\
        trained=adapter:runs/idx/adapter --lengths 512 2048 --tag validation
    ... --ppl 0.1 0.3      # also the perplexity of every selecting router at these budgets, and the oracle's
    ... --lengths 4096 --ppl-keys 1024 --ppl-rows 8    # from 4K, at these keys per query (routers only)

A router is NAME=SPEC, the spec as `focus.eval.router_screen.build_router` reads it (indexer:RANK[:kv_head],
centroids, quest, streaming, adapter:FOLDER). Calibration: the first rows of the corpus's train
split, or of the first corpus with one. For each corpus (a `prepare_tokens` file) and length, `--rows` rows of the
split: per budget, layer and key/value head, the mass kept, the oracle's at the same count and the share of pairs
(`focus.eval.recall_screen.routing_recall`). Budgets are shares of each query's distant keys (`--shares`) and, from
4K, counts per query (`--keys`). Writes <out>/recall_screen_<tag>.{csv,md,png} and the per-layer table
recall_screen_<tag>_layers.csv, after every corpus and length.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from focus.eval.recall_report import write_recall_tables
from focus.eval.router_screen import screen_routers
from focus.models import PACKAGED_SMOLLM2, load_model
from focus.pipeline.jobs import read_tokens
from focus.provenance import git_commit


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", nargs="+", required=True, help="prepare_tokens files, one per corpus")
    parser.add_argument("--routers", nargs="+", required=True, help="NAME=SPEC (focus.eval.router_screen)")
    parser.add_argument("--split", default="validation")
    parser.add_argument("--lengths", type=int, nargs="+", default=[512, 2048])
    parser.add_argument("--rows", type=int, nargs="+", default=[8], help="rows per length (one value: for all)")
    parser.add_argument("--shares", type=float, nargs="+", default=[0.05, 0.1, 0.2, 0.3, 0.5])
    parser.add_argument("--keys", type=int, nargs="*", default=[256, 512, 1024, 2048],
                        help="budgets as keys per query, from 4K tokens")
    parser.add_argument("--last-queries", type=int, default=1024,
                        help="from 4K tokens, measure the last this many queries of each row")
    parser.add_argument("--window", type=int, default=128)
    parser.add_argument("--ppl", type=float, nargs="*", default=[],
                        help="also perplexity at these shares (selecting routers and the oracle), below 4K")
    parser.add_argument("--ppl-keys", type=int, nargs="*", default=[],
                        help="also perplexity at these keys per query (selecting routers), from 4K")
    parser.add_argument("--ppl-rows", type=int, default=32)
    parser.add_argument("--no-ppl-oracle", action="store_true", help="not the oracle's perplexity (a test split)")
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--tag", default="validation")
    args = parser.parse_args()

    commit = git_commit()  # now: the checkout may move on while the screen runs
    torch.manual_seed(0)
    model, _ = load_model(PACKAGED_SMOLLM2, dtype=torch.float32)
    calibration = next((read_tokens(path, "train")[: 8 * 512].long().view(8, 512) for path in args.tokens
                        if _has_split(path, "train")), None)
    corpora = {Path(path).name.split(".")[0]: read_tokens(path, args.split) for path in args.tokens}
    rows = args.rows[0] if len(args.rows) == 1 else dict(zip(args.lengths, args.rows))
    out = Path(args.out) / f"recall_screen_{args.tag}"
    screen_routers(model, dict(router.split("=", 1) for router in args.routers), corpora, args.lengths, rows,
                   args.shares, args.keys, args.window, calibration, last_queries=args.last_queries,
                   ppl_shares=args.ppl, ppl_keys=args.ppl_keys, ppl_rows=args.ppl_rows,
                   ppl_oracle=not args.no_ppl_oracle,
                   report=lambda found, layers, scored: write(out, found, layers, scored, args, commit))
    print(out.with_suffix(".md").read_text())


def _has_split(path: str, split: str) -> bool:
    from safetensors import safe_open

    with safe_open(path, "pt") as file:
        return split in file.keys()  # noqa: SIM118 (a safetensors file, not a dict)


def write(out: Path, found, layers, scored, args, commit: str) -> None:
    header = (f"SmolLM2-135M-Instruct, float32, {args.split} split, window {args.window}, sinks 1. Per router and "
              "budget: recall = distant attention mass kept / distant mass (beyond the window, sinks excluded), "
              "oracle_recall = the heaviest distant keys' mass at the same count per query, of_oracle = their ratio, "
              "kept = share of distant pairs. Budgets: shares of each query's distant keys below 4K, keys per query "
              f"from 4K (the last {args.last_queries} queries of each row).")
    write_recall_tables(found, layers, scored or None, out, header, "python " + " ".join(sys.argv), commit)


if __name__ == "__main__":
    main()
