"""The design study's table and figure: every Focus variant of a profile side by side with the pretrained model.

One row per design (and one for the pretrained model): what it changes, its wall time, perplexity on the
validation split of the study domain (what the choice is made on), soft and hard, each against the pretrained
model with its paired 95% interval over the evaluation windows, then the other corpora's validation splits and every
test split (reported, never tuned on) alike, long-context perplexity, pass-key accuracy (overall and per length, with
the key's mean log-probability), how its groups align with token category and with position (NMI),
and what its hard pattern keeps of the pretrained model's distant attention: the share of the mass (`distant_recall`)
and of the pairs (`distant_kept`, the cost; `focus.eval.diagnostics`). The figure shows validation
perplexity during training against the pretrained model on the same rows.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from focus.artifacts import markdown_table, pyplot, save_figure
from focus.eval.paired import paired_ratio
from focus.files import write_text
from focus.pipeline.methods import PRETRAINED


def _records(paths: list[str | Path], model: str) -> list[dict]:
    records = (json.loads(Path(path).read_text()) for path in paths)
    return [record for record in records if record.get("model") == model]


def _of_model(paths: list[str | Path], model: str) -> list[Path]:
    """The <model>/<variant>/<file> paths of `model`."""
    return [Path(path) for path in paths if Path(path).parent.parent.name == model]


def _changes(overrides: dict, prefix: str = "") -> str:
    """A variant's changes as `key=value, ...`; a nested one (its `train` changes) as `train.seq_len=2048`."""
    return ", ".join(_changes(value, f"{prefix}{key}.") if isinstance(value, dict) else f"{prefix}{key}={value}"
                     for key, value in overrides.items()) or "(base)"


def study_frame(
    model: str,
    variants: dict[str, dict],
    domain: str,
    summaries: list[str | Path],
    validation: list[str | Path],
    test: list[str | Path],
    long_context: list[str | Path] = (),
    needle: list[str | Path] = (),
    interpret: list[str | Path] = (),
) -> pd.DataFrame:
    """One row per design plus the pretrained model (first).

    Args:
        model: the profile's name of the model studied; records of other models are left out.
        variants: {variant: FocusConfig overrides as the profile writes them}.
        domain: the study domain (its columns first); `validation` holds validation perplexity records, one per
            method and corpus.
        summaries: train summary.json files (<model>/<variant>/summary.json).
        test: test perplexity records of every method and domain; long_context, needle: their records;
        interpret: interpret summary.json files (<model>/<variant>/summary.json).
    """
    rows = {PRETRAINED: {"design": PRETRAINED, "changes": "full attention, frozen"}}
    for variant, overrides in variants.items():
        rows[variant] = {"design": variant, "changes": _changes(overrides)}

    windows: dict[tuple[str, str], list[float]] = {}  # (design, column) -> its per-window NLLs, where recorded

    def put(method: str, column: str, value, window_nll: list[float] | None = None) -> None:
        name, _, mode = method.rpartition("-")
        if method == PRETRAINED:
            name, column = PRETRAINED, column.replace("_{mode}", "")
        elif name in rows:
            column = column.format(mode=mode)
        else:
            return
        rows[name][column] = value
        if window_nll is not None:
            windows[name, column] = window_nll

    for path in _of_model(summaries, model):
        summary = json.loads(Path(path).read_text())
        row = rows[Path(path).parent.name]
        row["train_tokens"] = summary["final"].get("train/tokens")
        row["train_seconds"] = summary["seconds"]
    for split, records in (("validation", validation), ("test", test)):
        for record in _records(records, model):
            column = f"{record['domain']}_{split}_{{mode}}"
            put(record["method"], column, record["perplexity"], record.get("window_nll"))
    for record in _records(long_context, model):  # (a context column names its split where it is not test)
        split = "" if record.get("split", "test") == "test" else f"_{record['split']}"
        put(record["method"], f"ctx{record['context_length']}{split}_{{mode}}", record["perplexity"])
    for record in _records(needle, model):
        put(record["method"], "needle_{mode}", record["accuracy"])
        for length in sorted({trial["length"] for trial in record.get("trials", [])}):  # per length, as the screens
            at = [trial for trial in record["trials"] if trial["length"] == length]
            put(record["method"], f"needle_{length}_{{mode}}", sum(trial["correct"] for trial in at) / len(at))
            put(record["method"], f"key_logprob_{length}_{{mode}}", sum(trial["key_logprob"] for trial in at) / len(at))
    for path in _of_model(interpret, model):
        record = json.loads(Path(path).read_text())
        row = rows[Path(path).parent.name]
        for label in ("category", "position"):
            row[f"nmi_{label}"] = record["alignment"][label]["nmi_mean"]
        if "distant_attention" in record:  # focus.eval.diagnostics: what the hard pattern keeps of the pretrained attention
            row["distant_recall"] = record["distant_attention"]["recall"]
            row["distant_kept"] = record["distant_attention"]["kept"]
            row["distant_oracle_recall"] = record["distant_attention"]["oracle_recall"]
    scored = sorted((column for column in rows[PRETRAINED] if column.endswith(("_validation", "_test"))),
                    key=lambda column: (column.rsplit("_", 1)[1] == "test", column.rsplit("_", 1)[0] != domain, column))
    for name in variants:  # each design against pretrained on the same windows, every corpus: the ratio's 95% interval
        for scored_split in scored:
            for mode in ("soft", "hard"):
                column, base = f"{scored_split}_{mode}", windows.get((PRETRAINED, scored_split))
                design = windows.get((name, column))
                if base is not None and design is not None and len(design) == len(base) >= 2:
                    _, low, high = paired_ratio(design, base)
                    rows[name][f"{column}_vs_pretrained_low"], rows[name][f"{column}_vs_pretrained_high"] = low, high
    frame = pd.DataFrame(list(rows.values()))
    for scored_split in scored:
        pretrained = frame.loc[0, scored_split] if scored_split in frame else None
        for mode in ("soft", "hard"):
            column = f"{scored_split}_{mode}"
            if pretrained is not None and column in frame:
                frame[f"{column}_vs_pretrained"] = frame[column] / pretrained - 1
    return frame[_column_order(frame, scored)]


def _column_order(frame: pd.DataFrame, scored: list[str]) -> list[str]:
    """The design and its training; each scored corpus and split (`<domain>_<split>`, validation first, the study
    domain first in each) with its soft and hard modes and their changes against pretrained; then the long contexts
    by length, then the rest (pass-key, groups, distant attention)."""
    first = ["design", "changes", "train_tokens", "train_seconds"]
    for scored_split in scored:
        first += [scored_split, *(f"{scored_split}_{mode}{versus}" for mode in ("soft", "hard")
                                  for versus in ("", "_vs_pretrained", "_vs_pretrained_low", "_vs_pretrained_high"))]
    present = [c for c in first if c in frame]
    contexts = sorted((c for c in frame if c.startswith("ctx")), key=lambda c: (int(c[3:].split("_")[0]), c))
    rest = [c for c in frame if c not in present + contexts]
    return present + contexts + rest


def plot_study_curves(frame: pd.DataFrame, metrics: list[str | Path], summaries: list[str | Path], domain: str,
                      figure: str | Path) -> None:
    """Left: validation perplexity (the training job's evaluation rows, in the mode the design's objective trains:
    soft for the soft gate's, hard for the others) per training step for every design, starting at its k-means
    initialisation, with the pretrained model on the same rows as a line. Right: the
    validation split's perplexity, soft and hard, per design against pretrained."""
    plt = pyplot()
    fig, (curves, bars) = plt.subplots(1, 2, figsize=(13, 4.5))
    pretrained = None
    for path, summary_path in zip(sorted(metrics, key=str), sorted(summaries, key=str)):
        variant = Path(path).parent.name
        summary = json.loads(Path(summary_path).read_text())
        reference, mode = summary.get("reference_eval", {}), summary.get("eval_mode", "soft")
        pretrained = reference.get("pretrained", pretrained)
        log = pd.DataFrame([json.loads(line) for line in Path(path).read_text().splitlines()])
        evals = log.dropna(subset=["eval/ppl"]) if "eval/ppl" in log else log.iloc[:0]
        start = reference.get(f"init_{mode}")  # the k-means initialisation, scored in the mode the curve is in
        steps = ([0] if start is not None else []) + evals["step"].tolist()
        values = ([start] if start is not None else []) + evals["eval/ppl"].tolist()
        curves.plot(steps, values, marker="o", markersize=3, label=f"{variant} ({mode})")
    if pretrained is not None:
        curves.axhline(pretrained, color="black", linestyle="--", label="pretrained")
    curves.set(title="validation perplexity while training (in the mode each objective trains)", xlabel="step",
               ylabel="perplexity")
    curves.legend(fontsize="small")

    designs = frame[frame["design"] != PRETRAINED]
    columns = [c for c in (f"{domain}_validation_soft", f"{domain}_validation_hard") if c in designs]
    if columns:
        designs.set_index("design")[columns].rename(columns=lambda c: c.rsplit("_", 1)[1]).plot.bar(ax=bars, rot=20)
        base = frame.loc[frame["design"] == PRETRAINED, f"{domain}_validation"]
        if len(base) and pd.notna(base.iloc[0]):
            bars.axhline(base.iloc[0], color="black", linestyle="--", label="pretrained")
            low = min(designs[columns].min().min(), base.iloc[0])
            bars.set_ylim(low * 0.95, designs[columns].max().max() * 1.02)
        bars.set(title=f"{domain} validation perplexity", xlabel="", ylabel="perplexity")
        bars.legend(fontsize="small")
    save_figure(fig, figure)


def tradeoff_points(frame: pd.DataFrame, domain: str, other: str, split: str = "validation") -> pd.DataFrame:
    """One point per design and mode of a study table: the change against pretrained on `domain` and on `other`, both
    on `split` where the profile scores `other` there (else `other`'s test split), the share of distant pairs the mode
    keeps (soft keeps every pair: 1), and pass-key accuracy where measured."""
    base = frame.loc[frame["design"] == PRETRAINED]
    other_split = tradeoff_other_split(frame, other, split)
    if base.empty or other_split is None:
        return pd.DataFrame()
    other_base = base[f"{other}_{other_split}"].iloc[0]
    points = []
    for _, row in frame[frame["design"] != PRETRAINED].iterrows():
        for mode in ("soft", "hard"):
            change = row.get(f"{domain}_{split}_{mode}_vs_pretrained")
            if pd.isna(change) or pd.isna(row.get(f"{other}_{other_split}_{mode}")):
                continue
            points.append({"design": f"{row['design']} ({mode})", "domain_change": change,
                           "other_change": row[f"{other}_{other_split}_{mode}"] / other_base - 1,
                           "distant_kept": 1.0 if mode == "soft" else row.get("distant_kept"),
                           "passkey": row.get(f"needle_{mode}")})
    return pd.DataFrame(points)


def tradeoff_other_split(frame: pd.DataFrame, other: str, split: str = "validation") -> str | None:
    """The split the trade-off reads `other` on: `split` where the study table has it, else test, else None."""
    return next((s for s in (split, "test") if f"{other}_{s}" in frame), None)


def plot_tradeoff(points: pd.DataFrame, figure: str | Path, domain: str, other: str, note: str = "") -> None:
    """Every design as a numbered point: its change against pretrained on `domain` (x) and on `other` (y), the
    marker's area the share of distant pairs it keeps (its cost), dense (soft) modes hollow; the key beside the plot
    names each number with its pairs kept and pass-key accuracy. Lower left is better on both; the dashed lines are
    the pretrained model."""
    plt = pyplot()
    height = max(6.0, 2.5 + 0.13 * len(points))  # room for the key's line per point
    fig, (ax, key) = plt.subplots(1, 2, figsize=(13, height), gridspec_kw={"width_ratios": [1.3, 1]})
    points = points.reset_index(drop=True)
    kept = points["distant_kept"].astype(float).fillna(0.0)  # not measured: the smallest marker, no "kept" in the key
    dense = kept >= 1.0
    x, y = 100 * points["domain_change"], 100 * points["other_change"]
    ax.scatter(x[~dense], y[~dense], s=40 + 400 * kept[~dense], alpha=0.5, edgecolors="black", label="sparse (hard)")
    ax.scatter(x[dense], y[dense], s=40 + 400 * kept[dense], facecolors="none", edgecolors="black",
               label="dense (soft: no speed-up)")
    lines = []
    for i, row in points.iterrows():
        ax.annotate(str(i + 1), (x[i], y[i]), fontsize=8, ha="center", va="center")
        kept_text = "" if pd.isna(row.get("distant_kept")) else f", kept {row['distant_kept']:.0%}"
        passkey = "" if pd.isna(row.get("passkey")) else f", pass-key {row['passkey']:.0%}"
        lines.append(f"{i + 1}. {row['design']}{kept_text}{passkey}")
    ax.axvline(0, color="black", linestyle="--", linewidth=0.8)
    ax.axhline(0, color="black", linestyle="--", linewidth=0.8)
    ax.set(xlabel=f"{domain}: perplexity change against pretrained (%)",
           ylabel=f"{other}: perplexity change against pretrained (%)",
           title="Gain on the domain against forgetting elsewhere\n(marker area: distant pairs kept)")
    ax.legend(fontsize="small", loc="upper left")
    key.set_axis_off()
    key.text(0, 1, "\n".join(lines), va="top", fontsize=7, family="monospace", wrap=True)
    if note:  # under the key (the figure grows with the key's lines), clear of the axes' label
        key.text(0, 0, note, va="bottom", fontsize=7, wrap=True)
    save_figure(fig, figure)


def write_study(
    model: str,
    variants: dict[str, dict],
    domain: str,
    summaries: list[str | Path],
    metrics: list[str | Path],
    validation: list[str | Path],
    test: list[str | Path],
    table: str | Path,
    figure: str | Path,
    long_context: list[str | Path] = (),
    needle: list[str | Path] = (),
    interpret: list[str | Path] = (),
    tradeoff: str | Path | None = None,
    other_domain: str | None = None,
) -> pd.DataFrame:
    """Write tables/study.csv (and .md), the curves figure and, given `tradeoff`, the trade-off figure of `domain`
    against `other_domain` (`plot_tradeoff`; PNG and SVG); returns the table."""
    frame = study_frame(model, variants, domain, summaries, validation, test, long_context, needle, interpret)
    write_text(table, frame.to_csv(index=False))
    write_text(Path(table).with_suffix(".md"), markdown_table(frame, ".4g") + "\n")
    plot_study_curves(frame, _of_model(metrics, model), _of_model(summaries, model), domain, figure)
    if tradeoff is not None:
        points = tradeoff_points(frame, domain, other_domain)
        other_split = tradeoff_other_split(frame, other_domain)
        plot_tradeoff(points, tradeoff, domain, other_domain, f"{model}: {domain} validation split, {other_domain} "
                      f"{other_split} split")
    return frame
