"""What any routing could reach at Focus's cost: trained Focus hard against the selection oracle on SmolLM2.

    .venv/bin/python benchmarks/oracle_selection.py --adapters results/study/train/smollm2/*/adapter --tag study

For each trained adapter, on the books validation split (the study's tokens, non-overlapping rows of the study's
context): the pretrained model, Focus hard top-k, and the oracle (`focus.diagnostics.oracle_selection`), which
keeps in every layer and query row the same number of distant pairs as that adapter's hard pattern, but the
heaviest by the true attention logits. The oracle is the bar for routing at this cost: if it is above pretrained,
choosing better pairs alone cannot make hard Focus beat the model it retrofits. Writes
<out>/oracle_selection_<tag>.{csv,md}.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import pandas as pd
import torch
from safetensors import safe_open

from focus import load_focus, remove_focus, set_focus_mode
from focus.diagnostics import distant_attention_recall, oracle_selection
from focus.files import write_text
from focus.models import PACKAGED_SMOLLM2, load_model
from focus.report import markdown_table
from focus.training import evaluate_loss


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--adapters", nargs="+", required=True, help="adapter folders (their parent names the row)")
    parser.add_argument("--tokens", default="results/study/data/smollm2/books.safetensors")
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--max-tokens", type=int, default=16384)
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--tag", default="study")
    args = parser.parse_args()

    torch.manual_seed(0)
    model, _ = load_model(PACKAGED_SMOLLM2, dtype=torch.float32)
    with safe_open(args.tokens, framework="pt") as f:
        ids = f.get_tensor("validation").long()[: args.max_tokens]
    rows = ids[: len(ids) // args.seq_len * args.seq_len].view(-1, args.seq_len)
    found = [{"design": "pretrained (full attention)", "validation_ppl": math.exp(evaluate_loss(model, rows, 4))}]
    print(found[-1])
    for adapter in map(Path, args.adapters):
        tic = time.perf_counter()
        load_focus(model, adapter)
        set_focus_mode(model, "hard")
        hard = math.exp(evaluate_loss(model, rows, 4))
        with oracle_selection(model):
            oracle = math.exp(evaluate_loss(model, rows, 4))
        recall = distant_attention_recall(model, rows[:8], 4)
        remove_focus(model)
        found.append({"design": adapter.parent.name, "validation_ppl": hard, "oracle_ppl": oracle,
                      "distant_kept": recall["kept"], "distant_recall": recall["recall"],
                      "oracle_recall": recall["oracle_recall"], "seconds": time.perf_counter() - tic})
        print(found[-1])
    frame = pd.DataFrame(found)
    base = found[0]["validation_ppl"]
    frame["hard_vs_pretrained"] = frame["validation_ppl"] / base - 1
    frame["oracle_vs_pretrained"] = frame["oracle_ppl"] / base - 1
    out = Path(args.out) / f"oracle_selection_{args.tag}"
    frame.to_csv(out.with_suffix(".csv"), index=False)
    header = (f"SmolLM2-135M-Instruct, float32, books validation: {rows.shape[0]} rows of {args.seq_len} tokens. Hard: "
              "the adapter's top-k pattern; oracle: per layer and query row, as many distant pairs as that pattern "
              "keeps, the heaviest by the true attention logits (window and sinks as in Focus).\n\n")
    write_text(out.with_suffix(".md"), header + markdown_table(frame, ".4g") + "\n")
    print(out.with_suffix(".md").read_text())


if __name__ == "__main__":
    main()
