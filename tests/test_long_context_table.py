"""The long-context table: each method's perplexity per length and its change against the pretrained model on the
same windows, with the paired interval (the screens quoted that interval; the table gave perplexities alone)."""

import json
import math

import pytest

from focus.eval.paired import paired_ratio
from focus.report.evaluation import long_context_frame, write_evaluation_tables


def record(tmp_path, method: str, context_length: int, window_nll: list[float], domain: str = "books",
           split: str = "test") -> str:
    path = tmp_path / f"{method}-{domain}-{context_length}.json"
    nll = sum(window_nll) / len(window_nll)
    path.write_text(json.dumps({"model": "m", "method": method, "domain": domain, "context_length": context_length,
                                "perplexity": math.exp(nll), "window_nll": window_nll, "split": split,
                                "distant_kept": None if method == "pretrained" else 0.25}))
    return str(path)


def test_each_method_is_paired_with_pretrained_at_its_own_length(tmp_path):
    records = [record(tmp_path, "pretrained", 512, [3.0, 3.2, 2.9]),
               record(tmp_path, "focus-hard", 512, [3.1, 3.2, 3.0]),
               record(tmp_path, "pretrained", 2048, [3.5, 3.4]), record(tmp_path, "focus-hard", 2048, [3.5, 3.6]),
               record(tmp_path, "focus-hard", 4096, [3.3, 3.4]),  # no pretrained at 4096: no change
               record(tmp_path, "pretrained", 8192, [3.3]), record(tmp_path, "focus-hard", 8192, [3.4])]  # one window
    frame = long_context_frame(records, [])
    change = frame[frame["measure"].str.startswith("perplexity_change")]
    assert set(change["method"]) == {"focus-hard"} and set(change["context_length"]) == {512, 2048}
    at_512 = change[change["context_length"] == 512].set_index("measure")["value"]
    expected = paired_ratio([3.1, 3.2, 3.0], [3.0, 3.2, 2.9])
    measures = ["perplexity_change", "perplexity_change_low", "perplexity_change_high"]
    assert tuple(at_512[measures]) == pytest.approx(expected)
    assert len(frame[frame["measure"] == "perplexity"]) == 7  # every record keeps its perplexity row
    kept = frame[frame["measure"] == "distant_kept"]
    assert len(kept) == 4 and set(kept["method"]) == {"focus-hard"} and set(kept["value"]) == {0.25}


def test_each_corpus_is_paired_with_pretrained_on_its_own_windows(tmp_path):
    """`long_context.domains`: the same method and length on two corpora, each against pretrained on that corpus."""
    records = [record(tmp_path, "pretrained", 2048, [3.0, 3.2], "books"),
               record(tmp_path, "focus-hard", 2048, [3.1, 3.3], "books"),
               record(tmp_path, "pretrained", 2048, [2.0, 2.2], "wikitext2"),
               record(tmp_path, "focus-hard", 2048, [2.0, 2.3], "wikitext2")]
    frame = long_context_frame(records, [])
    change = frame[frame["measure"] == "perplexity_change"].set_index("domain")["value"]
    assert change["books"] == pytest.approx(math.expm1(0.1))
    assert change["wikitext2"] == pytest.approx(paired_ratio([2.0, 2.3], [2.0, 2.2])[0])


def test_the_markdown_keeps_each_corpus_and_the_pass_key_apart(tmp_path):
    """The Markdown pivots lengths into columns: one row per corpus (not their mean), the pass-key's rows kept."""
    records = [record(tmp_path, "pretrained", 512, [3.0, 3.2], "books"),
               record(tmp_path, "pretrained", 512, [2.0, 2.2], "wikitext2")]
    needle = tmp_path / "needle.json"
    needle.write_text(json.dumps({"model": "m", "method": "pretrained", "trials": [
        {"length": 1024, "correct": True, "key_logprob": -0.5},
        {"length": 1024, "correct": False, "key_logprob": -3.0}]}))
    write_evaluation_tables([], {}, {}, {}, [], [], records, [needle], {"long_context": tmp_path / "long_context.csv"})
    table = (tmp_path / "long_context.md").read_text()
    assert f"{math.exp(3.1):.4g}" in table and f"{math.exp(2.1):.4g}" in table  # each corpus its own row
    needle_rows = [[cell.strip() for cell in line.split("|")[6:8]] for line in table.splitlines() if "needle" in line]
    assert needle_rows == [["—", "0.5"], ["—", "-1.75"]]  # (at 1024 only: its accuracy and mean key log-prob)


def test_the_table_names_the_split_each_perplexity_was_scored_on(tmp_path):
    """A screen that chooses at long contexts scores them on validation (`long_context.split`): its rows say so, and
    the pass-key's say test (its haystack's text), so that no validation number passes for a reported one."""
    records = [record(tmp_path, "pretrained", 512, [3.0, 3.2], split="validation"),
               record(tmp_path, "focus-hard", 512, [3.1, 3.3], split="validation")]
    needle = tmp_path / "needle.json"
    needle.write_text(json.dumps({"model": "m", "method": "pretrained", "trials": [
        {"length": 1024, "correct": True, "key_logprob": -0.5}]}))
    frame = long_context_frame(records, [needle])
    assert set(frame[frame["measure"].str.startswith("perplexity")]["split"]) == {"validation"}
    assert set(frame[frame["measure"].str.startswith("needle")]["split"]) == {"test"}


def test_the_figure_draws_each_change_with_its_interval(tmp_path, monkeypatch):
    """Beside the perplexities, a panel per corpus draws each method's change from pretrained in percent, its error
    bar the table's paired interval (what part 6 quotes), in the method's colour on every panel."""
    import matplotlib.pyplot as plt

    from focus.report import evaluation

    records = [record(tmp_path, method, length, [v + shift + cost * (i + 1) for i, v in enumerate(nll)], domain)
               for domain, shift in (("books", 0.0), ("wikitext2", -1.0))
               for length, nll, focus_cost in ((512, [3.0, 3.2, 2.9], 0.01), (2048, [2.8, 2.9, 3.1], 0.03))
               for method, cost in (("pretrained", 0.0), ("focus-hard", focus_cost))]
    frame = long_context_frame(records, [])
    figures = []
    monkeypatch.setattr(evaluation, "save_figure", lambda fig, path: figures.append(fig))
    evaluation.plot_long_context(frame, tmp_path / "long_context.png")
    axes = [ax for ax in figures[0].axes if ax.has_data()]
    changes = [ax for ax in axes if ax.get_title().startswith("m: change from pretrained")]
    assert [ax.get_title() for ax in changes] == ["m: change from pretrained (books)",
                                                  "m: change from pretrained (wikitext2)"]
    expected = frame[(frame["domain"] == "books") & frame["measure"].str.startswith("perplexity_change")]
    expected = expected.pivot_table(index="context_length", columns="measure", values="value")
    bars = changes[0].containers[0]  # focus-hard's errorbar: (line, caps, bar lines)
    assert list(bars.lines[0].get_ydata()) == pytest.approx(list(100 * expected["perplexity_change"]))
    segments = bars.lines[2][0].get_segments()
    assert [end for (_, low), (_, high) in segments for end in (low, high)] == pytest.approx(
        [end for pair in zip(100 * expected["perplexity_change_low"], 100 * expected["perplexity_change_high"])
         for end in pair])
    colour = {line.get_label(): line.get_color() for line in axes[0].get_lines()}["focus-hard"]
    assert bars.lines[0].get_color() == colour
    plt.close(figures[0])


def test_the_figure_redrawn_from_its_csv_keeps_the_pass_key(tmp_path, monkeypatch):
    """A figure re-drawn from a committed long_context.csv has every panel the pipeline drew from the table in memory:
    the pass-key's empty corpus comes back from the CSV as NaN."""
    import matplotlib.pyplot as plt
    import pandas as pd

    from focus.report import evaluation

    records = [record(tmp_path, method, 1024, [3.0, 3.1]) for method in ("pretrained", "focus-hard")]
    needle = tmp_path / "needle.json"
    needle.write_text(json.dumps({"model": "m", "method": "pretrained", "trials": [
        {"length": 1024, "correct": True, "key_logprob": -1.0}]}))
    frame = long_context_frame(records, [needle])
    frame.to_csv(tmp_path / "long_context.csv", index=False)
    titles = []
    monkeypatch.setattr(evaluation, "save_figure", lambda fig, path: (
        titles.append([ax.get_title() for ax in fig.axes if ax.has_data()]), plt.close(fig)))
    evaluation.plot_long_context(frame, tmp_path / "memory.png")
    evaluation.plot_long_context(pd.read_csv(tmp_path / "long_context.csv"), tmp_path / "csv.png")
    assert titles[0] == titles[1] and "m: pass-key retrieval" in titles[1], titles
