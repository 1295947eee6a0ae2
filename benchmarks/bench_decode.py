"""Focus decoding through the cache's group index against full attention over the cache, timed in one process.

    .venv/bin/python benchmarks/bench_decode.py                     # CPU: one layer 4K-64K, SmolLM2 generate 4K-16K
    python benchmarks/bench_decode.py --device cuda --dtype bfloat16 --tag h100
    .venv/bin/python benchmarks/bench_decode.py --cache-lengths 4096 --prompt-lengths 1024 2048 4096 8192 \
        --generate-settings 16:64:1 16:64:2 --adapter /work/runs/st300/adapter --text books:validation --tag trained

Writes <out>/decode_step_<tag>.{csv,md}, <out>/generate_<tag>.{csv,md} and <out>/decode_speedup_<tag>.{png,svg}.
The pipeline's bench_decode rule runs the same code with a profile's `benchmark.decode` settings.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from focus.eval.speed import parse_settings
from focus.pipeline.benchmark import run_decode_benchmark


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cache-lengths", type=int, nargs="+", default=[4096, 8192, 16384, 32768, 65536])
    parser.add_argument("--settings", nargs="+", default=["16:256:1", "16:256:2"], help="groups:window:top_k")
    parser.add_argument("--head-layouts", nargs="+", default=["1:1", "9:3"], help="query heads:key/value heads")
    parser.add_argument("--routings", nargs="+", default=["query"], choices=["query", "kv_head"],
                        help="one-layer rows: query heads route apart (query) or per key/value head (kv_head)")
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--model", default="smollm2-135m-instruct", help="'' to skip generate()")
    parser.add_argument("--prompt-lengths", type=int, nargs="+", default=[4096, 8192, 16384])
    parser.add_argument("--generate-settings", nargs="+", default=["16:256:1", "16:256:2"])
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--adapter", default=None, help="a trained Focus adapter for generate() (default: k-means "
                        "centroids of the prompt)")
    parser.add_argument("--text", default=None, help="prompts from this corpus split, e.g. books:validation "
                        "(default: random tokens)")
    parser.add_argument("--kernels", choices=["auto", "native", "eager"], default="auto", help="the FocusCache's "
                        "kernels: the library's default (native on the CPU where they apply), native, or eager; "
                        "one-layer rows on the CPU get a native_s column unless eager")
    parser.add_argument("--compile-step", action="store_true", help="the former name of --kernels native")
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--tag", default="cpu")
    args = parser.parse_args()

    settings = {
        "cache_lengths": args.cache_lengths, "settings": parse_settings(args.settings),
        "head_layouts": parse_settings(args.head_layouts, "query heads:key/value heads"),
        "head_dim": args.head_dim, "dtype": args.dtype, "repeats": args.repeats, "prompt_lengths": args.prompt_lengths,
        "generate_settings": parse_settings(args.generate_settings), "new_tokens": args.new_tokens,
        "adapter": args.adapter, "text": args.text, "routings": args.routings,
        "native": True if args.compile_step else {"auto": None, "native": True, "eager": False}[args.kernels],
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    steps, generated = out / f"decode_step_{args.tag}.csv", out / f"generate_{args.tag}.csv"
    run_decode_benchmark(settings, args.model or None, steps, generated, out / f"decode_speedup_{args.tag}.png",
                         args.device)
    print(steps.with_suffix(".md").read_text())
    print(generated.with_suffix(".md").read_text())


if __name__ == "__main__":
    main()
