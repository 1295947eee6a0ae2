"""RULER through lm-eval on the real SmolLM2: documents generated offline, sized in the model's tokens, scored."""

import pytest

from focus import FocusConfig, apply_focus, remove_focus, set_focus_mode
from focus.eval.ruler import documents_stderr, run_ruler

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.filterwarnings("ignore:apply_focus. no calibration_ids")]


def test_ruler_needle_on_smollm2_and_focus_with_a_window_beyond_the_prompt_answers_the_same(smollm2, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model, tokenizer = smollm2
    scores, samples = run_ruler(model, tokenizer, ["niah_single_1", "niah_single_2"], [512], limit=2)

    assert scores["niah_single_2"] == {"skipped": "not in the data mirror and the hub is offline"}  # essay haystack
    cell = scores["niah_single_1"]["512"]
    assert cell["documents"] == 2 and cell["score"] == 1.0  # the pretrained model finds both needles at 512 tokens
    for sample in samples["niah_single_1"]:
        prompt = sample["arguments"][0][0]
        assert 256 < len(tokenizer(prompt).input_ids) <= 512  # sized in SmolLM2's own tokens
        assert "special magic number" in prompt

    apply_focus(model, FocusConfig(num_groups=4, window=1024, top_k=1))
    try:
        set_focus_mode(model, "hard")
        focus_scores, focus_samples = run_ruler(model, tokenizer, ["niah_single_1"], [512], limit=2)
    finally:
        remove_focus(model)
    assert focus_scores["niah_single_1"] == scores["niah_single_1"]
    assert [s["resps"] for s in focus_samples["niah_single_1"]] == [s["resps"] for s in samples["niah_single_1"]]


def test_unknown_tasks_and_nameless_tokenizers_are_refused_in_one_line(smollm2):
    model, tokenizer = smollm2
    with pytest.raises(ValueError, match=r"unknown RULER task\(s\) \['ruler_nope'\]"):
        run_ruler(model, tokenizer, ["ruler_nope"], [512], limit=1)
    nameless = type("Nameless", (), {"name_or_path": ""})()
    with pytest.raises(ValueError, match="tokenizer loaded from a folder or hub id"):
        run_ruler(model, nameless, ["niah_single_1"], [512], limit=1)


def test_a_length_lm_eval_gives_no_standard_error_takes_its_documents(smollm2, monkeypatch):
    """lm-eval aggregates RULER's own lengths (4,096 to 131,072) by RULER's function and reports no standard error there
    ("N/A": configs/routers_test.yaml's run at 4,096): such a cell takes its documents' (lm-eval's formula for a mean),
    a cell lm-eval gives one keeps it."""
    from lm_eval.api.metrics import mean_stderr

    import focus.eval.ruler as ruler

    model, tokenizer = smollm2
    documents = {2048: [1.0, 0.0, 0.5, 0.5], 4096: [0.2, 0.0, 1.0, 0.4]}

    def evaluate(lm, tasks, manager, limit, seed):  # what lm-eval returned there, one build a length, in order
        length = next(lengths)
        stderr = 0.25 if length == 2048 else "N/A"
        samples = [{str(length): score, str(6144 - length): -1.0} for score in documents[length]]
        result = {f"{length},none": sum(documents[length]) / 4, f"{length}_stderr,none": stderr}
        return {"results": {"ruler_vt": result}, "samples": {"ruler_vt": samples}}

    lengths = iter([2048, 4096])
    monkeypatch.setattr(ruler, "evaluate", evaluate)
    scores, _ = ruler.run_ruler(model, tokenizer, ["ruler_vt"], [2048, 4096], limit=4)
    assert scores["ruler_vt"]["2048"]["stderr"] == 0.25  # lm-eval's own
    assert scores["ruler_vt"]["4096"]["stderr"] == pytest.approx(mean_stderr(documents[4096]))
    assert documents_stderr([{"256": 1.0, "512": -1.0}, {"256": 0.0, "512": None}, {"512": 1.0}], 256) == 0.5
    assert documents_stderr([{"256": 1.0}], 256) is None  # one document: no spread to measure
