"""What any routing could reach at Focus's cost: trained Focus hard against the selection oracle on SmolLM2.

    .venv/bin/python benchmarks/oracle_selection.py --adapters results/study/train/smollm2/*/adapter --tag study

For each trained adapter, on the books validation split (the study's tokens, non-overlapping rows of the study's
context): the pretrained model, Focus hard top-k, and the oracle (`focus.eval.diagnostics.oracle_selection`), which
keeps in every layer and query row the same number of distant pairs as that adapter's hard pattern, but the
heaviest by the true attention logits. The oracle is the bar for routing at this cost: if it is above pretrained,
choosing better pairs alone cannot make hard Focus beat the model it retrofits. Every ratio to pretrained comes
with its 95% interval over the rows (paired: the same rows, mean per-row difference of log-perplexity +- 1.96
standard errors). Writes <out>/oracle_selection_<tag>.{csv,md}.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import pandas as pd
import torch
import torch.nn.functional as F
from safetensors import safe_open

from focus import load_focus, remove_focus, set_focus_mode
from focus.artifacts import markdown_table
from focus.eval.diagnostics import distant_attention_recall, oracle_selection
from focus.eval.perplexity import paired_ratio
from focus.files import write_text
from focus.models import PACKAGED_SMOLLM2, load_model


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
    pretrained = row_losses(model, rows)
    found = [{"design": "pretrained (full attention)", "validation_ppl": math.exp(pretrained.mean())}]
    print(found[-1])
    for adapter in map(Path, args.adapters):
        tic = time.perf_counter()
        load_focus(model, adapter)
        set_focus_mode(model, "hard")
        hard = row_losses(model, rows)
        with oracle_selection(model):
            oracle = row_losses(model, rows)
        recall = distant_attention_recall(model, rows[:8], 4)
        remove_focus(model)
        found.append({"design": adapter.parent.name, "validation_ppl": math.exp(hard.mean()),
                      **versus("hard_vs_pretrained", hard, pretrained), "oracle_ppl": math.exp(oracle.mean()),
                      **versus("oracle_vs_pretrained", oracle, pretrained),
                      "distant_kept": recall["kept"], "distant_recall": recall["recall"],
                      "oracle_recall": recall["oracle_recall"], "seconds": time.perf_counter() - tic})
        print(found[-1])
    frame = pd.DataFrame(found)
    out = Path(args.out) / f"oracle_selection_{args.tag}"
    frame.to_csv(out.with_suffix(".csv"), index=False)
    header = (f"SmolLM2-135M-Instruct, float32, books validation: {rows.shape[0]} rows of {args.seq_len} tokens. Hard: "
              "the adapter's top-k pattern; oracle: per layer and query row, as many distant pairs as that pattern "
              "keeps, the heaviest by the true attention logits (window and sinks as in Focus).\n\n")
    write_text(out.with_suffix(".md"), header + markdown_table(frame, ".4g") + "\n")
    print(out.with_suffix(".md").read_text())


@torch.no_grad()
def row_losses(model, rows: torch.Tensor, batch_size: int = 4) -> torch.Tensor:
    """(N,) float64 mean next-token loss of each row: rows are equally long, so their mean is the split's loss."""
    model.eval()
    losses = []
    for chunk in rows.split(batch_size):
        logits = model(input_ids=chunk, use_cache=False).logits[:, :-1].float()
        losses.append(F.cross_entropy(logits.transpose(1, 2), chunk[:, 1:], reduction="none").mean(dim=1).double())
    return torch.cat(losses)


def versus(name: str, losses: torch.Tensor, base: torch.Tensor) -> dict[str, float]:
    """{name, name_low, name_high}: perplexity ratio - 1 of `losses` to `base` on the same rows, 95% interval."""
    return dict(zip((name, f"{name}_low", f"{name}_high"), paired_ratio(losses.tolist(), base.tolist())))


if __name__ == "__main__":
    main()
