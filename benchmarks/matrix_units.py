"""Hard Focus's bfloat16 prefill with its rectangles on the CPU's matrix units (AMX, `csrc/rectangle_amx.cpp`) against
the same kernels on the vector units (`csrc/rectangle.cpp`, what ran before), beside the unmodified model.

    .venv/bin/python benchmarks/matrix_units.py --adapter FOLDER --top-k 1 2 --lengths 1024 2048 4096 8192

SmolLM2 in bfloat16 with a trained adapter, hard at each top-k, prompts from the books validation split, each prefill
into a fresh native FocusCache (the unmodified model into a GrowingCache): the three sides take turns, `--rounds`
times, medians. Per side the prefill's seconds end to end and inside the attention functions (`attention_clock`:
routing and index upkeep included). Writes <out>/matrix_units.{csv,md}. Needs a CPU with bfloat16 matrix units.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import pandas as pd
import torch

from focus import load_focus, remove_focus, set_focus_mode
from focus.artifacts import markdown_table
from focus.attention.cache.decoding import FocusCache
from focus.attention.cache.growing_cache import GrowingCache
from focus.attention.dispatch.facts import use_matrix_units
from focus.attention.native import kernels
from focus.data import load_corpus, tokenize_corpus
from focus.eval.decode_speed import attention_clock
from focus.files import write_text
from focus.models import PACKAGED_SMOLLM2, load_model
from focus.provenance import device_info
from focus.retrofit import has_focus

SIDES = ("unmodified", "matrix_units", "vector_units")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--adapter", required=True)
    parser.add_argument("--top-k", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048, 4096, 8192])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args()
    ext = kernels()
    if not ext.matrix_units():
        raise SystemExit("this CPU has no bfloat16 matrix units (AMX): nothing to compare")
    model, tokenizer = load_model(PACKAGED_SMOLLM2, torch.bfloat16)
    prompt = tokenize_corpus(load_corpus("books", "validation")[: 8 * max(args.lengths)], tokenizer)[None]
    load_focus(model, args.adapter)  # registers Focus's attention function: the clock below times the registered ones
    remove_focus(model)
    rows = []
    for top_k in args.top_k:
        for length in args.lengths:
            ids = prompt[:, :length]
            seconds = {side: [] for side in SIDES}
            attention = {side: [] for side in SIDES}
            with attention_clock() as clock, torch.no_grad():
                for _ in range(args.rounds):
                    for side in SIDES:
                        if side == "unmodified":
                            if has_focus(model):
                                remove_focus(model)
                            cache = GrowingCache(config=model.config)
                        else:
                            if not has_focus(model):
                                load_focus(model, args.adapter)
                                set_focus_mode(model, "hard", top_k=top_k)
                            cache = FocusCache(model, native=True)
                        before, tic = clock["seconds"], time.perf_counter()
                        with use_matrix_units(side != "vector_units"):  # a fact of the plan: its row says which
                            model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
                        seconds[side].append(time.perf_counter() - tic)
                        attention[side].append(clock["seconds"] - before)
            if has_focus(model):
                remove_focus(model)
            median = {side: sorted(seconds[side])[args.rounds // 2] for side in SIDES}
            inside = {side: sorted(attention[side])[args.rounds // 2] for side in SIDES}
            rows.append({"top_k": top_k, "prompt": length,
                         **{f"{side}_s": median[side] for side in SIDES},
                         **{f"{side}_attention_s": inside[side] for side in SIDES},
                         "matrix_over_vector_attention": inside["vector_units"] / inside["matrix_units"],
                         "attention_speedup_matrix": inside["unmodified"] / inside["matrix_units"],
                         "attention_speedup_vector": inside["unmodified"] / inside["vector_units"],
                         "prefill_speedup_matrix": median["unmodified"] / median["matrix_units"],
                         "prefill_speedup_vector": median["unmodified"] / median["vector_units"]})
            print(rows[-1], flush=True)
            _write(pd.DataFrame(rows), args)


def _write(frame: pd.DataFrame, args) -> None:
    stem = Path(args.out) / "matrix_units"
    write_text(stem.with_suffix(".csv"), frame.to_csv(index=False))
    head = (f"SmolLM2-135M-Instruct prefill, bfloat16, {torch.get_num_threads()} threads, {device_info()['cpu']} "
            f"with AMX; adapter {args.adapter}; native FocusCache; the three sides in turns, medians of "
            f"{args.rounds}. Speedups are unmodified / Focus, `attention` the seconds inside the attention functions "
            "(routing and index upkeep included), `prefill` end to end; `matrix_over_vector_attention` the vector "
            "units' attention seconds over the matrix units'. `benchmarks/matrix_units.py --top-k "
            f"{' '.join(map(str, args.top_k))} --lengths {' '.join(map(str, args.lengths))}`.")
    shown = frame[["top_k", "prompt", "matrix_over_vector_attention", "attention_speedup_matrix",
                   "attention_speedup_vector", "prefill_speedup_matrix", "prefill_speedup_vector"]]
    write_text(stem.with_suffix(".md"), f"{head}\n\n{markdown_table(shown, '.3g')}\n")


if __name__ == "__main__":
    main()
