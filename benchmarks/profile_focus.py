"""Where the time of a Focus prefill and decoding step goes, against the unmodified model (issue 28).

    .venv/bin/python benchmarks/profile_focus.py --adapter /work/runs/st300/adapter --lengths 4096 8192

SmolLM2 with a trained adapter (or k-means groups of the prompt without one) on a books validation prompt of each
length: one prefill and one decoding step (after 4 warm-up steps), each profiled with torch.profiler, Focus hard
through a FocusCache beside the unmodified model through a GrowingCache (the same in-place cache without Focus).
The Focus code marks its parts (`focus/...` record_function labels): routing, index upkeep, the decomposition's
local part, group sort, group part and merge, the decoding step's key selection; with --compile-step the native
prompt's routing, band, segments, rectangles and merge. Writes
<out>/profile_focus_<tag>.md: per (length, phase, model) the wall time, the `focus/...` parts and the top operators by
self CPU time, plus the group balance the index saw (largest group / mean group, per layer and head); and
<out>/profile_focus_<tag>.csv: one row per (length, phase, model, part), `wall` the whole call.
"""

from __future__ import annotations

import argparse
import platform
import time
from pathlib import Path

import pandas as pd
import torch
from torch.profiler import ProfilerActivity, profile

from focus import apply_focus, load_focus, remove_focus
from focus.attention.cache.decoding import FocusCache
from focus.attention.cache.growing_cache import GrowingCache
from focus.attention.native import kernels
from focus.config import FocusConfig
from focus.data import load_corpus, tokenize_corpus
from focus.files import write_text
from focus.models import PACKAGED_SMOLLM2, load_model
from focus.retrofit import set_focus_mode

TOP = 12


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--adapter", default=None, help="a trained adapter folder; none: k-means of the prompt")
    parser.add_argument("--lengths", type=int, nargs="+", default=[4096, 8192])
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--tag", default="cpu")
    parser.add_argument("--top-k", type=int, default=None, help="hard top-k (default: the adapter's, or 2)")
    parser.add_argument("--compile-step", action="store_true",
                        help="FocusCache(model, native=True): native decoding steps and prefill parts")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    model, tokenizer = load_model(PACKAGED_SMOLLM2, getattr(torch, args.dtype))
    text = tokenize_corpus(load_corpus("books", "validation"), tokenizer)
    header = (f"# Focus against the unmodified model, profiled\n\nSmolLM2-135M-Instruct, {args.dtype}, "
              f"{torch.get_num_threads()} threads, {platform.processor() or platform.machine()}; adapter: "
              f"{args.adapter or 'k-means of the prompt (untrained)'}; top-k {args.top_k or 'of the adapter'}; "
              f"native step and prefill parts: {args.compile_step}; books validation prompts.\n")
    sections, rows = [header], []
    for length in args.lengths:
        ids = text[:length][None]
        with torch.no_grad():
            base = _profiled(model, ids, GrowingCache(config=model.config))
            if args.adapter:
                load_focus(model, args.adapter)
                set_focus_mode(model, "hard", **({"top_k": args.top_k} if args.top_k else {}))
            else:
                apply_focus(model, FocusConfig(num_groups=16, window=64, top_k=args.top_k or 2, mode="hard"),
                            calibration_ids=ids[:, :512])
            try:
                if args.compile_step:
                    kernels()  # built (or loaded) before the profile
                cache = FocusCache(model, native=args.compile_step)
                focus = _profiled(model, ids, cache)
                balance = _balance(cache)
            finally:
                remove_focus(model)
        for phase in ("prefill", "step"):
            for name, run in (("focus", focus), ("unmodified", base)):
                rows += [{"length": length, "phase": phase, "model": name, "part": "wall", "calls": 1,
                          "ms": run[phase]["seconds"] * 1e3},
                         *({"length": length, "phase": phase, "model": name, **part} for part in run[phase]["rows"])]
            ratio = base[phase]["seconds"] / focus[phase]["seconds"]
            sections.append(f"## {length} tokens, {phase}: unmodified {base[phase]['seconds'] * 1e3:.1f} ms, Focus "
                            f"{focus[phase]['seconds'] * 1e3:.1f} ms ({ratio:.2f}x)\n")
            sections.append("Focus parts (inclusive CPU time, summed over layers):\n\n" + focus[phase]["parts"] + "\n")
            for name, run in (("Focus", focus), ("unmodified", base)):
                sections.append(f"{name}, top operators by self CPU time:\n\n```\n{run[phase]['table']}\n```\n")
        sections.append(f"Group balance after the {length}-token prompt (largest group / mean group, over layers and "
                        f"key/value heads): median {balance[0]:.2f}, 90th percentile {balance[1]:.2f}, max "
                        f"{balance[2]:.2f}.\n")
        print("\n".join(sections[-6:]))
    write_text(Path(args.out) / f"profile_focus_{args.tag}.md", "\n".join(sections))
    write_text(Path(args.out) / f"profile_focus_{args.tag}.csv", pd.DataFrame(rows).to_csv(index=False))


def _profiled(model, ids: torch.Tensor, cache) -> dict:
    """{"prefill": ..., "step": ...}, each {"seconds", "table", "parts"}: one prefill into `cache`, then one decoding
    step after 4 unprofiled ones."""
    found = {}
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        tic = time.perf_counter()
        logits = model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1).logits
        seconds = time.perf_counter() - tic
    found["prefill"] = _summary(prof, seconds)
    for _ in range(4):
        logits = model(input_ids=logits[:, -1:].argmax(-1), past_key_values=cache, use_cache=True).logits
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        tic = time.perf_counter()
        model(input_ids=logits[:, -1:].argmax(-1), past_key_values=cache, use_cache=True)
        seconds = time.perf_counter() - tic
    found["step"] = _summary(prof, seconds)
    return found


def _summary(prof, seconds: float) -> dict:
    averages = prof.key_averages()
    parts = sorted((e for e in averages if e.key.startswith("focus/")), key=lambda e: -e.cpu_time_total)
    lines = [f"| {e.key} | {e.count} | {e.cpu_time_total / 1e3:.1f} ms | {e.cpu_time_total / 1e4 / seconds:.0f}% |"
             for e in parts]
    table = "| part | calls | CPU time | of the wall time |\n|---|---:|---:|---:|\n" + "\n".join(lines)
    operators = averages.table(sort_by="self_cpu_time_total", row_limit=TOP, max_name_column_width=48)
    rows = [{"part": e.key, "calls": e.count, "ms": e.cpu_time_total / 1e3} for e in parts]
    return {"seconds": seconds, "table": operators, "parts": table if parts else "(none)", "rows": rows}


def _balance(cache: FocusCache) -> tuple[float, float, float]:
    ratios = []
    for index in cache.indexes.values():
        counts = index.counts.double()  # (B, K, G)
        ratios.append((counts.max(dim=-1).values / counts.mean(dim=-1).clamp_min(1)).flatten())
    ratios = torch.cat(ratios)
    return ratios.median().item(), ratios.quantile(0.9).item(), ratios.max().item()


if __name__ == "__main__":
    main()
