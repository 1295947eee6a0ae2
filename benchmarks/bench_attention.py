"""Hard Focus attention against full causal attention, timed in one process; writes tables and a figure.

    .venv/bin/python benchmarks/bench_attention.py                       # CPU: 4K-64K, SmolLM2 prefill 4K-16K
    python benchmarks/bench_attention.py --device cuda --dtype bfloat16 --lengths 4096 ... 1048576 --tag h100

Writes <out>/attention_<tag>.{csv,md}, <out>/prefill_<tag>.{csv,md} and <out>/speedup_<tag>.{png,svg}. The
pipeline's bench_attention rule runs the same code with a profile's `benchmark` settings.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from focus.eval.speed import parse_settings
from focus.pipeline.benchmark import run_benchmark


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[4096, 8192, 16384, 32768, 65536])
    parser.add_argument("--settings", nargs="+", default=["16:256:1", "16:256:2", "32:512:1"],
                        help="groups:window:top_k per Focus setting")
    parser.add_argument("--routings", nargs="+", default=["key", "query"], choices=["key", "query", "kv_head"],
                        help="query routings timed (FocusConfig.route_queries)")
    parser.add_argument("--heads", type=int, default=1)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--model", default="smollm2-135m-instruct", help="'' to skip the model prefill")
    parser.add_argument("--prefill-lengths", type=int, nargs="+", default=[4096, 8192, 16384])
    parser.add_argument("--prefill-settings", nargs="+", default=["16:256:1", "16:256:2"])
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--tag", default="cpu")
    args = parser.parse_args()

    settings = {
        "lengths": args.lengths, "settings": parse_settings(args.settings), "heads": args.heads,
        "head_dim": args.head_dim, "dtype": args.dtype, "repeats": args.repeats,
        "prefill_lengths": args.prefill_lengths, "prefill_settings": parse_settings(args.prefill_settings),
        "routings": args.routings,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    attention, prefill = out / f"attention_{args.tag}.csv", out / f"prefill_{args.tag}.csv"
    run_benchmark(settings, args.model or None, attention, prefill, out / f"speedup_{args.tag}.png", args.device)
    print(attention.with_suffix(".md").read_text())
    print(prefill.with_suffix(".md").read_text())


if __name__ == "__main__":
    main()
