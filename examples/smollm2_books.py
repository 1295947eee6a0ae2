"""Demo: retrofit Focus onto SmolLM2-135M-Instruct, train only the centroids on the books corpus,
and compare perplexity before and after (pretrained, Focus soft, Focus hard top-k).

    .venv/bin/python examples/smollm2_books.py [--steps 30] [--out results/demo]

Runs on CPU offline in a few minutes; writes <out>/summary.json, <out>/adapter/ and <out>/train/.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from focus import FocusConfig, apply_focus, focus_parameter_count, save_focus, set_focus_mode
from focus.data import chunk_tokens, load_corpus, tokenize_corpus
from focus.eval.perplexity import perplexity
from focus.models import PACKAGED_SMOLLM2, load_model
from focus.provenance import provenance
from focus.train.config import TrainConfig
from focus.train.loop import train_parameters


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="results/demo")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--window", type=int, default=64)
    parser.add_argument("--eval-tokens", type=int, default=8192)
    args = parser.parse_args()
    out = Path(args.out)
    torch.manual_seed(0)

    model, tokenizer = load_model(PACKAGED_SMOLLM2)
    train = chunk_tokens(tokenize_corpus(load_corpus("books", "train"), tokenizer), args.seq_len)
    test = tokenize_corpus(load_corpus("books", "test"), tokenizer)[: args.eval_tokens]

    def ppl() -> float:
        return perplexity(model, test, context_length=args.seq_len, stride=args.seq_len, progress=False)["ppl"]

    results = {"pretrained": ppl()}
    config = FocusConfig(window=args.window)
    apply_focus(model, config, calibration_ids=train[:8])
    for mode in ("soft", "hard"):
        set_focus_mode(model, mode)
        results[f"focus_{mode}_before_training"] = ppl()
    set_focus_mode(model, "soft")
    tic = time.perf_counter()
    train_config = TrainConfig(steps=args.steps, batch_size=2, lr=1e-2, log_every=5, checkpoint_every=10)
    final = train_parameters(model, train[8:], train_config, out / "train")
    train_seconds = time.perf_counter() - tic
    for mode in ("soft", "hard"):
        set_focus_mode(model, mode)
        results[f"focus_{mode}_after_training"] = ppl()
    save_focus(model, out / "adapter", base_model=PACKAGED_SMOLLM2)

    summary = {
        "perplexity": results,
        "eval": {"corpus": "books/test", "tokens": len(test), "context_length": args.seq_len},
        "focus_config": config.__dict__,
        "trainable_parameters": focus_parameter_count(model),
        "train": {"steps": args.steps, "seconds": round(train_seconds, 1), "final": final},
        "provenance": provenance(),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    print(f"\nSmolLM2-135M-Instruct, books test ({len(test)} tokens, context {args.seq_len}, window {args.window})")
    for name, value in results.items():
        print(f"  {name:28s} perplexity {value:8.3f}")
    print(f"  {focus_parameter_count(model):,} trainable parameters, {train_seconds:.0f} s of training -> {out}")


if __name__ == "__main__":
    main()
