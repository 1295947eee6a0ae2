"""One layer's prompt of the per-key indexer (issue 54) against the unmodified model's, in turns, float32.

    .venv/bin/python benchmarks/indexer_prompt.py --lengths 2048 4096 8192 --keys 512 1024 2048

SmolLM2's layer shape (9 query heads, 3 key/value heads of 64), window 128, one sink, rank 32, one selection per
key/value head, `--keys` distant keys per query (one count per length). Sides: `unmodified` (causal SDPA over every
pair, the query heads sharing their key/value head: the model's own prompt), `native_prompt` and `eager_prompt` (the
indexer's prompt rows, `focus.attention.kernels.indexer_prompt`: every causal pair under each block's mask, each query's
threshold by the native histogram or by topk), `router` (the native row's selection alone: key codes, scores,
thresholds and masks, no attention: what any kernel of this selection pays before it attends) and, up to
`--reference-below` keys, `dense_masked` (the whole call's mask, the reference the rows replace).
`pairs_limit` is the unmodified pairs over the pairs the indexer keeps (window, sink and kept keys, causal): the
speedup of a kernel that computed only the kept pairs at the unmodified kernel's rate; `router_bound` that limit with
the router's own time added (unmodified / (unmodified / pairs_limit + router)). Writes
<out>/indexer_prompt.{csv,md}, headed by where and how it was made.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd
import torch
import torch.nn.functional as F

from focus.artifacts import markdown_table
from focus.attention.dispatch.kernel_runs import masked
from focus.attention.kernels.call import AttentionCall
from focus.attention.kernels.indexer_prompt import indexer_prompt_attention, prompt_blocks
from focus.attention.native import kernels
from focus.attention.routers.indexer import KEY_WEIGHTS, QUERY_WEIGHTS, topk_thresholds
from focus.attention.routers.selectors import selected_pairs
from focus.config import FocusConfig
from focus.eval.speed import interleaved_seconds
from focus.files import write_text
from focus.provenance import provenance_line

HEADS, K_HEADS, D, WINDOW = 9, 3, 64, 128


class Layer(torch.nn.Module):
    def __init__(self, rank: int, keys: int):
        super().__init__()
        self.focus_config = FocusConfig(mode="hard", window=WINDOW, sink_tokens=1, selector="indexer",
                                        indexer_rank=rank, budget_keys=keys, route_queries="kv_head")
        setattr(self, QUERY_WEIGHTS, torch.nn.Parameter(torch.randn(HEADS, D, rank) / D**0.5))
        setattr(self, KEY_WEIGHTS, torch.nn.Parameter(torch.randn(K_HEADS, D, rank) / D**0.5))


def kept_pairs(length: int, keys: int) -> int:
    """Pairs a causal prompt of `length` keeps per head: each query its window (with itself), its sink and up to
    `keys` of its distant keys."""
    total = 0
    for position in range(length):
        local = min(position + 1, WINDOW)
        total += local + min(position + 1 - local, keys + 1)  # (+1: the sink, among the keys before the window)
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[2048, 4096, 8192])
    parser.add_argument("--keys", type=int, nargs="+", default=[512, 1024, 2048], help="distant keys per query")
    parser.add_argument("--rank", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--reference-below", type=int, default=4097, help="time dense_masked below this length")
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args()
    if len(args.keys) != len(args.lengths):
        parser.error("--keys: one count per length")
    torch.manual_seed(0)
    native = kernels().indexer_thresholds
    rows = []
    for length, keys in zip(args.lengths, args.keys):
        layer = Layer(args.rank, keys).requires_grad_(False)
        query = torch.randn(1, HEADS, length, D)
        key, value = torch.randn(1, K_HEADS, length, D), torch.randn(1, K_HEADS, length, D)
        call = AttentionCall(query, key, value, None, None, 0.0, None, None)
        sides = {
            "unmodified": lambda: F.scaled_dot_product_attention(query, key, value, is_causal=True, enable_gqa=True),
            "native_prompt": lambda: indexer_prompt_attention(layer, call, native),
            "eager_prompt": lambda: indexer_prompt_attention(layer, call, topk_thresholds),
            "router": lambda: sum(1 for _ in prompt_blocks(layer, call, native)),
        }
        if length < args.reference_below:
            sides["dense_masked"] = lambda: masked(call, selected_pairs(layer, query, key, None, None))
        with torch.no_grad():
            seconds = dict(zip(sides, interleaved_seconds(list(sides.values()), args.repeats, torch.device("cpu"))))
        limit = (length * (length + 1) / 2) / kept_pairs(length, keys)
        base = seconds["unmodified"]
        row = {"keys": length, "keys_per_query": keys, "pairs_limit": limit,
               **{f"{side}_ms": 1e3 * s for side, s in seconds.items()},
               **{f"{side}_speedup": base / s for side, s in seconds.items() if side not in ("unmodified", "router")},
               "router_bound": base / (base / limit + seconds["router"])}
        rows.append(row)
        print({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}, flush=True)
    out = Path(args.out)
    frame = pd.DataFrame(rows)
    frame.to_csv(out / "indexer_prompt.csv", index=False)
    command = "python " + " ".join(sys.argv)
    write_text(out / "indexer_prompt.md", f"{provenance_line(command)}\n\nOne SmolLM2-shaped layer's prompt (9/3 heads "
               f"of 64), window {WINDOW}, 1 sink, indexer rank {args.rank}, one selection per key/value head, "
               f"float32, median of {args.repeats} rounds in turns; ms per prompt. `pairs_limit`: unmodified pairs "
               f"over kept pairs; `router_bound`: that limit with the router's own time added.\n\n"
               f"{markdown_table(frame, '.3g')}\n")


if __name__ == "__main__":
    main()
