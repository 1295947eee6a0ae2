"""Focus's speed in the anchors' form (issue 47, part 3): attention-only beside end to end, per top-k, with the
physical limit and the crossover length.

    .venv/bin/python benchmarks/speed_anchors.py --adapter FOLDER --top-k 1 2 4 --lengths 512 1024 2048 4096 8192

SmolLM2 with a trained adapter (its groups; top-k as each row asks), greedy decoding after books validation prompts
(`focus.eval.decode_speed.generate_rows`, native FocusCache): Focus hard against the unmodified model, in turns,
medians of `--rounds`. Per prompt length and top-k: the prefill's and the decoding's end-to-end speedup and their
attention-only speedup (the seconds inside the attention functions, Focus's routing and index upkeep included:
`attention_clock`). The physical limit of the attention-only speedup is the pairs the unmodified model computes
over the pairs Focus keeps (prefill: the causal pairs; a decoding step: the cached keys), Focus's from the share of
distant pairs it keeps on the prompt's first 2,048 tokens (`distant_attention_recall`); "of_limit" is the measured
speedup over it. The crossover is the shortest length from which every longer one is faster end to end. Writes
<out>/speed_anchors_<tag>.{csv,md}.
"""

from __future__ import annotations

import argparse
import platform
from pathlib import Path

import pandas as pd
import torch

from focus import load_focus, remove_focus, set_focus_mode
from focus.artifacts import markdown_table
from focus.data import load_corpus, tokenize_corpus
from focus.eval.decode_speed import generate_rows
from focus.eval.diagnostics import distant_attention_recall
from focus.files import write_text
from focus.models import PACKAGED_SMOLLM2, load_model
from focus.retrofit import focus_config


def fast_bfloat16() -> bool:
    """Whether this CPU has bfloat16 arithmetic in hardware (AVX-512 BF16 or AMX): bfloat16 is then the fast dtype."""
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    return any(flag in flags.split() for flag in ("avx512_bf16", "amx_bf16"))


def cpu_name() -> str:
    """The CPU's model name (Linux), else the machine's architecture."""
    info = Path("/proc/cpuinfo")
    names = [line.split(":", 1)[1].strip() for line in (info.read_text().splitlines() if info.exists() else [])
             if line.startswith("model name")]
    return names[0] if names else platform.machine()


def pairs_kept(length: int, window: int, sinks: int, kept: float) -> tuple[float, float]:
    """(prefill, decoding step) share of the unmodified model's pairs Focus computes at `length` tokens: the window,
    the sinks and `kept` of the distant pairs."""
    causal = length * (length + 1) / 2
    local = sum(min(i + 1, window) for i in range(length))
    sink = sum(max(0, min(sinks, i + 1 - window)) for i in range(length))
    prefill = (local + sink + kept * (causal - local - sink)) / causal
    distant_step = max(0, length - window - sinks)
    step = (length - distant_step * (1 - kept)) / length
    return prefill, step


def crossover(frame: pd.DataFrame, column: str) -> int | None:
    """The shortest prompt from which Focus is faster end to end (`column` > 1 there and at every longer one)."""
    faster = frame.sort_values("prompt")
    lengths, ratios = faster["prompt"].tolist(), faster[column].tolist()
    for i, length in enumerate(lengths):
        if all(r > 1 for r in ratios[i:]):
            return length
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--adapter", required=True)
    parser.add_argument("--top-k", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--lengths", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192])
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dtype", default=None, help="default: bfloat16 where the CPU has it in hardware, else "
                        "float32")
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--tag", default="cpu")
    args = parser.parse_args()
    dtype = args.dtype or ("bfloat16" if fast_bfloat16() else "float32")
    model, tokenizer = load_model(PACKAGED_SMOLLM2, getattr(torch, dtype))
    prompt = tokenize_corpus(load_corpus("books", "validation")[: 8 * max(args.lengths)], tokenizer)[None]
    rows = []
    for top_k in args.top_k:
        load_focus(model, args.adapter)
        set_focus_mode(model, "hard", top_k=top_k)
        config = focus_config(model)
        with torch.no_grad():
            kept = distant_attention_recall(model, prompt[:, :2048], batch_size=1)["kept"]
        remove_focus(model)
        for row in generate_rows(model, args.lengths, [(config.num_groups, config.window, top_k)], args.new_tokens,
                                 adapter=args.adapter, prompt_ids=prompt, native=True, rounds=args.rounds):
            prefill, step = pairs_kept(row["prompt"], config.window, config.sink_tokens, kept)
            rows.append({**row, "distant_kept": kept, "prefill_limit": 1 / prefill, "decode_limit": 1 / step,
                         "prefill_of_limit": row["prefill_attention_speedup"] * prefill,
                         "decode_of_limit": row["decode_attention_speedup"] * step})
            frame = pd.DataFrame(rows)
            _write(frame, args, dtype)


def _write(frame: pd.DataFrame, args, dtype: str) -> None:
    out = Path(args.out)
    stem = out / f"speed_anchors_{args.tag}"
    write_text(stem.with_suffix(".csv"), frame.to_csv(index=False))
    shown = frame[["top_k", "prompt", "distant_kept", "prefill_attention_speedup", "prefill_limit", "prefill_of_limit",
                   "prefill_speedup", "decode_attention_speedup", "decode_limit", "decode_of_limit",
                   "decode_speedup"]]
    def start(part: pd.DataFrame, column: str) -> str:
        length = crossover(part, column)
        return f"from {length}" if length is not None else f"never up to {part['prompt'].max()}"

    crossings = [f"top-{k}: prefill {start(part, 'prefill_speedup')}, decoding {start(part, 'decode_speedup')}"
                 for k, part in frame.groupby("top_k")]
    head = (f"SmolLM2-135M-Instruct, {dtype}, {torch.get_num_threads()} threads, {cpu_name()} "
            f"({'bfloat16 in hardware' if fast_bfloat16() else 'no bfloat16 in hardware'}); adapter {args.adapter}; "
            f"native FocusCache, {args.new_tokens} new tokens, medians of {args.rounds} rounds in turns. Speedups are "
            f"unmodified / Focus: `*_attention_speedup` the seconds inside the attention functions (Focus's routing "
            f"and index upkeep included), `*_speedup` end to end; `*_limit` the pairs the unmodified model computes "
            f"over those Focus keeps; `*_of_limit` the attention-only speedup over that limit. "
            f"`benchmarks/speed_anchors.py --top-k {' '.join(map(str, args.top_k))} --lengths "
            f"{' '.join(map(str, args.lengths))}`.\n\nCrossover (faster end to end from this prompt length on): "
            + "; ".join(crossings) + ".")
    write_text(stem.with_suffix(".md"), f"{head}\n\n{markdown_table(shown, '.3g')}\n")


if __name__ == "__main__":
    main()
