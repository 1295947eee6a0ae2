"""The study's trade-off figure: each design's change on the domain against the other domain, from the study table."""

import math

import pandas as pd
import pytest

from focus.report.study import plot_tradeoff, tradeoff_points


def test_tradeoff_points_are_changes_against_pretrained_per_mode(tmp_path):
    frame = pd.DataFrame([
        {"design": "pretrained", "wikitext2_test": 20.0, "needle": 0.8},
        {"design": "a", "books_validation_soft_vs_pretrained": -0.02, "books_validation_hard_vs_pretrained": -0.01,
         "wikitext2_test_soft": 19.0, "wikitext2_test_hard": 21.0, "distant_kept": 0.3, "needle_hard": 0.25,
         "needle_soft": 0.9},
        {"design": "b", "books_validation_hard_vs_pretrained": 0.05, "wikitext2_test_hard": 22.0,
         "distant_kept": 0.2},  # hard only: its soft mode was not scored
    ])
    points = tradeoff_points(frame, "books", "wikitext2").set_index("design")
    assert list(points.index) == ["a (soft)", "a (hard)", "b (hard)"]
    assert points.loc["a (hard)", "other_change"] == pytest.approx(21.0 / 20.0 - 1)
    assert points.loc["a (soft)", "distant_kept"] == 1.0  # soft mode keeps every pair
    assert points.loc["a (hard)", "distant_kept"] == 0.3 and points.loc["a (hard)", "passkey"] == 0.25
    assert pd.isna(points.loc["b (hard)", "passkey"])
    plot_tradeoff(points.reset_index(), tmp_path / "tradeoff.png", "books", "wikitext2", "a note")
    assert (tmp_path / "tradeoff.png").stat().st_size > 10_000 and (tmp_path / "tradeoff.svg").exists()
    assert tradeoff_points(frame.drop(columns=["wikitext2_test"]), "books", "wikitext2").empty  # nothing to compare


def test_perplexity_figure_draws_paired_changes_of_real_models_only(tmp_path):
    """The perplexity table gains each method's paired change against pretrained; the figure leaves tiny models out."""
    import json

    from focus.report.figures import plot_perplexity_changes
    from focus.report.tables import perplexity_frame

    def record(model, source, method, windows):
        path = tmp_path / f"{model}-{method}.json"
        path.write_text(json.dumps({"model": model, "source": source, "method": method, "domain": "books",
                                    "perplexity": 1.0, "nll": 0.0, "tokens": 10, "context_length": 8, "seconds": 1.0,
                                    "window_nll": windows}))
        return path

    records = [record("smollm2", "smollm2-135m-instruct", "pretrained", [3.0, 3.2, 3.4]),
               record("smollm2", "smollm2-135m-instruct", "focus-hard", [2.9, 3.15, 3.3]),
               record("tiny-qwen2", "tiny:qwen2", "pretrained", [10.0, 10.1, 10.2]),
               record("tiny-qwen2", "tiny:qwen2", "focus-hard", [10.0, 10.2, 10.2])]
    frame = perplexity_frame(records).set_index(["model", "method"])
    change = frame.loc[("smollm2", "focus-hard")]
    assert change["change"] == pytest.approx(math.expm1((-0.1 - 0.05 - 0.1) / 3))
    assert change["change_low"] < change["change"] < change["change_high"]
    assert pd.isna(frame.loc[("smollm2", "pretrained"), "change"])
    plot_perplexity_changes(frame.reset_index(), tmp_path / "perplexity.png")
    assert (tmp_path / "perplexity.png").stat().st_size > 10_000
    plot_perplexity_changes(frame.reset_index().drop(columns=["source"]), tmp_path / "older.png")  # a table before it
    assert (tmp_path / "older.png").stat().st_size > 10_000


def test_study_frame_sets_every_corpus_against_pretrained_and_counts_the_pass_key_per_length(tmp_path):
    """The forgetting screen's columns (configs/forgetting_test.yaml): the other corpus has its paired interval as the
    study domain has, and the pass-key reads per length (its accuracy and the key's mean log-probability)."""
    import json

    from focus.report.study import study_frame

    def record(name, **fields):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps({"model": "m", **fields}))
        return path

    def perplexity(method, domain, split, windows):
        return record(f"{method}-{domain}-{split}", method=method, domain=domain,
                      perplexity=math.exp(sum(windows) / len(windows)),
                      window_nll=windows)

    def needle(method, correct):
        trials = [{"length": length, "correct": ok, "key_logprob": -1.0 if ok else -3.0}
                  for length, ok in zip([1024, 1024, 2048, 2048], correct)]
        return record(f"{method}-needle", method=method, accuracy=sum(correct) / 4, trials=trials)

    validation, test = [], []
    for split, files in (("validation", validation), ("test", test)):
        for domain, shift in (("books", -0.1), ("wikitext2", 0.2)):
            files.append(perplexity("pretrained", domain, split, [3.0, 3.2, 3.1]))
            files.append(perplexity("a-hard", domain, split, [3.0 + shift, 3.2 + shift, 3.1 + shift * 0.5]))
    needles = [needle("pretrained", [True, True, True, False]), needle("a-hard", [True, True, False, False])]
    contexts = [record("a-ctx-test", method="a-hard", domain="books", context_length=2048, perplexity=30.0),
                record("a-ctx-validation", method="a-hard", domain="books", context_length=4096, perplexity=31.0,
                       split="validation")]
    frame = study_frame("m", {"a": {"window": 128}}, "books", [], validation, test, contexts, needle=needles)
    row, base = frame.set_index("design").loc["a"], frame.set_index("design").loc["pretrained"]
    for column in ("books_validation", "wikitext2_validation", "books_test", "wikitext2_test"):
        low, change, high = (row[f"{column}_hard_vs_pretrained{b}"] for b in ("_low", "", "_high"))
        assert low < change < high and change == pytest.approx(row[f"{column}_hard"] / base[column] - 1)
    assert row["wikitext2_test_hard_vs_pretrained_low"] > 0 > row["books_test_hard_vs_pretrained_high"]
    assert list(frame.columns[2:4]) == ["books_validation", "books_validation_hard"]  # the choice's column first
    assert (row["needle_1024_hard"], row["needle_2048_hard"], base["needle_2048"]) == (1.0, 0.0, 0.5)
    assert (row["key_logprob_2048_hard"], base["key_logprob_1024"]) == (-3.0, -1.0)
    # A long context scored on validation (`long_context.split`) names its split; the test split's columns as before.
    assert (row["ctx2048_hard"], row["ctx4096_validation_hard"]) == (30.0, 31.0)
    # The trade-off reads both corpora on validation where the study scores both there (test only where it must).
    point = tradeoff_points(frame, "books", "wikitext2").set_index("design").loc["a (hard)"]
    assert point["other_change"] == pytest.approx(row["wikitext2_validation_hard"] / base["wikitext2_validation"] - 1)
