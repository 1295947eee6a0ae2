"""`python -m focus.lm_eval`: lm-eval's own command line with a `focus` model, against the in-process harness."""

from __future__ import annotations

import json

import pytest
import torch

from focus import FocusConfig, apply_focus, load_focus, save_focus, set_focus_mode
from focus.eval.harness import run_tasks, write_mirror_tasks
from focus.models import load_model


@pytest.fixture
def adapter(tmp_path):
    model, _ = load_model("tiny:llama")
    apply_focus(model, FocusConfig(num_groups=4, window=8, top_k=1), calibration_ids=torch.randint(3, 128, (2, 32)))
    save_focus(model, tmp_path / "adapter", base_model="tiny:llama")
    return tmp_path / "adapter"


def test_the_focus_model_through_lm_evals_command_line_scores_as_the_harness_does(adapter, tmp_path, monkeypatch):
    from focus.lm_eval import main

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    main(["--model", "focus", "--model_args", f"pretrained=tiny:llama,adapter={adapter},mode=hard",
          "--tasks", "arc_easy_mirror", "--limit", "6", "--batch_size", "2", "--output_path", str(tmp_path / "out")])
    [results] = (tmp_path / "out").rglob("results_*.json")
    accuracy = json.loads(results.read_text())["results"]["arc_easy_mirror"]["acc,none"]

    model, tokenizer = load_model("tiny:llama")
    load_focus(model, adapter)
    set_focus_mode(model, "hard")
    write_mirror_tasks(tmp_path / "tasks")
    metrics, _ = run_tasks(model, tokenizer, ["arc_easy"], tmp_path / "tasks", limit=6, batch_size=2)
    assert accuracy == pytest.approx(metrics["arc_easy"]["acc"])


def test_unknown_tasks_and_bad_model_args_are_refused(adapter, tmp_path):
    from focus.lm_eval import FocusLM

    with pytest.raises(ValueError, match="dense_below needs an adapter"):
        FocusLM(pretrained="tiny:llama", dense_below=64)
    with pytest.raises(ValueError, match="dtype='int8'"):
        FocusLM(pretrained="tiny:llama", adapter=str(adapter), dtype="int8")
