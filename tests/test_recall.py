"""The attention-recall objective: its loss against a per-pair loop, and training under it."""

import json
import math

import pytest
import torch
from safetensors.torch import save_file
from test_reference import padded_causal_mask
from test_training import tiny_llama

from focus import FocusConfig, apply_focus, load_focus
from focus.adapter import read_adapter_config
from focus.attention.routers.recall import LOSSES_ATTRIBUTE, recall_loss
from focus.attention.routers.routing import sink_keys
from focus.models import load_model
from focus.pipeline.jobs import TrainingJob
from focus.pipeline.stages import train_focus
from focus.train.config import TrainConfig
from focus.train.loop import METRICS_NAME, evaluate_loss, train_parameters
from focus.train.objective import focus_objective

pytestmark = pytest.mark.usefixtures("one_thread")


def _loop_recall_loss(query, key, log_p_q, log_p_k, window, mask, sinks):
    """The definition, one query at a time: -sum_i m_i log r_i / sum_i m_i over every (row, query head, query)."""
    b, h, q_len, d = query.shape
    k_heads, k_len = key.shape[1], key.shape[2]
    p_q, p_k = log_p_q.exp(), log_p_k.exp()
    numerator = denominator = 0.0
    for row in range(b):
        for head in range(h):
            kv = head // (h // k_heads)
            q_head = head if p_q.shape[1] == h else kv
            for i in range(q_len):
                pos = k_len - q_len + i
                allowed = [j for j in range(k_len) if j <= pos and (mask is None or mask[row, 0, i, j])]
                if not allowed:
                    continue
                scores = torch.stack([query[row, head, i] @ key[row, kv, j] / math.sqrt(d) for j in allowed])
                weights = dict(zip(allowed, torch.softmax(scores, dim=0).tolist()))
                distant = [j for j in allowed if pos - j >= window and not (sinks is not None and sinks[row % len(sinks), j])]
                mass = sum(weights[j] for j in distant)
                if mass == 0:
                    continue
                kept = sum(weights[j] * float(p_q[row, q_head, i] @ p_k[row, kv, j]) for j in distant)
                numerator += mass * math.log(max(kept / mass, 1e-6))
                denominator += mass
    return -numerator / denominator


@pytest.mark.parametrize(("heads", "per_query_head", "padded", "sink_tokens"),
                         [(1, False, False, 0), (4, True, True, 1), (4, False, False, 2)])
def test_recall_loss_matches_the_per_query_definition(heads, per_query_head, padded, sink_tokens):
    gen = torch.Generator().manual_seed(0)
    b, k_heads, length, d, groups, window = 2, 2 if heads > 1 else 1, 12, 8, 3, 3
    query = torch.randn(b, heads, length, d, generator=gen)
    key = torch.randn(b, k_heads, length, d, generator=gen)
    log_p_q = torch.log_softmax(torch.randn(b, heads if per_query_head else k_heads, length, groups, generator=gen), -1)
    log_p_k = torch.log_softmax(torch.randn(b, k_heads, length, groups, generator=gen), -1)
    mask = padded_causal_mask(b, length, [0, 3]) if padded else None
    valid = None if mask is None else mask.any(dim=-2)[:, 0]
    sinks = sink_keys(valid, length, sink_tokens, None) if sink_tokens else None
    loss = recall_loss(query, key, log_p_q, log_p_k, window, mask, sinks, None, None)
    expected = _loop_recall_loss(query, key, log_p_q, log_p_k, window, mask, sinks)
    assert loss.item() == pytest.approx(expected, rel=1e-4)


def test_training_for_recall_keeps_the_model_output_and_raises_recall(tmp_path):
    model = tiny_llama()
    data = torch.randint(0, 128, (8, 48), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        before = model(input_ids=data[:2]).logits
    apply_focus(model, FocusConfig(num_groups=4, window=8, top_k=1, objective="attention_recall"), calibration_ids=data)
    centroids = [p.detach().clone() for p in model.parameters() if p.requires_grad]
    config = TrainConfig(steps=20, batch_size=4, lr=5e-2, log_every=1, checkpoint_every=0)
    with pytest.raises(RuntimeError, match="objective does not depend on the trained parameters"):
        train_parameters(model, data, config, tmp_path / "default", progress=False)  # the next-token loss alone
    for module in model.modules():
        getattr(module, LOSSES_ATTRIBUTE, []).clear()
    train_parameters(model, data, config, tmp_path, objective=focus_objective(model), progress=False)

    lines = [json.loads(line) for line in (tmp_path / METRICS_NAME).read_text().splitlines()]
    assert lines[-1]["train/recall_loss"] < lines[0]["train/recall_loss"]
    trained = [p.detach() for p in model.parameters() if p.requires_grad]
    assert any(not torch.equal(a, b) for a, b in zip(centroids, trained))
    with torch.enable_grad():  # the training path: Focus attends as the model does
        during = model(input_ids=data[:2]).logits
    torch.testing.assert_close(during, before, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("objective", ["attention_recall", "straight_through"])
def test_the_training_stage_scores_hard_trained_centroids_in_hard_mode_and_saves_them_for_it(tmp_path, objective):
    ids = torch.randint(3, 4000, (12 * 32,), generator=torch.Generator().manual_seed(2), dtype=torch.int32)
    tokens = tmp_path / "tokens.safetensors"
    save_file({"train": ids[: 8 * 32], "validation": ids[8 * 32 :]}, str(tokens))
    focus = {"num_groups": 4, "window": 8, "top_k": 1, "objective": objective}
    job = TrainingJob(tokens, 32, TrainConfig(steps=2, batch_size=2, log_every=1), tmp_path / "metrics.jsonl",
                      tmp_path / "summary.json", calibration_rows=2, eval_rows=2, retrieval_share=0, progress=False)
    summary = train_focus("tiny:llama", "float32", focus, job, tmp_path / "adapter")
    assert summary["eval_mode"] == "hard"
    assert math.isfinite(summary["final"].get("train/recall_loss", math.nan)) == (objective == "attention_recall")
    saved = read_adapter_config(tmp_path / "adapter")["focus_config"]
    assert saved["objective"] == objective and saved["mode"] == "hard"  # the mode it trained for, as it loads
    # The curve's last point is the hard model's validation loss with the saved centroids, as they load.
    model, _ = load_model("tiny:llama")
    load_focus(model, tmp_path / "adapter")
    validation = ids[8 * 32 :].long().view(-1, 32)[:2]
    assert evaluate_loss(model, validation) == pytest.approx(summary["final"]["eval/loss"], rel=1e-5)


UNTRAINED_FOCUS = {"num_groups": 4, "window": 8, "top_k": 1}


def untrained_job(tmp_path, eval_rows=2):
    """A training job of `steps: 0` (configs/base/untrained_groups.yaml) on random tokens: its tokens, job and
    summary, the adapter in tmp_path / "adapter"."""
    ids = torch.randint(3, 4000, (12 * 32,), generator=torch.Generator().manual_seed(2), dtype=torch.int32)
    tokens = tmp_path / "tokens.safetensors"
    save_file({"train": ids[: 8 * 32], "validation": ids[8 * 32 :]}, str(tokens))
    run = tmp_path / "train" / "tiny" / "kmeans"
    job = TrainingJob(tokens, 32, TrainConfig(steps=0, batch_size=2), run / "metrics.jsonl", run / "summary.json",
                      calibration_rows=2, eval_rows=eval_rows, retrieval_share=0, progress=False)
    summary = train_focus("tiny:llama", "float32", UNTRAINED_FOCUS, job, tmp_path / "adapter")
    return ids, job, summary


def test_a_training_job_of_no_steps_saves_the_k_means_centroids_and_scores_them(tmp_path):
    """The adapter holds the groups k-means made of the calibration rows, the summary the hard validation loss they
    give. (The training table and loss curves take such a run: tests/test_evaluation.py.)"""
    ids, _, summary = untrained_job(tmp_path)
    model, _ = load_model("tiny:llama")
    apply_focus(model, FocusConfig(**UNTRAINED_FOCUS, mode="hard"), calibration_ids=ids[: 2 * 32].long().view(2, 32))
    kmeans = [p.detach().clone() for p in model.parameters() if p.requires_grad]
    load_focus(model, tmp_path / "adapter")
    assert all(torch.equal(a, b) for a, b in zip(kmeans, (p for p in model.parameters() if p.requires_grad)))
    validation = ids[8 * 32 :].long().view(-1, 32)[:2]
    assert summary["final"] == {"step": 0, "eval/loss": pytest.approx(evaluate_loss(model, validation), rel=1e-5),
                                "eval/ppl": pytest.approx(math.exp(summary["final"]["eval/loss"]))}
