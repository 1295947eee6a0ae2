"""Forgetting screen (issue 27): trained adapters' hard models against the pretrained model, on the training domain,
another domain and pass-key retrieval, with the N key/value heads Focus hurts most kept dense.

    .venv/bin/python benchmarks/forgetting_screen.py --adapter st=/work/runs/st300/adapter --dense 0 4 8
    .venv/bin/python benchmarks/forgetting_screen.py --adapter st=... --dense 6 --split test --tag test   # once
    .venv/bin/python benchmarks/forgetting_screen.py --adapter d8kl=... --own-heads --append   # trained with heads

Which heads: on pass-key prompts built from the books TRAIN split (never the scored text), `--select retrieval` (the
default) ranks key/value heads by the attention mass the prompt's last 8 queries put on the needle in the pretrained
model (`heads_by_needle_attention`: retrieval heads); `--select lost` by the share of their attention mass that the
hard pattern drops (`heads_by_lost_attention`). The N first are kept dense; `--own-heads` keeps those an adapter
was trained with. Scored on `--split` (validation chooses; test reports once): books and WikiText-2 perplexity (context
512, each ratio to pretrained with its paired 95% interval over windows), pass-key trials at each length on books
filler of that split (greedy answer correct, and the key's mean log-probability), and the share of distant pairs the
hard pattern keeps (dense heads keep all theirs) on 8 rows of 512 tokens. Writes <out>/forgetting_screen_<tag>.{csv,md}.
"""

from __future__ import annotations

import argparse
import random
import time
from pathlib import Path

import pandas as pd
import torch

from focus import focus_config, load_focus, remove_focus, set_focus_mode
from focus.artifacts import markdown_table
from focus.data import chunk_tokens, load_corpus, tokenize_corpus
from focus.eval.diagnostics import (
    distant_attention_recall,
    heads_by_loss,
    heads_by_lost_attention,
    heads_by_needle_attention,
)
from focus.eval.needle import needle_prompt, needle_trials
from focus.eval.paired import paired_ratio
from focus.eval.perplexity import perplexity
from focus.files import write_text
from focus.models import PACKAGED_SMOLLM2, load_model

DEPTHS = [0.1, 0.3, 0.5, 0.7, 0.9]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--adapter", action="append", required=True, help="NAME=FOLDER, repeatable")
    parser.add_argument("--dense", type=int, nargs="+", default=[0], help="key/value heads kept dense")
    parser.add_argument("--split", default="validation")
    parser.add_argument("--max-tokens", type=int, default=16384)
    parser.add_argument("--needle-lengths", type=int, nargs="+", default=[1024, 2048, 4096])
    parser.add_argument("--needle-trials", type=int, default=2, help="per depth (5 depths)")
    parser.add_argument("--select-prompts", type=int, default=4)
    parser.add_argument("--select-length", type=int, default=2048)
    parser.add_argument("--select", choices=["retrieval", "lost", "loss"], default="retrieval",
                        help="loss: heads whose density lowers the WikiText-2 TRAIN loss most (on --select-prompts "
                        "rows of 512)")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--tag", default="validation")
    parser.add_argument("--base-cache", default=None, help="a file keeping the pretrained model's scores between runs")
    parser.add_argument("--own-heads", action="store_true",
                        help="score each adapter with the dense heads it was trained with (no --dense, no choosing)")
    parser.add_argument("--window", type=int, default=None,
                        help="score with this local window instead of the adapter's (an inference-time change)")
    parser.add_argument("--append", action="store_true",
                        help="keep the rows already in the table (not the pretrained one)")
    args = parser.parse_args()

    model, tokenizer = load_model(PACKAGED_SMOLLM2, getattr(torch, args.dtype))
    tokens = {name: tokenize_corpus(load_corpus(name, args.split), tokenizer) for name in ("books", "wikitext2")}
    train_filler = tokenize_corpus(load_corpus("books", "train"), tokenizer)
    rng = random.Random(1)
    prompts = [needle_prompt(tokenizer, train_filler, args.select_length, rng.choice(DEPTHS), rng)
               for _ in range(args.select_prompts)]
    select_rows, spans = torch.stack([p[0] for p in prompts]), [p[4] for p in prompts]
    kept_rows = chunk_tokens(tokens["books"], 512)
    kept_rows = kept_rows[torch.linspace(0, len(kept_rows) - 1, 8).long()]

    def score() -> dict:
        tic = time.perf_counter()
        found = {}
        for name, ids in tokens.items():
            found[name] = perplexity(model, ids[: args.max_tokens], 512, 512, batch_size=4, progress=False)
        trials = needle_trials(model, tokenizer, tokens["books"], args.needle_lengths, DEPTHS, args.needle_trials,
                               progress=False)
        for length in args.needle_lengths:
            at = [t for t in trials if t["length"] == length]
            found[f"needle_{length}"] = f"{sum(t['correct'] for t in at)}/{len(at)}"
            found[f"key_logprob_{length}"] = sum(t["key_logprob"] for t in at) / len(at)
        found["seconds"] = time.perf_counter() - tic
        return found

    cache = Path(args.base_cache) if args.base_cache else None
    if cache is not None and cache.exists():
        base = torch.load(cache)
    else:
        with torch.no_grad():
            base = score()
        if cache is not None:
            torch.save(base, cache)
    rows = [_row("pretrained", 0, base, base, None, [], "")]
    earlier = Path(args.out) / f"forgetting_screen_{args.tag}.csv"
    if args.append and earlier.exists():
        kept = pd.read_csv(earlier).fillna({"select": "", "dense_heads": ""})
        rows += [row for row in kept.to_dict("records") if row["adapter"] != "pretrained"]
    print(rows[-1])
    for spec in args.adapter:
        name, folder = spec.split("=", 1)
        load_focus(model, folder)
        if args.own_heads:
            trained = list(focus_config(model).dense_heads)
            choices = [(len(trained), trained, "trained")]
        else:
            set_focus_mode(model, "hard", dense_heads=[])
            with torch.no_grad():
                if args.select == "retrieval":
                    ranking = heads_by_needle_attention(model, select_rows, spans)
                elif args.select == "lost":
                    ranking = heads_by_lost_attention(model, select_rows)
                else:  # WikiText-2's own train split (the mirror has only its validation and test splits)
                    loss_rows = chunk_tokens(tokenize_corpus(load_corpus("wikitext2", "train")[:200_000], tokenizer), 512)
                    ranking = heads_by_loss(model, loss_rows[:: max(1, len(loss_rows) // args.select_prompts)])
            print("heads, most first:", ranking[:12])
            choices = [(count, [head for head, _ in ranking[:count]], args.select if count else "")
                       for count in args.dense]
        for count, heads, select in choices:
            set_focus_mode(model, "hard", dense_heads=heads, **({"window": args.window} if args.window else {}))
            with torch.no_grad():
                kept = distant_attention_recall(model, kept_rows)["kept"]
                rows.append(_row(name, count, score(), base, kept, heads, select))
                rows[-1]["window"] = focus_config(model).window
            print(rows[-1])
            _write(rows, args)  # after every row: a stopped screen keeps what it measured
        remove_focus(model)

    _write(rows, args)
    print((Path(args.out) / f"forgetting_screen_{args.tag}.md").read_text())


def _write(rows: list[dict], args) -> None:
    frame = pd.DataFrame(rows)
    out = Path(args.out)
    setting = (f"SmolLM2-135M-Instruct, {args.dtype}, {args.split} split: books and WikiText-2 perplexity on "
               f"{args.max_tokens} tokens at context 512 (ratio to pretrained, paired 95% interval over windows); "
               f"pass-key {len(DEPTHS) * args.needle_trials} trials per length on books filler; dense heads chosen "
               f"by {args.select} on {args.select_prompts} pass-key prompts of {args.select_length} tokens of the books "
               "train split.")
    write_text(out / f"forgetting_screen_{args.tag}.csv", frame.to_csv(index=False))
    shown = frame.drop(columns=["dense_heads"] + [c for c in frame.columns if c.endswith(("_low", "_high"))])
    write_text(out / f"forgetting_screen_{args.tag}.md", f"{setting}\n\n{markdown_table(shown, '.4g')}\n")


def _row(name: str, count: int, found: dict, base: dict, kept: float | None, heads: list[str], select: str) -> dict:
    row = {"adapter": name, "dense": count, "select": select, "distant_kept": kept}
    for domain in ("books", "wikitext2"):
        row[f"{domain}_ppl"] = found[domain]["ppl"]
        ratio, low, high = ((0.0, 0.0, 0.0) if found is base
                            else paired_ratio(found[domain]["window_nll"], base[domain]["window_nll"]))
        row[f"{domain}_change"], row[f"{domain}_change_low"], row[f"{domain}_change_high"] = ratio, low, high
        row[f"{domain}_interval"] = "" if found is base else f"[{low:+.2%}, {high:+.2%}]"
    for key, value in found.items():
        if key.startswith(("needle_", "key_logprob_")):
            row[key] = value
    row["seconds"] = round(found["seconds"])
    row["dense_heads"] = " ".join(heads)
    return row


if __name__ == "__main__":
    main()
