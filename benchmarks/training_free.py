"""Is a trained router worth training? Training-free selectors against the same FocusConfig trained (issue 47, part 1).

    .venv/bin/python benchmarks/training_free.py --tokens DIR --adapter trained=FOLDER --out DIR
    .venv/bin/python benchmarks/training_free.py --tokens DIR --adapter trained=FOLDER --no-kmeans \
        --peer streaming:0.3 --peer quest:0.3 --peer clusters:0.3 --name peers --out DIR

`kmeans`: `apply_focus` with the trained adapter's FocusConfig (hard top-2 of 16, window 128, query routing), its
centroids the spherical k-means of each layer's unrotated keys on the 8 calibration rows a training job takes (the
first 8 rows of 512 tokens of the training novels), never trained: the same selection rule, the same kept share in
expectation, no gradient step. `--peer SELECTOR:BUDGET`: a training-free selector of `focus.attention.routers.selectors`
(streaming, quest, clusters) keeping that share of each query's distant keys, under the first adapter's window and
sinks ("clusters": its clusters those same k-means centroids). Each adapter given with `--adapter NAME=FOLDER` is
scored beside them. Scored on the TEST
splits (no choice is made here) of the held-out novel (`books_by_book`), the non-fiction and WikiText-2 at each of
`--contexts`, against the pretrained model in the same run (paired 95% intervals over the windows), and the share of
distant pairs each keeps. Written to <out>/<name>.{csv,md}, and <out>/<name>_tradeoff.{png,svg}: each design's
held-out novel change against its WikiText-2 change (`focus.report.study.plot_tradeoff`). Every design's per-window
NLLs go to <out>/<name>_windows.csv, and <out>/<name>_against_<reference>.{csv,md} pairs each design with `--reference`
(default the first adapter; `--redraw --reference OTHER` pairs with another) on the same windows: its perplexity over
the reference's, with the 95% interval of that difference.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import pandas as pd
import torch

from focus import FocusConfig, apply_focus, load_focus, remove_focus, save_focus, set_focus_mode
from focus.adapter import read_adapter_config
from focus.artifacts import markdown_table
from focus.data import chunk_tokens
from focus.eval.diagnostics import distant_attention_recall
from focus.eval.paired import paired_ratio
from focus.eval.perplexity import perplexity
from focus.files import write_text
from focus.models import PACKAGED_SMOLLM2, load_model
from focus.pipeline.jobs import read_tokens
from focus.report.study import plot_tradeoff

CORPORA = ("books_by_book", "nonfiction", "wikitext2")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", required=True, help="folder of <corpus>.tokens.safetensors (no_worse_screen.py)")
    parser.add_argument("--adapter", action="append", default=[], help="NAME=FOLDER of a trained adapter")
    parser.add_argument("--contexts", type=int, nargs="+", default=[512, 2048])
    parser.add_argument("--max-tokens", type=int, default=16384)
    parser.add_argument("--split", default="test", choices=["validation", "test"])
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--peer", action="append", default=[], help="SELECTOR:BUDGET, e.g. quest:0.3")
    parser.add_argument("--no-kmeans", action="store_true", help="leave out the untrained top-k design")
    parser.add_argument("--name", default="training_free", help="the tables' file stem")
    parser.add_argument("--save-adapters", help="folder to save each untrained design in as an adapter (for RULER)")
    parser.add_argument("--reference", help="the design every other is paired with (default: the first adapter)")
    parser.add_argument("--redraw", action="store_true", help="only write the table's text and figure from its CSV")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    adapters = dict(spec.split("=", 1) for spec in args.adapter)
    if not adapters:
        parser.error("give the trained design with --adapter NAME=FOLDER: kmeans takes its FocusConfig")
    config = FocusConfig.from_dict(read_adapter_config(Path(next(iter(adapters.values()))))["focus_config"])
    args.reference = args.reference or next(iter(adapters))
    if args.redraw:  # the table's text and figure again, from its CSV
        out = Path(args.out)
        windows = out / f"{args.name}_windows.csv"
        _write(pd.read_csv(out / f"{args.name}.csv"), pd.read_csv(windows) if windows.is_file() else None, args, config)
        return
    model, _ = load_model(PACKAGED_SMOLLM2, getattr(torch, args.dtype))
    tokens = {c: read_tokens(Path(args.tokens) / f"{c}.tokens.safetensors", args.split)[: args.max_tokens]
              for c in CORPORA}
    train = chunk_tokens(read_tokens(Path(args.tokens) / "books_by_book.tokens.safetensors", "train"), 512)
    calibration = train[:8]
    kept_rows = {n: chunk_tokens(tokens["books_by_book"], n)[: max(1, 2048 // n)] for n in args.contexts}

    def score() -> dict:
        with torch.no_grad():
            return {(c, n): perplexity(model, ids, n, n, batch_size=max(1, 2048 // n), progress=False)
                    for n in args.contexts for c, ids in tokens.items()}

    tic = time.perf_counter()
    base = score()
    print(f"pretrained scored in {time.perf_counter() - tic:.0f} s", flush=True)
    rows, windows = [], _windows("pretrained", base)
    peers = {f"{spec.replace(':', '@')}": dict(zip(("selector", "budget"), spec.split(":"))) for spec in args.peer}
    for name in [*(() if args.no_kmeans else ("kmeans",)), *peers, *adapters]:
        tic = time.perf_counter()
        if name in adapters:
            load_focus(model, adapters[name])
        else:
            peer = peers.get(name)
            chosen = config if peer is None else config.replace(selector=peer["selector"], budget=float(peer["budget"]))
            apply_focus(model, chosen, calibration_ids=calibration)
            if args.save_adapters:
                save_focus(model, Path(args.save_adapters) / name)
        set_focus_mode(model, "hard")
        found = score()
        with torch.no_grad():  # the share of distant pairs kept, at each context: the selectors keep it per query
            kept = {n: distant_attention_recall(model, kept_rows[n], batch_size=1)["kept"] for n in args.contexts}
        remove_focus(model)
        for n in args.contexts:
            row = {"design": name, "context": n, "distant_kept": kept[n]}
            for c in CORPORA:
                ratio, low, high = paired_ratio(found[c, n]["window_nll"], base[c, n]["window_nll"])
                row.update({f"{c}_pretrained": base[c, n]["ppl"], f"{c}_focus": found[c, n]["ppl"],
                            f"{c}_change": ratio, f"{c}_low": low, f"{c}_high": high, c: f"{ratio:+.2%} [{low:+.2%}, "
                            f"{high:+.2%}]"})
            rows.append(row)
        windows += _windows(name, found)
        print(f"{name} scored in {time.perf_counter() - tic:.0f} s: {rows[-len(args.contexts):]}", flush=True)
        _write(pd.DataFrame(rows), pd.DataFrame(windows), args, config)


def _windows(design: str, scores: dict) -> list[dict]:
    """One row per scored window: design, corpus, context, window (its index), nll (its mean per token)."""
    return [{"design": design, "corpus": c, "context": n, "window": i, "nll": nll}
            for (c, n), found in scores.items() for i, nll in enumerate(found["window_nll"])]


def _against(windows: pd.DataFrame, reference: str) -> pd.DataFrame:
    """Each design (not pretrained, not `reference`) against `reference` on the same windows, per corpus and context:
    its perplexity over the reference's - 1 with the paired 95% interval (above zero: the reference is better)."""
    nll = windows.pivot_table(index=["corpus", "context", "window"], columns="design", values="nll")
    rows = []
    for design in dict.fromkeys(windows["design"]):
        if design in ("pretrained", reference):
            continue
        row = {"design": design, "reference": reference}
        for (corpus, context), cell in nll.groupby(level=["corpus", "context"]):
            ratio, low, high = paired_ratio(cell[design].tolist(), cell[reference].tolist())
            row[f"{corpus} at {context}"] = f"{ratio:+.2%} [{low:+.2%}, {high:+.2%}]"
        rows.append(row)
    return pd.DataFrame(rows)


def _write(frame: pd.DataFrame, windows: pd.DataFrame | None, args, config: FocusConfig) -> None:
    """<out>/<name>.{csv,md}, the trade-off figure <out>/<name>_tradeoff.{png,svg} of the designs scored so far, and
    (with their window NLLs) <out>/<name>_windows.csv and the paired table <out>/<name>_against_<reference>.{csv,md}."""
    out = Path(args.out)
    write_text(out / f"{args.name}.csv", frame.to_csv(index=False))
    if windows is not None:
        write_text(out / f"{args.name}_windows.csv", windows.to_csv(index=False))
    if windows is not None and args.reference in set(windows["design"]):
        stem = out / f"{args.name}_against_{args.reference}"
        against = _against(windows, args.reference)
        write_text(Path(f"{stem}.csv"), against.to_csv(index=False))
        write_text(Path(f"{stem}.md"), f"Each design's perplexity over `{args.reference}`'s on the same windows "
                   f"- 1, paired 95% interval (above zero: `{args.reference}` is better). {_setting(args, config)}"
                   f"\n\n{markdown_table(against, '.3g')}\n")
    shown = frame[["design", "context", "distant_kept", *CORPORA]]
    write_text(out / f"{args.name}.md", f"{_setting(args, config)}\n\n{markdown_table(shown, '.3g')}\n")
    points = pd.DataFrame({"design": frame["design"] + " at " + frame["context"].astype(str),
                           "domain_change": frame["books_by_book_change"], "other_change": frame["wikitext2_change"],
                           "distant_kept": frame["distant_kept"]})
    plot_tradeoff(points, out / f"{args.name}_tradeoff.png", "held-out novel (test)", "WikiText-2 (test)",
                  note=f"{args.split} splits, {args.max_tokens} tokens per corpus and context; every design on the "
                       f"same frozen SmolLM2 under the same window and sinks ({args.name}.md)")


def _setting(args, config: FocusConfig) -> str:
    return (f"SmolLM2-135M-Instruct, {args.dtype}, hard top-{config.top_k} of {config.num_groups} groups, window "
            f"{config.window}, route_queries={config.route_queries!r}; {args.split} splits, {args.max_tokens} tokens "
            f"per corpus and context, perplexity change against pretrained with paired 95% intervals over the windows; "
            f"`kmeans`: the centroids spherical k-means leaves on 8 calibration rows, never trained; "
            f"`SELECTOR@BUDGET`: a training-free selector keeping that share of each query's distant keys "
            f"(`focus.attention.routers.selectors`). "
            f"`benchmarks/training_free.py --contexts {' '.join(map(str, args.contexts))}"
            f"{''.join(f' --peer {p}' for p in args.peer)}`.")


if __name__ == "__main__":
    main()
