"""The per-key indexer's decoding in a whole model (issue 54): SmolLM2's greedy steps after a long prompt, the indexer's
FocusCache (its native step) against the unmodified model's in-place cache, in turns, float32.

    .venv/bin/python benchmarks/indexer_generate.py --adapter RUN/adapter --lengths 4096 8192 --keys 1024 2048

The prompt is attended unmodified on both sides (the indexer's cache is filled with a window as long as the prompt:
its prompt kernel is still the dense masked reference, minutes at 8K on a CPU, so prefill is not compared here); then
each side decodes `--new-tokens` tokens from the same state, `--rounds` times in turns (each cache cropped back after
its round), and reports its median. The indexer keeps `--keys` distant keys per query (one count per length), the
window 128 and its sink. Without an adapter the indexer is Loki's (principal directions of the prompt's keys). Writes
<out>/indexer_generate.{csv,md}, headed by where and how it was made.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import pandas as pd
import torch

from focus import FocusConfig, apply_focus, load_focus, set_focus_mode
from focus.artifacts import markdown_table
from focus.attention.cache.decoding import FocusCache
from focus.attention.cache.growing_cache import GrowingCache
from focus.attention.native import kernels_built
from focus.files import write_text
from focus.models import PACKAGED_SMOLLM2, load_model
from focus.pipeline.jobs import read_tokens
from focus.provenance import provenance_line
from focus.retrofit import focus_disabled


def decode_seconds(model, logits: torch.Tensor, new_tokens: int, cache) -> float:
    """Seconds of `new_tokens` greedy steps through `cache` from the prompt's last `logits`; the cache cropped back."""
    tic = time.perf_counter()
    for _ in range(new_tokens):
        logits = model(input_ids=logits[:, -1:].argmax(dim=-1), past_key_values=cache, use_cache=True).logits
    seconds = time.perf_counter() - tic
    cache.crop(-new_tokens)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--adapter", default=None, help="a trained indexer adapter (default: Loki, rank 32)")
    parser.add_argument("--lengths", type=int, nargs="+", default=[4096, 8192])
    parser.add_argument("--keys", type=int, nargs="+", default=[1024, 2048], help="distant keys per query, per length")
    parser.add_argument("--tokens", default=None, help="a prepare_tokens file whose validation split gives the prompts "
                        "(default: random tokens)")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args()
    if len(args.keys) != len(args.lengths):
        parser.error("--keys: one count per length")
    kernels_built(required=True)  # built here, not in the first timed step
    model, _ = load_model(PACKAGED_SMOLLM2, dtype=torch.float32)
    text = None if args.tokens is None else read_tokens(args.tokens, "validation").long()[None]
    rows = []
    for length, keys in zip(args.lengths, args.keys):
        ids = (torch.randint(0, model.config.vocab_size, (1, length), generator=torch.Generator().manual_seed(length))
               if text is None else text[:, :length])
        if args.adapter:
            load_focus(model, args.adapter)
        else:
            apply_focus(model, FocusConfig(selector="indexer", indexer_rank=32, route_queries="kv_head"),
                        calibration_ids=ids[:, :512])
        window = 128
        with torch.no_grad():
            with focus_disabled(model):
                plain = GrowingCache(config=model.config)
                plain_logits = model(input_ids=ids, past_key_values=plain, use_cache=True).logits[:, -1:]
            set_focus_mode(model, "hard", window=length + args.new_tokens)  # the prompt unmodified, its codes kept
            cache = FocusCache(model)
            focus_logits = model(input_ids=ids, past_key_values=cache, use_cache=True).logits[:, -1:]
            set_focus_mode(model, "hard", window=window, budget_keys=keys)
            unmodified, indexer = [], []
            for _ in range(args.rounds):
                indexer.append(decode_seconds(model, focus_logits, args.new_tokens, cache))
                with focus_disabled(model):
                    unmodified.append(decode_seconds(model, plain_logits, args.new_tokens, plain))
        base, mine = statistics.median(unmodified), statistics.median(indexer)
        rows.append({"prompt": length, "keys_per_query": keys, "distant_share": keys / max(length - window - 1, 1),
                     "new_tokens": args.new_tokens, "unmodified_tok_s": args.new_tokens / base,
                     "indexer_tok_s": args.new_tokens / mine, "decode_speedup": base / mine,
                     "adapter": args.adapter or "loki32"})
        print(rows[-1], flush=True)
    frame = pd.DataFrame(rows)
    out = Path(args.out)
    frame.to_csv(out / "indexer_generate.csv", index=False)
    command = "python " + " ".join(sys.argv)
    write_text(out / "indexer_generate.md", f"{provenance_line(command)}\n\nSmolLM2-135M greedy decoding after a "
               f"prompt, float32: the indexer's FocusCache (native step, window {window}, one sink, `keys_per_query` "
               f"distant keys) against the unmodified model's in-place cache, median of {args.rounds} rounds of "
               f"{args.new_tokens} tokens in turns; both prompts attended unmodified.\n\n"
               f"{markdown_table(frame, '.3g')}\n")


if __name__ == "__main__":
    main()
