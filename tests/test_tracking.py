"""W&B as the pipeline's users see it, read back from real offline run files: a training job's curve logged while it
trains (and whole again after a kill and a resume), its weights as an Artifact, the report run's tables, figures,
pages and tables Artifact."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pandas as pd
import pytest
import torch
from helpers.wandb_file import history, iter_records, logged_media, run_config
from safetensors.torch import save_file

from focus.pipeline.jobs import TrainingJob
from focus.pipeline.stages import train_focus
from focus.pipeline.stamp import PROFILE, PROFILE_FILE, stamp_outputs, write_provenance_table
from focus.pipeline.tracking import LiveTrainingRun, WandbTarget, artifact_name, log_report_run
from focus.provenance import CPU_FLAGS
from focus.train.config import TrainConfig

pytest.importorskip("wandb")
SEQ = 64


@pytest.fixture
def results(tmp_path, monkeypatch):
    """A results folder, with every folder wandb writes to inside the test's own, offline. wandb reads its settings
    from the environment once per process: it is torn down after the test, so later tests' settings count."""
    import wandb

    monkeypatch.setenv("WANDB_MODE", "offline")
    for name in ("WANDB_DATA_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR"):
        monkeypatch.setenv(name, str(tmp_path / name.lower()))
    wandb.teardown()
    yield tmp_path / "results"
    wandb.teardown()


def _job(results: Path) -> TrainingJob:
    ids = torch.arange(40 * SEQ) % 500 + 100
    tokens = results / "tokens.safetensors"
    tokens.parent.mkdir(parents=True, exist_ok=True)
    save_file({"train": ids, "validation": ids[: 2 * SEQ].clone()}, str(tokens))
    target = WandbTarget(results / "wandb" / "train" / "tiny" / "focus.json", {"project": "focus"}, "test",
                         {"model": "tiny", "variant": "focus"})
    train = TrainConfig(steps=6, batch_size=2, log_every=1, checkpoint_every=2, eval_every=0, warmup_steps=0)
    return TrainingJob(tokens, SEQ, train, results / "train" / "metrics.jsonl", results / "train" / "summary.json",
                       calibration_rows=2, retrieval_share=0.0, progress=False, wandb=target)


def _wait_for_history(run_folder: Path, rows: int, seconds: float = 20.0) -> list[dict]:
    """The history of the run file in `run_folder` once it holds `rows` rows (W&B writes it from another process)."""
    deadline = time.monotonic() + seconds
    while True:
        found = [history(path) for path in run_folder.glob("run-*.wandb")]
        if (found and len(found[0]) >= rows) or time.monotonic() > deadline:
            return found[0] if found else []
        time.sleep(0.2)


@pytest.mark.slow
def test_training_curve_is_logged_while_it_trains_and_whole_after_a_resume(results, monkeypatch):
    import wandb

    focus = {"num_groups": 4, "top_k": 1, "window": 16}
    logged = LiveTrainingRun.__call__

    def killed_after_step_3(self, record):
        logged(self, record)
        if record["step"] == 3:
            raise KeyboardInterrupt  # the job dies after its checkpoint at step 2, having logged step 3

    monkeypatch.setattr(LiveTrainingRun, "__call__", killed_after_step_3)
    with pytest.raises(KeyboardInterrupt):
        train_focus("tiny:llama", "float32", focus, _job(results), results / "train" / "adapter")
    killed = Path(wandb.run.dir).parent
    # Before the run ends, its file already holds the three steps: a curve that W&B shows as it grows.
    assert [row["_step"] for row in _wait_for_history(killed, 3)] == [1, 2, 3]
    wandb.run.finish(exit_code=1)

    monkeypatch.setattr(LiveTrainingRun, "__call__", logged)
    summary = train_focus("tiny:llama", "float32", focus, _job(results), results / "train" / "adapter")
    assert summary["resumed"]
    record = json.loads((results / "wandb" / "train" / "tiny" / "focus.json").read_text())
    assert Path(record["folder"]) != killed and record["mode"] == "offline"
    metrics = [json.loads(line) for line in (results / "train" / "metrics.jsonl").open()]
    rows = history(record["run_file"])
    assert [row["_step"] for row in rows] == [row["step"] for row in metrics] == [1, 2, 3, 4, 5, 6]
    assert [row["train/loss"] for row in rows] == [row["train/loss"] for row in metrics]
    config = run_config(record["run_file"])
    assert config["model"] == "tiny" and config["train_config"]["steps"] == 6
    assert config["inputs"] == [str((results / "tokens.safetensors").absolute())]

    # The adapter, as an Artifact the run logged: its files, named after the job.
    assert record["artifact"]["name"] == "test-tiny-focus" and record["artifact"]["type"] == "focus-adapter"
    (artifact,) = [r.artifact for r in iter_records(record["run_file"]) if r.WhichOneof("record_type") == "artifact"]
    assert (artifact.name, artifact.digest) == ("test-tiny-focus", record["artifact"]["digest"])
    files = {entry.path for entry in artifact.manifest.contents}
    assert files == {path.name for path in (results / "train" / "adapter").iterdir()}
    assert json.loads(artifact.metadata)["focus_config"]["num_groups"] == 4


def test_report_run_logs_tables_figures_pages_and_the_tables_artifact(results, monkeypatch):
    monkeypatch.setenv(PROFILE, "tiny@0123456789ab")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    (results / "tables").mkdir(parents=True)
    (results / "tables" / "perplexity.csv").write_text("model,ppl\nsmollm2,29.6\n")
    stamp_outputs([results / "tables" / "perplexity.csv"])  # its provenance travels with it
    for model in ("a", "b"):  # one stem in two folders: keyed by path
        (results / "interpret" / model).mkdir(parents=True)
        (results / "interpret" / model / "group_shares.csv").write_text("group,share\n0,0.5\n")
    (results / "interpret" / "a" / "group_examples.html").write_text("<p>group 0: <b>the</b></p>")
    figure = results / "figures" / "loss.png"
    figure.parent.mkdir()
    plt.plot([1, 2]), plt.savefig(figure), plt.close()
    trained = results / "wandb" / "train" / "m" / "focus.json"
    trained.parent.mkdir(parents=True)
    trained.write_text(json.dumps({"artifact": {"name": "m-focus", "type": "focus-adapter", "digest": "d"}}))

    tables = [str(results / "tables" / "perplexity.csv"), *map(str, results.glob("interpret/*/group_shares.csv"))]
    record = log_report_run(results / "wandb" / "report.json", {"project": "focus"}, "tiny", tables,
                            [str(figure)], pages=[str(results / "interpret" / "a" / "group_examples.html")],
                            trained=[str(trained)])
    assert record["tables"] == {"tables/perplexity": "tables/perplexity.csv",
                                "tables/interpret/a/group_shares": "interpret/a/group_shares.csv",
                                "tables/interpret/b/group_shares": "interpret/b/group_shares.csv"}
    assert record["figures"] == {"figures/loss": "figures/loss.png"}
    assert record["pages"] == {"pages/group_examples": "interpret/a/group_examples.html"}
    media = logged_media(record["run_file"])
    assert media == {**{key: "table-file" for key in record["tables"]}, "figures/loss": "image-file",
                     "pages/group_examples": "html-file"}
    artifacts = [r.artifact for r in iter_records(record["run_file"]) if r.WhichOneof("record_type") == "artifact"]
    (artifact,) = [artifact for artifact in artifacts if artifact.type == "results"]  # W&B adds one per logged table
    assert artifact.name == "tables-tiny"
    assert {entry.path for entry in artifact.manifest.contents} == {f"{key}.csv" for key in record["tables"]} | {
        "tables/perplexity.provenance.json"}
    metadata = json.loads(artifact.metadata)
    assert metadata["trained"] == [{"name": "m-focus", "type": "focus-adapter", "digest": "d"}]
    assert list(metadata["provenance"]) == ["tables/perplexity"] and metadata["provenance"]["tables/perplexity"][
        "profile"] == "tiny@0123456789ab"


def test_a_rules_outputs_are_stamped_once_with_the_profile_and_the_command(tmp_path, monkeypatch):
    """The Markdown table gets the provenance line on top (once, however often it is stamped), the table and the
    figure a sidecar each naming the commit, the profile, the machine and the command; folders are left alone."""
    monkeypatch.setenv(PROFILE, "study@abcdef012345")
    monkeypatch.setenv(PROFILE_FILE, "configs/study.yaml")
    (tmp_path / "study.csv").write_text("design,ppl\nbase,30\n")
    (tmp_path / "study.md").write_text("| design | ppl |\n")
    (tmp_path / "curves.png").write_bytes(b"png")
    (tmp_path / "runs").mkdir()
    outputs = [tmp_path / name for name in ("study.csv", "study.md", "curves.png", "runs")]
    stamp_outputs(outputs, rule="study")
    stamp_outputs(outputs, rule="study")
    lines = (tmp_path / "study.md").read_text().splitlines()
    assert lines[0].startswith("*Made at commit ") and " by rule `study` for profile study@abcdef012345" in lines[0]
    assert lines[0].endswith(f"re-make: `snakemake {tmp_path / 'study.csv'} --configfile configs/study.yaml`.*")
    assert lines[1:] == ["", "| design | ppl |"]
    for sidecar in ("study.provenance.json", "curves.provenance.json"):
        record = json.loads((tmp_path / sidecar).read_text())
        assert record["profile"] == "study@abcdef012345" and record["git_commit"] and record["machine"]["cpu"]
        assert record["rule"] == "study" and set(record["machine"]["cpu_flags"]) <= set(CPU_FLAGS)
    assert sorted(path.name for path in tmp_path.iterdir()) == [
        "curves.png", "curves.provenance.json", "runs", "study.csv", "study.md", "study.provenance.json"]


def test_a_scripts_plain_line_gives_way_to_the_rules(tmp_path, monkeypatch):
    """A table a rule's script stamped itself (the recall screen's, `provenance_line`: commit and machine, no rule)
    carries the rule's line once the rule stamps it; its table below is untouched."""
    monkeypatch.setenv(PROFILE, "oracle_floor@abcdef012345")
    monkeypatch.setenv(PROFILE_FILE, "configs/oracle_floor.yaml")
    table = tmp_path / "recall_screen.md"
    table.write_text("*Made at commit 0123456789ab on a CPU, torch 2.13.0, 2026-12-01; re-make: `x`.*\n\nheader\n")
    stamp_outputs([table], rule="recall_screen")
    lines = table.read_text().splitlines()
    assert " by rule `recall_screen` for profile oracle_floor@abcdef012345" in lines[0]
    assert lines[1:] == ["", "header"]


def test_the_provenance_table_has_a_row_per_artifact_and_says_which_has_no_stamp(tmp_path, monkeypatch):
    monkeypatch.setenv(PROFILE, "tiny@0123456789ab")
    monkeypatch.setenv(PROFILE_FILE, "configs/tiny.yaml")
    tables, figures = tmp_path / "tables", tmp_path / "figures"
    tables.mkdir(), figures.mkdir()
    (tables / "perplexity.csv").write_text("method,ppl\npretrained,30\n")
    (figures / "loss.png").write_bytes(b"png")
    stamp_outputs([tables / "perplexity.csv"], rule="tables")
    write_provenance_table([tables / "perplexity.csv", figures / "loss.png"], tmp_path, tables / "provenance.csv")
    rows = pd.read_csv(tables / "provenance.csv", keep_default_na=False).to_dict("records")
    assert [(row["artifact"], row["rule"], row["profile"]) for row in rows] == [
        ("tables/perplexity.csv", "tables", "tiny@0123456789ab"), ("figures/loss.png", "not stamped", "")]
    assert rows[0]["re-make"] == f"snakemake {tables / 'perplexity.csv'} --configfile configs/tiny.yaml"
    assert rows[0]["commit"] and rows[0]["machine"] and rows[0]["date"]
    assert (tables / "provenance.md").read_text().startswith("| artifact ")


def test_artifact_names_keep_only_what_wandb_allows():
    assert artifact_name("smollm2/lora r2 lr1e-3") == "smollm2-lora-r2-lr1e-3"
