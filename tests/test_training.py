"""The centroid training loop on a tiny random Llama: what trains, that it learns, and exact resume."""

from __future__ import annotations

import json
import math
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import transformers

from focus import apply_focus
from focus.config import ConfigError, FocusConfig
from focus.retrofit import focus_disabled
from focus.train.checkpoint import CheckpointError, LogWindow
from focus.train.config import TrainConfig
from focus.train.loop import evaluate_loss, next_token_loss, train_parameters
from focus.train.objective import Objective, focus_objective
from focus.train.retrieval import retrieval_rows

TESTS_DIR = Path(__file__).resolve().parent
# Checkpoints at 4 and 8 fall inside logging windows (3, 6, 9), so the window sums must be restored too.
RESUME_CONFIG = TrainConfig(
    steps=16, batch_size=4, lr=1e-2, warmup_steps=2, schedule="cosine", seed=7,
    log_every=3, checkpoint_every=4, eval_every=5, eval_batch_size=3,
)


pytestmark = pytest.mark.usefixtures("one_thread")


def tiny_llama(attention_dropout: float = 0.0) -> transformers.LlamaForCausalLM:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=128, max_position_embeddings=64,
        attention_dropout=attention_dropout,
    )
    return transformers.LlamaForCausalLM(config).eval()


def with_trainable_head(model: torch.nn.Module) -> torch.nn.Module:
    """Stand-in for apply_focus: freeze everything, then unfreeze a few small tensors."""
    model.requires_grad_(False)
    model.model.norm.weight.requires_grad_(True)
    model.lm_head.weight.requires_grad_(True)
    return model


def resume_model() -> torch.nn.Module:
    """The model of the resume tests: the tiny Llama with real Focus centroids (and group-bias buffers)."""
    calibration = pattern_data(rows=4, seed=3)
    return apply_focus(tiny_llama(), FocusConfig(num_groups=4, window=4, top_k=2), calibration_ids=calibration)


def pattern_data(rows: int = 26, length: int = 24, seed: int = 1) -> torch.Tensor:
    """(rows, length) sequences that repeat a random 4-token pattern from a 16-token alphabet."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 16, (rows, 4), generator=g).repeat(1, length // 4)


def training_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Trainable parameters and persistent buffers (Focus keeps its running group bias in one)."""
    persistent = model.state_dict().keys()
    state = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    state.update({n: b.detach().clone() for n, b in model.named_buffers() if n in persistent})
    return state


def read_metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def logged_steps(config: TrainConfig, evaluating: bool) -> list[int]:
    return [
        s for s in range(1, config.steps + 1)
        if s % config.log_every == 0 or s == config.steps or (evaluating and s % config.eval_every == 0)
    ]


def without_timing(records: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in records]


def run_uninterrupted(out: Path) -> tuple[dict, torch.nn.Module]:
    model = resume_model()
    data = pattern_data()
    final = train_parameters(model, data, RESUME_CONFIG, out, eval_data=data[:5], progress=False)
    return final, model


@pytest.mark.parametrize("use_focus", [False, True], ids=["stand-in", "apply_focus"])
def test_only_trainable_parameters_change_and_network_stays_in_eval_mode(tmp_path, use_focus):
    model = tiny_llama(attention_dropout=0.5)
    if use_focus:
        apply_focus(model, FocusConfig(num_groups=4, window=4, top_k=2), calibration_ids=pattern_data(rows=4))
    else:
        with_trainable_head(model)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    modes = []
    model.register_forward_hook(lambda module, args, output: modes.append(module.training))
    model.train()  # the loop must switch the frozen network to eval mode (no dropout) itself

    train_parameters(model, pattern_data(), TrainConfig(steps=5, batch_size=4, lr=1e-2), tmp_path, progress=False)

    assert modes and not any(modes) and not model.training
    for name, p in model.named_parameters():
        if p.requires_grad:
            assert not torch.equal(p, before[name]), f"trainable {name} did not change"
        else:
            assert torch.equal(p, before[name]), f"frozen {name} changed"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.pt", "metrics.jsonl"]


def test_a_run_of_no_steps_scores_the_centroids_as_k_means_left_them(tmp_path):
    """steps 0 (a profile's untrained designs): nothing changes, the eval data is scored once, as step 0."""
    model = tiny_llama()
    apply_focus(model, FocusConfig(num_groups=4, window=4, top_k=2), calibration_ids=pattern_data(rows=4))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    logged = []
    held_out = pattern_data(rows=4, seed=3)

    final = train_parameters(model, pattern_data(), TrainConfig(steps=0, batch_size=4), tmp_path, eval_data=held_out,
                             progress=False, on_log=logged.append)

    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())
    assert final == {"step": 0, "eval/loss": pytest.approx(evaluate_loss(model, held_out, 8)),
                     "eval/ppl": pytest.approx(math.exp(final["eval/loss"]))}
    assert [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()] == logged == [final]
    # Finished: run again, it returns the same record and logs nothing twice (as a finished run of any length).
    again = train_parameters(model, pattern_data(), TrainConfig(steps=0, batch_size=4), tmp_path, eval_data=held_out,
                             progress=False, on_log=logged.append)
    assert again == final and len((tmp_path / "metrics.jsonl").read_text().splitlines()) == len(logged) == 1
    assert train_parameters(model, pattern_data(), TrainConfig(steps=0, batch_size=4), tmp_path / "bare",
                            progress=False) == {"step": 0}  # no eval data: nothing to log
    assert (tmp_path / "bare" / "metrics.jsonl").read_text() == ""


def test_loss_decreases_on_repeating_patterns(tmp_path):
    model = with_trainable_head(tiny_llama())
    data, held_out = pattern_data(64, 32, seed=1), pattern_data(16, 32, seed=2)
    initial_eval = evaluate_loss(model, held_out, batch_size=8)
    config = TrainConfig(steps=40, batch_size=8, lr=3e-2, schedule="constant", log_every=5, checkpoint_every=0)

    final = train_parameters(model, data, config, tmp_path, eval_data=held_out, progress=False)

    records = read_metrics(tmp_path)
    assert [r["step"] for r in records] == list(range(5, 41, 5))
    assert records[0]["train/loss"] > records[-1]["train/loss"] + 1.0
    assert final["eval/loss"] < initial_eval - 1.0
    assert final["eval/ppl"] == pytest.approx(math.exp(final["eval/loss"]))
    assert final["train/tokens"] == 40 * 8 * 32 and final["train/lr"] == 3e-2


_KILLED_RUN = """
import sys, time, torch
sys.path.insert(0, {tests_dir!r})
torch.set_num_threads({threads})  # same reductions as the parent, or floats could differ
import test_training as t
from focus.train import train_parameters

def hang_at_step(record):
    if record["step"] >= {hang_at}:
        time.sleep(300)  # the parent SIGKILLs us here

data = t.pattern_data()
train_parameters(t.resume_model(), data, t.RESUME_CONFIG, {out!r}, eval_data=data[:5],
                progress=False, on_log=hang_at_step)
"""


def test_sigkilled_run_resumes_to_identical_parameters(tmp_path):
    expected_final, expected_model = run_uninterrupted(tmp_path / "a")
    expected_records = read_metrics(tmp_path / "a")

    # Run B in a subprocess and SIGKILL it after its step-9 line: checkpoint 8 exists, line 9 is past it.
    out = tmp_path / "b"
    script = _KILLED_RUN.format(tests_dir=str(TESTS_DIR), threads=torch.get_num_threads(), hang_at=9, out=str(out))
    proc = subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 45
        while not any(r["step"] >= 9 for r in _safe_read_metrics(out)):
            assert proc.poll() is None, f"training subprocess exited early:\n{proc.stderr.read()}"
            assert time.monotonic() < deadline, "training subprocess never reached step 9"
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL
    assert torch.load(out / "checkpoint.pt", weights_only=True)["step"] == 8
    assert max(r["step"] for r in read_metrics(out)) == 9

    model = resume_model()
    data = pattern_data()
    final = train_parameters(model, data, RESUME_CONFIG, out, eval_data=data[:5], progress=False)

    expected = training_state(expected_model)
    resumed = training_state(model)
    assert expected.keys() == resumed.keys()
    # The group bias moved during training, so restoring it is really tested.
    assert any(t.abs().sum() > 0 for name, t in expected.items() if "focus_group_bias" in name)
    for name in expected:
        assert torch.equal(resumed[name], expected[name]), f"{name} differs after resume"
    records = read_metrics(out)
    assert [r["step"] for r in records] == logged_steps(RESUME_CONFIG, evaluating=True)
    assert without_timing(records) == without_timing(expected_records)
    assert without_timing([final]) == without_timing([expected_final])
    assert not list(out.glob("*.tmp"))


def _safe_read_metrics(out: Path) -> list[dict]:
    """Metrics lines written so far; the last one may be half-written while we read."""
    try:
        lines = (out / "metrics.jsonl").read_text().splitlines()
    except FileNotFoundError:
        return []
    records = []
    for line in lines:
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            pass
    return records


def test_crash_then_resume_then_finished_run_is_a_noop(tmp_path):
    _, expected_model = run_uninterrupted(tmp_path / "a")
    out = tmp_path / "b"
    data = pattern_data()

    def crash(record):
        if record["step"] == 10:
            raise KeyboardInterrupt  # what Ctrl-C mid-run looks like to the loop

    with pytest.raises(KeyboardInterrupt):
        train_parameters(resume_model(), data, RESUME_CONFIG, out, eval_data=data[:5], progress=False, on_log=crash)
    assert torch.load(out / "checkpoint.pt", weights_only=True)["step"] == 8

    final = train_parameters(resume_model(), data, RESUME_CONFIG, out, eval_data=data[:5], progress=False)
    log = (out / "metrics.jsonl").read_text()

    # Re-running the finished run trains nothing, loads the final parameters and returns its metrics.
    model = resume_model()
    assert train_parameters(model, data, RESUME_CONFIG, out, eval_data=data[:5], progress=False) == final
    assert (out / "metrics.jsonl").read_text() == log
    for name, value in training_state(expected_model).items():
        assert torch.equal(training_state(model)[name], value), name


def test_the_training_time_counts_the_steps_before_a_resume(tmp_path):
    """`time/train_seconds` is the run's wall time: a resumed run adds the seconds its checkpoint recorded, so a table
    of training times does not book a killed and resumed training as only its last part."""
    out, data = tmp_path / "run", pattern_data()

    def crash(record):
        if record["step"] == 10:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train_parameters(resume_model(), data, RESUME_CONFIG, out, eval_data=data[:5], progress=False, on_log=crash)
    state = torch.load(out / "checkpoint.pt", weights_only=True)
    assert 0 < state["seconds"] < 60
    state["seconds"] = 1000.0  # as if the first part had run for a quarter of an hour
    torch.save(state, out / "checkpoint.pt")
    final = train_parameters(resume_model(), data, RESUME_CONFIG, out, eval_data=data[:5], progress=False)
    assert 1000.0 < final["time/train_seconds"] < 1060.0
    assert json.loads((out / "metrics.jsonl").read_text().splitlines()[-1]) == final


def test_resume_restores_the_global_rngs(tmp_path):
    """An objective term drawing from torch, random and numpy continues the same streams after a resume."""

    def noisy_term(model, batch, logits):
        noise = torch.rand(()) + random.random() + np.random.rand()
        return model.model.norm.weight.sum() * noise

    data = pattern_data()
    config = TrainConfig(steps=6, batch_size=4, log_every=1, checkpoint_every=2)
    noisy = Objective({"noise": (0.1, noisy_term)})
    expected = with_trainable_head(tiny_llama())
    train_parameters(expected, data, config, tmp_path / "a", objective=noisy, progress=False)

    def crash(record):
        if record["step"] == 5:
            raise RuntimeError("simulated crash")

    with pytest.raises(RuntimeError, match="simulated crash"):
        train_parameters(with_trainable_head(tiny_llama()), data, config, tmp_path / "b",
                        objective=noisy, progress=False, on_log=crash)
    random.seed(123)  # whatever the caller did in between must not matter
    resumed = with_trainable_head(tiny_llama())
    train_parameters(resumed, data, config, tmp_path / "b", objective=noisy, progress=False)
    for name, value in training_state(expected).items():
        assert torch.equal(training_state(resumed)[name], value), name


def test_mismatched_checkpoint_is_refused_and_changes_nothing(tmp_path):
    data = pattern_data()
    config = TrainConfig(steps=2, batch_size=4, checkpoint_every=1)
    train_parameters(with_trainable_head(tiny_llama()), data, config, tmp_path, progress=False)
    files = {p.name: p.read_bytes() for p in tmp_path.iterdir()}

    other = tiny_llama()
    other.requires_grad_(False)
    other.model.norm.weight.requires_grad_(True)
    with pytest.raises(CheckpointError, match=r"missing \(first 'lm_head.weight'\)|unexpected \(first 'lm_head"):
        train_parameters(other, data, config, tmp_path, progress=False)
    wider = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        hidden_size=48, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=128))
    with pytest.raises(CheckpointError, match=r"'model.norm.weight' is torch.float32 \(32,\) in the checkpoint"):
        train_parameters(with_trainable_head(wider), data, config, tmp_path, progress=False)
    with pytest.raises(CheckpointError, match=r"TrainConfig.lr=0.001, this run has 0.002"):
        faster = TrainConfig(steps=2, batch_size=4, checkpoint_every=1, lr=2e-3)
        train_parameters(with_trainable_head(tiny_llama()), data, faster, tmp_path, progress=False)
    with pytest.raises(CheckpointError, match="different training data"):
        train_parameters(with_trainable_head(tiny_llama()), data.flip(0), config, tmp_path, progress=False)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == files

    (tmp_path / "checkpoint.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="cannot read .*checkpoint.pt"):
        train_parameters(with_trainable_head(tiny_llama()), data, config, tmp_path, progress=False)


def test_a_checkpoint_of_another_focus_config_is_refused(tmp_path):
    """Another window (or any FocusConfig field) trains other centroids: resuming them would mix the two runs."""
    data = pattern_data()
    config = TrainConfig(steps=2, batch_size=4, checkpoint_every=1)
    calibration = data[:2]
    model = apply_focus(tiny_llama(), FocusConfig(num_groups=4, window=4), calibration_ids=calibration)
    train_parameters(model, data, config, tmp_path, progress=False)
    files = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    wider = apply_focus(tiny_llama(), FocusConfig(num_groups=4, window=6), calibration_ids=calibration)
    with pytest.raises(CheckpointError, match=r"FocusConfig.window=4, this run has 6; use a new output_dir"):
        train_parameters(wider, data, config, tmp_path, progress=False)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == files
    again = apply_focus(tiny_llama(), FocusConfig(num_groups=4, window=4, mode="hard"), calibration_ids=calibration)
    train_parameters(again, data, config, tmp_path, progress=False)  # the mode is not a setting of the run


def test_epochs_visit_a_fresh_permutation_of_full_batches(tmp_path):
    model = with_trainable_head(tiny_llama())
    data = torch.arange(7).repeat_interleave(2).reshape(7, 2)  # row i is [i, i]
    seen = []
    model.register_forward_pre_hook(lambda module, args, kwargs: seen.append(kwargs["input_ids"][:, 0].tolist()),
                                    with_kwargs=True)
    train_parameters(model, data, TrainConfig(steps=6, batch_size=3, checkpoint_every=0), tmp_path, progress=False)

    epochs = [sum(seen[i : i + 2], []) for i in range(0, 6, 2)]  # 7 // 3 = 2 full batches per epoch
    assert all(len(set(rows)) == 6 for rows in epochs)
    assert len({tuple(rows) for rows in epochs}) == 3


def test_objective_terms_are_logged_unweighted_and_minimised_weighted(tmp_path):
    data = pattern_data()
    penalty = lambda model, batch, logits: model.model.norm.weight.pow(2).sum()  # noqa: E731
    trained = {}
    for weight in (0.0, 1.0):
        model = with_trainable_head(tiny_llama())
        config = TrainConfig(steps=3, batch_size=4, log_every=1)
        objective = Objective({"penalty": (weight, penalty)})
        final = train_parameters(model, data, config, tmp_path / str(weight), objective=objective, progress=False)
        assert final["train/penalty_loss"] > 0
        trained[weight] = model.model.norm.weight.detach().clone()
    assert trained[1.0].pow(2).sum() < trained[0.0].pow(2).sum()  # the penalty pulled the weights down
    with pytest.raises(ValueError, match="nothing to minimise"):
        Objective({"penalty": (0.0, penalty)}, next_token_weight=0.0)


def test_distillation_holds_a_focus_model_near_the_pretrained_one(tmp_path):
    """The distill term is KL(pretrained || Focus), the teacher being the same model with Focus switched off."""
    data = pattern_data()
    model = apply_focus(tiny_llama(), FocusConfig(num_groups=4, window=4, top_k=1, distill=1.0),
                        calibration_ids=data[:2])
    with torch.no_grad():
        focus_logits = model(input_ids=data[:2]).logits
        with focus_disabled(model):
            pretrained_logits = model(input_ids=data[:2]).logits
    assert not torch.allclose(focus_logits, pretrained_logits)  # Focus changes this model: the KL is not 0
    expected = F.kl_div(F.log_softmax(focus_logits[:, :-1], -1).flatten(0, 1),
                        F.log_softmax(pretrained_logits[:, :-1], -1).flatten(0, 1), log_target=True,
                        reduction="batchmean")
    objective = focus_objective(model)
    weight, term = objective.terms["distill"]
    assert weight == 1.0 and objective.next_token_weight == 1.0
    torch.testing.assert_close(term(model, data[:2], focus_logits), expected)
    with torch.no_grad():  # Focus is back on after it
        torch.testing.assert_close(model(input_ids=data[:2]).logits, focus_logits)
    final = train_parameters(model, data, TrainConfig(steps=2, batch_size=4, log_every=1), tmp_path,
                             objective=objective, progress=False)
    assert final["train/distill_loss"] > 0


def test_the_teacher_term_weighs_only_the_rows_given_to_it(tmp_path):
    """With term weights the teacher's KL is the weighted mean over the weighted rows' tokens (the broad rows of a
    mixture); a batch with none adds 0 and still trains on the next-token loss; the weights belong to the resume."""
    data = pattern_data()
    model = apply_focus(tiny_llama(), FocusConfig(num_groups=4, window=4, top_k=1, distill=1.0),
                        calibration_ids=data[:2])
    _, term = focus_objective(model).terms["distill"]
    batch = data[:3]
    with torch.no_grad():
        logits = model(input_ids=batch).logits
        per_row = [term(model, batch[i : i + 1], logits[i : i + 1]) for i in range(3)]
        weights = torch.zeros(batch.shape)
        weights[1] = 1.0
        torch.testing.assert_close(term(model, batch, logits, weights), per_row[1])
        weights[2, : batch.shape[1] // 2 + 1] = 1.0  # the first half of row 2's predictions
        half = term(model, batch[2:3, : batch.shape[1] // 2 + 1], logits[2:3, : batch.shape[1] // 2 + 1])
        steps = batch.shape[1] - 1
        expected = (per_row[1] * steps + half * (batch.shape[1] // 2)) / (steps + batch.shape[1] // 2)
        torch.testing.assert_close(term(model, batch, logits, weights), expected)
        assert term(model, batch, logits, torch.zeros(batch.shape)).item() == 0.0
    broad = torch.zeros(data.shape)
    broad[data.shape[0] // 2 :] = 1.0
    config = TrainConfig(steps=2, batch_size=4, log_every=1, checkpoint_every=1)
    final = train_parameters(model, data, config, tmp_path / "run", objective=focus_objective(model),
                             token_weights=1 - broad, term_weights={"distill": broad}, progress=False)
    assert final["train/distill_loss"] >= 0 and final["train/loss"] >= 0
    with pytest.raises(CheckpointError):  # other weights, the same data: not the run the checkpoint belongs to
        train_parameters(model, data, config.replace(steps=3), tmp_path / "run", objective=focus_objective(model),
                         token_weights=1 - broad, term_weights={"distill": 1 - broad}, progress=False)


def test_logged_losses_average_the_steps_they_applied_to():
    """A batch of rows that learn from the teacher alone has no next-token loss: the logged mean leaves it out, as
    the teacher's mean leaves out the batches it did not score; a window from an older checkpoint counts every step."""
    window = LogWindow()
    window.add(3.0, {"distill": 0.0}, {"loss": 1.0, "distill": 0.0})
    window.add(0.0, {"distill": 0.2}, {"loss": 0.0, "distill": 1.0})
    window.add(2.0, {"distill": 0.4}, {"loss": 1.0, "distill": 1.0})
    assert window.means() == pytest.approx({"loss": 2.5, "distill": 0.3})
    old = LogWindow.from_state({"loss_sum": 6.0, "term_sums": {"distill": 0.6}, "steps": 3})  # as checkpoints held it
    assert old.means() == pytest.approx({"loss": 2.0, "distill": 0.2})
    old.add(2.0, {"distill": 0.2})
    assert old.means() == pytest.approx({"loss": 2.0, "distill": 0.2})


def test_no_trainable_parameters_or_bad_data_is_one_clear_error(tmp_path):
    model = tiny_llama().requires_grad_(False)
    with pytest.raises(ValueError, match="no parameters with requires_grad=True"):
        train_parameters(model, pattern_data(), TrainConfig(), tmp_path / "out")
    model = with_trainable_head(tiny_llama())
    with pytest.raises(ValueError, match="data must be an integer tensor of shape"):
        train_parameters(model, pattern_data().float(), TrainConfig(), tmp_path / "out")
    with pytest.raises(ValueError, match="5 sequences, fewer than one batch of 8"):
        train_parameters(model, pattern_data(rows=5), TrainConfig(batch_size=8), tmp_path / "out")
    with pytest.raises(ValueError, match=r"outside the model's vocabulary \[0, 128\)"):
        train_parameters(model, pattern_data() + 120, TrainConfig(), tmp_path / "out")
    positions = model.config.max_position_embeddings
    with pytest.raises(ValueError, match=f"a context of {positions + 1} tokens exceeds llama's {positions} positions"):
        train_parameters(model, torch.zeros(8, positions + 1, dtype=torch.long), TrainConfig(), tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "values, key",
    [
        ({"steps": -1}, "steps"),
        ({"steps": 2.5}, "steps"),
        ({"batch_size": 0}, "batch_size"),
        ({"lr": 0}, "lr"),
        ({"lr": float("nan")}, "lr"),
        ({"weight_decay": -0.1}, "weight_decay"),
        ({"warmup_steps": 11, "steps": 10}, "warmup_steps"),
        ({"schedule": "linear"}, "schedule"),
        ({"min_lr_ratio": 1.5}, "min_lr_ratio"),
        ({"grad_clip": -1}, "grad_clip"),
        ({"seed": -1}, "seed"),
        ({"log_every": 0}, "log_every"),
        ({"checkpoint_every": -1}, "checkpoint_every"),
        ({"eval_every": -1}, "eval_every"),
        ({"learning_rate": 1e-3}, "learning_rate"),
    ],
)
def test_bad_config_names_the_key(values, key):
    with pytest.raises(ConfigError, match=key):
        TrainConfig.from_dict(values)


def test_lr_schedule_warms_up_then_decays_to_the_floor():
    config = TrainConfig(steps=10, warmup_steps=2, schedule="cosine", min_lr_ratio=0.1)
    factors = [config.lr_factor(s) for s in range(10)]
    assert factors[:3] == [0.5, 1.0, 1.0]
    assert all(a >= b for a, b in zip(factors[2:], factors[3:]))
    assert config.lr_factor(10) == pytest.approx(0.1)
    assert TrainConfig(steps=5, schedule="constant").lr_factor(4) == 1.0
    assert TrainConfig.from_dict({"lr": 1}).lr == 1.0  # ints coerce to float


def test_token_weights_make_the_loss_a_weighted_mean_and_are_part_of_the_data(tmp_path):
    data = pattern_data()
    logits = torch.randn(2, data.shape[1], 128)
    per_token = F.cross_entropy(logits[:, :-1].reshape(-1, 128), data[:2, 1:].reshape(-1), reduction="none")
    weights = torch.rand(2, data.shape[1])
    expected = (per_token * weights[:, 1:].reshape(-1)).sum() / weights[:, 1:].sum()
    torch.testing.assert_close(next_token_loss(logits, data[:2], weights=weights), expected)
    torch.testing.assert_close(next_token_loss(logits, data[:2], weights=torch.ones(2, data.shape[1])),
                               next_token_loss(logits, data[:2]))

    config = TrainConfig(steps=2, batch_size=4, checkpoint_every=1)
    half = torch.ones(data.shape)
    half[:, : data.shape[1] // 2] = 0.0
    model = with_trainable_head(tiny_llama())
    train_parameters(model, data, config.replace(steps=1), tmp_path, token_weights=half, progress=False)
    with pytest.raises(CheckpointError):  # other weights are other data: no resume onto them
        train_parameters(model, data, config, tmp_path, token_weights=torch.ones(data.shape), progress=False)
    with pytest.raises(ValueError, match="token_weights must be floats >= 0 of the data's shape"):
        train_parameters(model, data, config, tmp_path / "bad", token_weights=-half, progress=False)
    assert not (tmp_path / "bad").exists()


def test_retrieval_rows_ask_back_facts_planted_beyond_the_window(tiny_tokenizer):
    filler = torch.tensor(tiny_tokenizer("It was the best of times, it was the worst. " * 400).input_ids)
    rows, weights = retrieval_rows(tiny_tokenizer, filler, count=6, seq_len=900, window=64, facts=3,
                                   answer_weight=5.0, seed=1)
    assert rows.shape == weights.shape == (6, 900)
    for row, weight in zip(rows, weights):
        answered = (weight == 5.0).nonzero().flatten()
        spans = torch.tensor_split(answered, (answered.diff() > 1).nonzero().flatten() + 1)
        assert len(spans) == 3 and set(weight.unique().tolist()) == {1.0, 5.0}
        for span in spans:  # the answer's tokens stand earlier in the row, more than a window before it
            key = row[span].tolist()
            starts = [s for s in range(span[0] - len(key)) if row[s : s + len(key)].tolist() == key]
            assert starts and span[0] - starts[-1] > 64
    again, _ = retrieval_rows(tiny_tokenizer, filler, count=6, seq_len=900, window=64, facts=3, seed=1)
    assert torch.equal(again, rows)  # a row is a function of the seed and its index
    short, weights = retrieval_rows(tiny_tokenizer, filler, count=2, seq_len=300, window=64, facts=3, answer_weight=5.0)
    answers = [(w == 5.0).int().diff().eq(1).sum().item() for w in weights]
    assert short.shape == (2, 300) and all(1 <= count < 3 for count in answers)  # as many facts as short rows hold
    with pytest.raises(ValueError, match="no room for a fact 64 tokens before its question"):
        retrieval_rows(tiny_tokenizer, filler, count=1, seq_len=200, window=64, facts=3)
