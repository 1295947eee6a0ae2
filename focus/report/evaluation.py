"""Tables and figures of the evaluation stages: benchmarks, TruthfulQA, LoRA grid, prompt lengths, long context, RULER.

Same conventions as `focus.report.tables`: CSV is the record (long form), a Markdown sibling for reading, PNG + SVG.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from focus.artifacts import markdown_table, panels, pyplot, save_figure
from focus.eval.harness import CHAT_TASKS, HEADLINE
from focus.eval.paired import paired_ratio
from focus.files import write_text
from focus.pipeline.methods import PRETRAINED, method_kind, parse_lora_name


def benchmark_frame(records: list[str | Path]) -> pd.DataFrame:
    """One row per (model, method, task): the headline metric, its standard error, documents, chat template."""
    rows = []
    for path in records:
        record = json.loads(Path(path).read_text())
        lora = parse_lora_name(record["method"])
        for task, metrics in record["tasks"].items():
            if "skipped" in metrics:
                continue
            metric = HEADLINE[task]
            rows.append({
                "model": record["model"],
                "method": record["method"],
                "kind": method_kind(record["method"]),
                "rank": lora[0] if lora else None,
                "lr": lora[1] if lora else None,
                "task": task,
                "metric": metric,
                "value": metrics[metric],
                "stderr": metrics.get(f"{metric}_stderr"),
                "documents": metrics["documents"],
                "chat_template": metrics["chat_template"],
            })
    return pd.DataFrame(rows)


def prompt_length_frame(samples: dict[str, str | Path], tokenizers: dict[str, object], focus: dict[str, dict]) -> pd.DataFrame:
    """Prompt lengths of every benchmark document against each Focus variant's window.

    Args:
        samples: {model: folder of lm-eval sample logs (<task>.jsonl)}.
        tokenizers: {model: its tokenizer}.
        focus: {model: {variant: FocusConfig dict}}.
    Returns one row per (model, task, variant): documents, median / 90th percentile / max prompt tokens (context
    plus the longest continuation, as the model scores it), the window, and the share of documents longer than
    window + sink tokens: the only ones on which Focus differs from full attention at all.
    """
    rows = []
    for model, folder in samples.items():
        for path in sorted(Path(folder).glob("*.jsonl")):
            lengths = np.array([_document_tokens(json.loads(line), tokenizers[model]) for line in path.open()])
            for variant, config in focus[model].items():
                reach = config["window"] + config["sink_tokens"]
                rows.append({
                    "model": model,
                    "task": path.stem,
                    "variant": variant,
                    "documents": len(lengths),
                    "median_tokens": float(np.median(lengths)),
                    "p90_tokens": float(np.percentile(lengths, 90)),
                    "max_tokens": int(lengths.max()),
                    "window": config["window"],
                    "share_focus_differs": float((lengths > reach).mean()),
                })
    return pd.DataFrame(rows)


def _document_tokens(sample: dict, tokenizer) -> int:
    """Tokens of the longest (context, continuation) request of one lm-eval document."""
    return max(len(tokenizer(context + continuation, add_special_tokens=False).input_ids)
               for context, continuation in sample["arguments"])


def lora_frame(summaries: list[str | Path], perplexity_records: list[str | Path]) -> pd.DataFrame:
    """One row per LoRA cell: rank, lr, trainable parameters, final losses, perplexity per domain."""
    ppl = {}
    for path in perplexity_records:
        record = json.loads(Path(path).read_text())
        ppl[(record["model"], record["method"], record["domain"])] = record["perplexity"]
    rows = []
    for path in summaries:
        summary = json.loads(Path(path).read_text())
        model, method = Path(path).parent.parent.name, Path(path).parent.name
        row = {
            "model": model,
            "method": method,
            "rank": summary["lora_config"]["r"],
            "lr": summary["train_config"]["lr"],
            "trainable_parameters": summary["trainable_parameters"],
            "train_loss": summary["final"].get("train/loss"),
            "eval_loss": summary["final"].get("eval/loss"),
            "seconds": summary["seconds"],
        }
        row.update({f"ppl_{domain}": value for (m, meth, domain), value in ppl.items() if (m, meth) == (model, method)})
        rows.append(row)
    return pd.DataFrame(rows)


def long_context_frame(perplexity_records: list[str | Path], needle_records: list[str | Path]) -> pd.DataFrame:
    """One row per (model, method, corpus, measure, context length): perplexity, its change against the pretrained
    model on the same windows with the paired 95% interval (`perplexity_change`, `_low`, `_high`; where both were
    scored on two windows or more), the share of distant pairs a hard method keeps (`distant_kept`), or needle accuracy
    and mean key log-prob (the corpus: the haystack's, where the record names it); `split`: the perplexity's (the
    pass-key's haystack is the test split's text)."""
    rows = []
    records = [json.loads(Path(path).read_text()) for path in perplexity_records]
    pretrained = {(r["model"], r.get("domain"), r["context_length"]): r for r in records if r["method"] == PRETRAINED}
    for record in records:
        cell = {"model": record["model"], "method": record["method"], "domain": record.get("domain"),
                "split": record.get("split", "test"), "context_length": record["context_length"], "trials": None}
        rows.append({**cell, "measure": "perplexity", "value": record["perplexity"]})
        if record.get("distant_kept") is not None:  # (hard methods: the share of distant pairs their pattern keeps)
            rows.append({**cell, "measure": "distant_kept", "value": record["distant_kept"]})
        base = pretrained.get((record["model"], record.get("domain"), record["context_length"]))
        if record["method"] == PRETRAINED or base is None or min(len(record.get("window_nll") or ()),
                                                                 len(base.get("window_nll") or ())) < 2:
            continue
        change = paired_ratio(record["window_nll"], base["window_nll"])
        rows += [{**cell, "measure": f"perplexity_change{suffix}", "value": value}
                 for suffix, value in zip(("", "_low", "_high"), change)]
    for path in needle_records:
        record = json.loads(Path(path).read_text())
        trials = pd.DataFrame(record["trials"])
        for length, cell in trials.groupby("length"):
            base = {"model": record["model"], "method": record["method"],
                    "domain": record.get("domain", ""),  # ("": a pass-key names no corpus)
                    "split": "test", "context_length": int(length), "trials": len(cell)}
            rows.append({**base, "measure": "needle_accuracy", "value": float(cell["correct"].mean())})
            rows.append({**base, "measure": "needle_key_logprob", "value": float(cell["key_logprob"].mean())})
    return pd.DataFrame(rows)


def ruler_frame(records: list[str | Path]) -> pd.DataFrame:
    """One row per (model, method, task, prompt length): RULER's score, its standard error and documents."""
    rows = []
    for path in records:
        record = json.loads(Path(path).read_text())
        for task, by_length in record["tasks"].items():
            if "skipped" in by_length:
                continue
            for length, cell in by_length.items():
                rows.append({"model": record["model"], "method": record["method"], "kind": method_kind(record["method"]),
                             "task": task, "context_length": int(length), "value": cell["score"],
                             "stderr": cell["stderr"], "documents": cell["documents"]})
    return pd.DataFrame(rows)


def write_evaluation_tables(
    benchmark_records: list[str | Path],
    samples: dict[str, str | Path],
    sources: dict[str, str],
    focus: dict[str, dict],
    lora_summaries: list[str | Path],
    perplexity_records: list[str | Path],
    long_context_records: list[str | Path],
    needle_records: list[str | Path],
    outputs: dict[str, str | Path],
    ruler_records: list[str | Path] = (),
) -> None:
    """Write each table named in `outputs` (benchmarks, truthfulqa, prompt_lengths, lora, long_context, ruler) as CSV +
    Markdown, and its figure where `outputs` names one (key + "_figure")."""
    from focus.models import load_tokenizer

    frames = {}
    if "benchmarks" in outputs:
        bench = benchmark_frame(benchmark_records)
        frames["benchmarks"] = bench[~bench["task"].isin(CHAT_TASKS)]
        frames["truthfulqa"] = bench[bench["task"].isin(CHAT_TASKS)]
        tokenizers = {model: load_tokenizer(source) for model, source in sources.items() if model in samples}
        frames["prompt_lengths"] = prompt_length_frame(samples, tokenizers, focus)
    if "lora" in outputs:
        frames["lora"] = lora_frame(lora_summaries, perplexity_records)
    if "long_context" in outputs:
        frames["long_context"] = long_context_frame(long_context_records, needle_records)
    if "ruler" in outputs:
        frames["ruler"] = ruler_frame(ruler_records)
    for name, frame in frames.items():
        if name in outputs:
            write_text(outputs[name], frame.to_csv(index=False))
            write_text(Path(outputs[name]).with_suffix(".md"), markdown_table(_readable(name, frame), ".4g") + "\n")
        if f"{name}_figure" in outputs:
            _FIGURES[name](frame, outputs[f"{name}_figure"])


def _readable(name: str, frame: pd.DataFrame) -> pd.DataFrame:
    """The Markdown layout: benchmark scores pivoted to one column per task, the rest as they are."""
    if name in ("benchmarks", "truthfulqa") and not frame.empty:
        return frame.pivot_table(index=["model", "method"], columns="task", values="value", sort=False).reset_index()
    if name == "long_context" and not frame.empty:
        return frame.pivot_table(index=["model", "domain", "split", "measure", "method"], columns="context_length",
                                 values="value", sort=False).reset_index()
    if name == "ruler" and not frame.empty:
        return frame.pivot_table(index=["model", "task", "method"], columns="context_length", values="value",
                                 sort=False).reset_index()
    return frame


def plot_benchmarks(frame: pd.DataFrame, figure: str | Path) -> None:
    """Grouped bars: one group per task, one bar per method, with standard-error whiskers."""
    plt = pyplot()

    models = list(dict.fromkeys(frame["model"]))
    fig, axes = panels(plt, len(models))
    for ax, model in zip(axes, models):
        part = frame[frame["model"] == model]
        tasks, methods = list(dict.fromkeys(part["task"])), list(dict.fromkeys(part["method"]))
        width = 0.8 / len(methods)
        for i, method in enumerate(methods):
            rows = part[part["method"] == method].set_index("task").reindex(tasks)
            ax.bar(np.arange(len(tasks)) + i * width, rows["value"], width, yerr=rows["stderr"], label=method, capsize=2)
        ax.set_xticks(np.arange(len(tasks)) + 0.4 - width / 2, tasks, rotation=20)
        ax.set_ylabel("accuracy")
        ax.set_title(f"{model}: lm-eval, zero-shot (limit {int(part['documents'].max())} docs)")
        ax.legend(fontsize=7)
    save_figure(fig, figure)


def plot_truthfulqa(frame: pd.DataFrame, figure: str | Path) -> None:
    """MC1 and MC2 against LoRA rank (one line per learning rate), pretrained and Focus as horizontal lines; one panel
    per (model, task)."""
    plt = pyplot()

    cells = list(dict.fromkeys(zip(frame["model"], frame["task"])))
    fig, axes = panels(plt, len(cells))
    for ax, (model, task) in zip(axes, cells):
        part = frame[(frame["model"] == model) & (frame["task"] == task)]
        lora = part[part["kind"] == "lora"]
        for dodge, (lr, cells) in enumerate(lora.groupby("lr")):
            cells = cells.sort_values("rank")
            # Learning rates often tie at 10 questions; a small shift along the log-scale rank axis keeps both seen.
            ax.errorbar(cells["rank"] * 1.04**dodge, cells["value"], yerr=cells["stderr"], marker="os^v"[dodge % 4],
                        capsize=2, label=f"LoRA lr {lr:g}")
        for (_, row), style in zip(part[part["kind"] != "lora"].iterrows(), ("-", "--", ":", "-.")):
            ax.axhline(row["value"], linestyle=style, color="black" if row["kind"] == PRETRAINED else "tab:red",
                       label=row["method"])
        if not lora.empty:
            ranks = sorted(set(lora["rank"].astype(int)))
            ax.set_xscale("log", base=2)
            ax.set_xticks(ranks, [str(rank) for rank in ranks])
            ax.minorticks_off()
            ax.set_xlabel("LoRA rank")
        else:
            ax.set_xticks([])
            ax.set_xlabel("(no LoRA cells for this model)")
        ax.set_ylabel("accuracy")
        template = "chat template" if part["chat_template"].all() else "no chat template"
        ax.set_title(f"{model}: {task} ({template}, {int(part['documents'].max())} questions)", fontsize=9)
        ax.legend(fontsize=7)
    save_figure(fig, figure)


def plot_prompt_lengths(frame: pd.DataFrame, figure: str | Path) -> None:
    """Per task: prompt lengths (median to 90th percentile, whisker to the longest) against the Focus window, each
    task labelled with the share of its documents on which Focus can differ from full attention at all."""
    plt = pyplot()

    models = list(dict.fromkeys(frame["model"]))
    fig, axes = panels(plt, len(models))
    for ax, model in zip(axes, models):
        part = frame[frame["model"] == model].drop_duplicates("task").reset_index(drop=True)
        y = np.arange(len(part))
        ax.hlines(y, part["median_tokens"], part["max_tokens"], color="tab:blue", linewidth=1)
        ax.hlines(y, part["median_tokens"], part["p90_tokens"], color="tab:blue", linewidth=6, label="median to 90th pct.")
        ax.plot(part["median_tokens"], y, "o", color="white", markeredgecolor="tab:blue", label="median")
        ax.plot(part["max_tokens"], y, "|", color="tab:blue", markersize=10, label="longest")
        for window in sorted(set(frame[frame["model"] == model]["window"])):
            ax.axvline(window, color="tab:red", linestyle="--", label=f"Focus window {window}")
        ax.set_yticks(y, [f"{row.task}\n{row.share_focus_differs:.0%} beyond the window" for row in part.itertuples()],
                      fontsize=8)
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(plt.FormatStrFormatter("%d"))
        ax.minorticks_off()
        ax.set_xlabel("prompt tokens (context + longest continuation)")
        ax.set_title(f"{model}, {int(part['documents'].max())} documents per task")
        ax.legend(fontsize=7)
    save_figure(fig, figure)


def plot_long_context(frame: pd.DataFrame, figure: str | Path) -> None:
    """Per model: perplexity against context length per method (a panel per corpus), its change from pretrained with
    the paired 95% interval over the windows (a panel per corpus, where the table has it), and needle accuracy against
    prompt length."""
    plt = pyplot()
    # The pass-key has no corpus: "" in memory, NaN once the table went through a CSV (or absent, before tables had
    # the column), and NaN equals nothing, which would drop its panels from a figure re-drawn from a committed table.
    frame = frame.assign(domain=frame["domain"].fillna("") if "domain" in frame else "")
    shown = [(model, measure, domain) for model in dict.fromkeys(frame["model"])
             for measure in ("perplexity", "perplexity_change", "needle_accuracy")
             for domain in dict.fromkeys(frame["domain"])
             if ((frame["model"] == model) & (frame["measure"] == measure) & (frame["domain"] == domain)).any()]
    styles = {method: {"color": f"C{rank % 10}", "marker": "os^vD"[rank // 10 % 5]}  # one per method, every panel
              for rank, method in enumerate(dict.fromkeys(frame["method"]))}
    fig, axes = panels(plt, len(shown))
    for ax, (model, measure, domain) in zip(axes, shown):
        part = frame[(frame["model"] == model) & (frame["domain"] == domain)]
        if measure == "perplexity_change":
            _plot_changes(ax, part, styles)
        else:
            for method, cells in part[part["measure"] == measure].groupby("method", sort=False):
                cells = cells.sort_values("context_length")
                ax.plot(cells["context_length"], cells["value"], **styles[method], label=method)
            ax.set_ylabel(measure.replace("_", " "))
        lengths = sorted(set(part[part["measure"] == measure]["context_length"].astype(int)))
        ax.set_xscale("log", base=2)
        ax.set_xticks(lengths, [str(length) for length in lengths])
        ax.minorticks_off()
        ax.set_xlabel("context length (tokens)")
        ax.set_title(f"{model}: " + ({"perplexity": f"long passages ({domain})",
                                     "perplexity_change": f"change from pretrained ({domain})"}.get(measure)
                                    or (f"pass-key retrieval ({domain})" if domain else "pass-key retrieval")))
        ax.legend(fontsize=7)
    save_figure(fig, figure)


def _plot_changes(ax, part: pd.DataFrame, styles: dict[str, dict]) -> None:
    """Each method's perplexity change from pretrained in percent against context length, error bars the interval;
    methods side by side, so that equal changes do not hide each other."""
    changes = part[part["measure"].str.startswith("perplexity_change")].pivot_table(
        index=["method", "context_length"], columns="measure", values="value", sort=False)
    methods = list(dict.fromkeys(changes.index.get_level_values("method")))
    for rank, method in enumerate(methods):
        cells = changes.loc[method].sort_index()
        nudge = 1 + 0.03 * (rank - (len(methods) - 1) / 2)
        value = 100 * cells["perplexity_change"]
        bounds = [value - 100 * cells.get("perplexity_change_low", cells["perplexity_change"]),
                  100 * cells.get("perplexity_change_high", cells["perplexity_change"]) - value]
        ax.errorbar(cells.index * nudge, value, yerr=bounds, capsize=3, **styles[method], label=method)
    ax.axhline(0, color="grey", linewidth=0.8)
    ax.set_ylabel("perplexity change from pretrained (%)")


def plot_ruler(frame: pd.DataFrame, figure: str | Path) -> None:
    """Per model and RULER task: the score against prompt length, one line per method (error bars: 1 s.e.)."""
    plt = pyplot()
    if frame.empty:  # every task needed the hub and it was unreachable
        fig, ax = plt.subplots(figsize=(5, 3.8))
        ax.text(0.5, 0.5, "no RULER task ran (see the records' skip reasons)", ha="center", va="center")
        ax.set_axis_off()
        save_figure(fig, figure)
        return
    shown = list(dict.fromkeys(zip(frame["model"], frame["task"])))
    fig, axes = panels(plt, len(shown))
    for ax, (model, task) in zip(axes, shown):
        part = frame[(frame["model"] == model) & (frame["task"] == task)]
        methods = list(dict.fromkeys(part["method"]))
        for rank, (method, cells) in enumerate(part.groupby("method", sort=False)):
            cells = cells.sort_values("context_length")
            nudge = 1 + 0.04 * (rank - (len(methods) - 1) / 2)  # side by side: equal scores would hide each other
            ax.errorbar(cells["context_length"] * nudge, cells["value"], yerr=cells["stderr"].fillna(0),
                        marker="os^vD"[rank % 5], capsize=3, label=method)
        lengths = sorted(set(part["context_length"].astype(int)))
        ax.set_xscale("log", base=2)
        ax.set_xticks(lengths, [str(length) for length in lengths])
        ax.minorticks_off()
        ax.set_ylim(-0.05, 1.05)
        ax.set_xlabel("prompt length (tokens)")
        ax.set_ylabel("score (share of answers found)")
        ax.set_title(f"{model}: {task}, {int(part['documents'].max())} documents per length")
        ax.legend(fontsize=7)
    save_figure(fig, figure)


_FIGURES = {
    "benchmarks": plot_benchmarks,
    "truthfulqa": plot_truthfulqa,
    "prompt_lengths": plot_prompt_lengths,
    "long_context": plot_long_context,
    "ruler": plot_ruler,
}
