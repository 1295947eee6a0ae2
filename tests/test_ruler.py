"""RULER through lm-eval on the real SmolLM2: documents generated offline, sized in the model's tokens, scored."""

import pytest

from focus import FocusConfig, apply_focus, remove_focus, set_focus_mode
from focus.eval.ruler import run_ruler

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
