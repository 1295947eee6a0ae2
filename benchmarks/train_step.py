"""Seconds per training step of SmolLM2-135M-Instruct with and without Focus, timed in one process.

    .venv/bin/python benchmarks/train_step.py [--seq-len 512] [--repeats 5] [--out benchmarks/results]

"Without Focus" is the frozen model with the gradient flowing back to its input embeddings, so the
backward pass crosses every layer as it does when training centroids; "Focus soft" is a real
centroid-training step (forward, backward, AdamW). Forward-only rows time inference (no grad).
Medians over repeats after one warm-up; writes <out>/train_step.{csv,md}.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import pandas as pd
import torch

from focus import FocusConfig, apply_focus, focus_parameters, remove_focus, set_focus_mode
from focus.data import load_corpus, tokenize_corpus
from focus.models import PACKAGED_SMOLLM2, load_model
from focus.train.loop import next_token_loss


def median_seconds(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        tic = time.perf_counter()
        fn()
        times.append(time.perf_counter() - tic)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--window", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args()
    model, tokenizer = load_model(PACKAGED_SMOLLM2)
    ids = tokenize_corpus(load_corpus("books", "validation"), tokenizer)[None, : args.seq_len]
    embed = model.get_input_embeddings()

    def base_step():
        inputs = embed(ids).detach().requires_grad_()
        next_token_loss(model(inputs_embeds=inputs).logits, ids).backward()

    def forward():
        with torch.no_grad():
            model(input_ids=ids)

    rows = {"forward, unmodified": median_seconds(forward, args.repeats)}
    rows["train step, unmodified (backward to inputs)"] = median_seconds(base_step, args.repeats)
    apply_focus(model, FocusConfig(window=args.window), calibration_ids=ids)
    optimizer = torch.optim.AdamW(focus_parameters(model), lr=1e-3)

    def focus_step():
        optimizer.zero_grad()
        next_token_loss(model(input_ids=ids).logits, ids).backward()
        optimizer.step()

    rows["train step, Focus soft (centroids)"] = median_seconds(focus_step, args.repeats)
    for mode in ("soft", "hard"):
        set_focus_mode(model, mode)
        rows[f"forward, Focus {mode}"] = median_seconds(forward, args.repeats)
    remove_focus(model)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    base = rows["train step, unmodified (backward to inputs)"]
    frame = pd.DataFrame({"what": list(rows), "seconds": list(rows.values())})
    frame["vs_unmodified_train_step"] = frame["seconds"] / base
    frame.to_csv(out / "train_step.csv", index=False)
    lines = [
        f"SmolLM2-135M-Instruct, batch 1 x {args.seq_len} tokens, float32, window {args.window}, "
        f"{torch.get_num_threads()} CPU threads, median of {args.repeats}",
        "",
        "| what | seconds | vs unmodified train step |",
        "|---|---:|---:|",
    ] + [f"| {name} | {sec:.3f} | {sec / base:.2f}x |" for name, sec in rows.items()]
    (out / "train_step.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
