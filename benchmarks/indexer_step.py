"""One layer's decoding step of the per-key indexer (issue 54) against the unmodified step, in turns, float32.

    .venv/bin/python benchmarks/indexer_step.py --lengths 2048 4096 8192 16384 --budgets 0.1 0.25

SmolLM2's layer shape (9 query heads, 3 key/value heads of 64), window 128, one sink, one selection per key/value
head. Sides, each the step of one token over a cache of L keys: `unmodified` (PyTorch SDPA over every key, as the
model attends, the query heads of a key/value head folded into its queries: the fastest dense step here),
`indexer_step` (scores from the cached rank-r key codes, top-k, gather, SDPA over the kept keys:
`focus.attention.routers.indexer.indexer_decode_attention`, the router's cost included), `native_step` (the same as one
native call: `csrc/indexer_step.cpp`, partial selection, the kept keys read in place) and `selected_mask` (the indexer's
selection as a mask over the whole cache: the path selectors take without a step kernel). Writes
<out>/indexer_step.{csv,md}, headed by where and how it was made.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd
import torch
import torch.nn.functional as F

from focus.artifacts import markdown_table
from focus.attention.native import kernels
from focus.attention.pattern.reference import dense_attention
from focus.attention.routers.indexer import KEY_WEIGHTS, QUERY_WEIGHTS, indexer_decode_attention, key_codes
from focus.attention.routers.selectors import selected_pairs
from focus.config import FocusConfig
from focus.eval.speed import interleaved_seconds
from focus.files import write_text
from focus.provenance import provenance_line

HEADS, K_HEADS, D = 9, 3, 64


class Layer(torch.nn.Module):
    def __init__(self, rank: int, budget: float):
        super().__init__()
        self.focus_config = FocusConfig(mode="hard", window=128, sink_tokens=1, selector="indexer", indexer_rank=rank,
                                        budget=budget, route_queries="kv_head")
        setattr(self, QUERY_WEIGHTS, torch.nn.Parameter(torch.randn(HEADS, D, rank) / D**0.5))
        setattr(self, KEY_WEIGHTS, torch.nn.Parameter(torch.randn(K_HEADS, D, rank) / D**0.5))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[2048, 4096, 8192, 16384])
    parser.add_argument("--budgets", type=float, nargs="+", default=[0.1, 0.25])
    parser.add_argument("--rank", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args()
    torch.manual_seed(0)
    native = kernels()
    rows = []
    for length in args.lengths:
        query = torch.randn(1, HEADS, 1, D)
        key, value = torch.randn(1, K_HEADS, length, D), torch.randn(1, K_HEADS, length, D)
        for budget in args.budgets:
            layer = Layer(args.rank, budget).requires_grad_(False)
            codes = key_codes(layer, key)
            w_q = getattr(layer, QUERY_WEIGHTS).detach()
            pairs = selected_pairs(layer, query, key, None, None)
            with torch.no_grad():
                seconds = interleaved_seconds([
                    lambda: F.scaled_dot_product_attention(query.view(1, K_HEADS, -1, D), key, value),
                    lambda: indexer_decode_attention(layer, query, key, value, codes, None, None),
                    lambda: native.indexer_step(query, key, value, codes, w_q, None, 128, 1, budget, 0, True, None),
                    lambda: dense_attention(query, key, value, selected_pairs(layer, query, key, None, None), None),
                ], args.repeats, torch.device("cpu"))
            unmodified, step, native_step, masked = seconds
            rows.append({"keys": length, "budget": budget, "kept_per_query": int(pairs[0, 0, 0].sum()),
                         "unmodified_ms": 1e3 * unmodified, "indexer_step_ms": 1e3 * step,
                         "native_step_ms": 1e3 * native_step, "selected_mask_ms": 1e3 * masked,
                         "step_speedup": unmodified / step, "native_speedup": unmodified / native_step,
                         "mask_speedup": unmodified / masked})
            print(rows[-1], flush=True)
    out = Path(args.out)
    frame = pd.DataFrame(rows)
    frame.to_csv(out / "indexer_step.csv", index=False)
    command = "python " + " ".join(sys.argv)
    write_text(out / "indexer_step.md", f"{provenance_line(command)}\n\nOne SmolLM2-shaped layer (9/3 heads of 64), "
               f"window 128, 1 sink, indexer rank {args.rank}, one selection per key/value head, float32, median of "
               f"{args.repeats} rounds in turns; ms per step.\n\n{markdown_table(frame, '.3f')}\n")


if __name__ == "__main__":
    main()
