"""What any routing could reach at Focus's cost: trained Focus hard against the selection oracle on SmolLM2.

    .venv/bin/python benchmarks/oracle_selection.py --adapters results/study/train/smollm2/*/adapter --tag study
    .venv/bin/python benchmarks/oracle_selection.py --adapters .gpu/adapters/mix50_kl10 \\
        --tokens DIR/books_by_book.tokens.safetensors DIR/wikitext2.tokens.safetensors \\
        --shares 0.1 0.2 0.3 --tag floor_validation      # the floor per kept share (DIR: no_worse_screen.py --prepare)

For each corpus (a `prepare_tokens` file, named by its file name; `--split` of it, non-overlapping rows of
`--seq-len`) and each trained adapter: the pretrained model, Focus hard top-k, and the oracle
(`focus.eval.diagnostics.oracle_selection`), which keeps in every layer and query row the same number of distant pairs
as that adapter's hard pattern, but the heaviest by the true attention logits. With `--shares`, also the oracle that
keeps that share of every row's distant pairs (the first adapter's window and sinks; its routing plays no part): the
floor of the trade-off between pairs kept and perplexity, for any routing that chooses pairs as full attention
weighs them. If the oracle is above pretrained, choosing better pairs alone cannot make hard Focus beat the model it
retrofits at that cost. Every ratio to pretrained comes with its 95% interval over the rows (paired: the same rows,
mean per-row difference of log-perplexity +- 1.96 standard errors). Writes <out>/oracle_selection_<tag>.{csv,md}
after every corpus.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import pandas as pd
import torch

from focus import load_focus, remove_focus, set_focus_mode
from focus.artifacts import markdown_table
from focus.eval.diagnostics import distant_attention_recall, oracle_selection
from focus.eval.paired import paired_ratio
from focus.eval.perplexity import row_losses
from focus.files import write_text
from focus.models import PACKAGED_SMOLLM2, load_model
from focus.pipeline.jobs import read_tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--adapters", nargs="+", required=True, type=Path,
                        help="adapter folders (the folder, or its parent where the folder is called adapter, names "
                        "the row)")
    parser.add_argument("--tokens", nargs="+", default=["results/study/data/smollm2/books.safetensors"],
                        help="prepare_tokens files, one per corpus")
    parser.add_argument("--split", default="validation")
    parser.add_argument("--shares", type=float, nargs="*", default=[],
                        help="also the oracle keeping these shares of every row's distant pairs")
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--max-tokens", type=int, default=16384)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--tag", default="study")
    args = parser.parse_args()

    torch.manual_seed(0)
    model, _ = load_model(PACKAGED_SMOLLM2, dtype=getattr(torch, args.dtype))
    found = []
    out = Path(args.out) / f"oracle_selection_{args.tag}"
    for path in map(Path, args.tokens):
        corpus = path.name.split(".")[0]
        ids = read_tokens(path, args.split)[: args.max_tokens]
        rows = ids[: len(ids) // args.seq_len * args.seq_len].view(-1, args.seq_len)
        pretrained = row_losses(model, rows)
        found.append({"corpus": corpus, "design": "pretrained (full attention)", "selection": "full",
                      "ppl": math.exp(pretrained.mean()), "distant_kept": 1.0})
        print(found[-1], flush=True)
        for number, adapter in enumerate(args.adapters):
            design = adapter.parent.name if adapter.name == "adapter" else adapter.name
            load_focus(model, adapter)
            set_focus_mode(model, "hard")
            recall = distant_attention_recall(model, rows[:8], 4)
            selections = [("hard", None, recall["kept"]), ("oracle at the pattern's count", None, recall["kept"])]
            if number == 0:
                selections += [(f"oracle at {share:.0%}", share, share) for share in args.shares]
            for selection, share, kept in selections:
                tic = time.perf_counter()
                if selection == "hard":
                    losses = row_losses(model, rows)
                else:
                    with oracle_selection(model, share=share):
                        losses = row_losses(model, rows)
                found.append({"corpus": corpus, "design": design if share is None else "any routing",
                              "selection": selection, "ppl": math.exp(losses.mean()),
                              **versus("vs_pretrained", losses, pretrained), "distant_kept": kept,
                              "distant_recall": recall["recall"] if selection == "hard" else
                              recall["oracle_recall"] if share is None else float("nan"),
                              "seconds": time.perf_counter() - tic})
                print(found[-1], flush=True)
            remove_focus(model)
        frame = pd.DataFrame(found)
        frame.to_csv(out.with_suffix(".csv"), index=False)
        header = (f"SmolLM2-135M-Instruct, {args.dtype}, {args.split} split: {rows.shape[0]} rows of {args.seq_len} "
                  "tokens per corpus. Hard: the adapter's top-k pattern; oracle: per layer and query row, the "
                  "heaviest distant pairs by the true attention logits (window and sinks as in Focus), as many as "
                  "the pattern keeps in that row or a fixed share of the row's distant pairs. distant_recall: the "
                  "share of the distant attention mass kept (8 rows).\n\n")
        write_text(out.with_suffix(".md"), header + markdown_table(frame, ".4g") + "\n")
    print(out.with_suffix(".md").read_text())


def versus(name: str, losses: torch.Tensor, base: torch.Tensor) -> dict[str, float]:
    """{name, name_low, name_high}: perplexity ratio - 1 of `losses` to `base` on the same rows, 95% interval."""
    return dict(zip((name, f"{name}_low", f"{name}_high"), paired_ratio(losses.tolist(), base.tolist())))


if __name__ == "__main__":
    main()
