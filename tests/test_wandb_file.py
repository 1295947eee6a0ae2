"""tests/helpers/wandb_file.py reads back what a real offline wandb run wrote."""

import pytest

wandb = pytest.importorskip("wandb")
matplotlib = pytest.importorskip("matplotlib")

from helpers.wandb_file import history, iter_records, logged_media, run_config, run_summary  # noqa: E402

LOSSES = [3.0, 2.5, 2.25]
LONG = "x" * 70_000  # a config value that spreads the run record over three 32 KiB blocks


@pytest.fixture(scope="module")
def run_file(tmp_path_factory):
    """The run-<id>.wandb of one offline run: config (with a value longer than two blocks), three loss rows,
    a table, an image and a summary value.

    Module scope: wandb.init is the slow part (~1 s), every test reads the same file.
    """
    import matplotlib.pyplot as plt

    matplotlib.use("Agg")
    root = tmp_path_factory.mktemp("wandb")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("WANDB_MODE", "offline")
        # Every folder wandb writes to, or it writes under the home folder.
        for name in ("WANDB_DIR", "WANDB_DATA_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR"):
            mp.setenv(name, str(root / name.lower()))
            (root / name.lower()).mkdir()
        run = wandb.init(project="t", config={"a": 1, "nested": {"b": 2}, "long": LONG})
        try:
            for loss in LOSSES:
                wandb.log({"train/loss": loss})
            wandb.log({"tables/ppl": wandb.Table(columns=["task", "ppl"], data=[["wiki", 12.5], ["c4", 20.0]])})
            fig, ax = plt.subplots()
            ax.plot(LOSSES)
            wandb.log({"figures/loss": wandb.Image(fig)})
            plt.close(fig)
            run.summary["final"] = 3.5
        finally:
            run.finish()
    (path,) = root.rglob("run-*.wandb")
    return path


def test_records_are_read(run_file):
    assert run_file.stat().st_size > 2 * 32 * 1024
    kinds = [r.WhichOneof("record_type") for r in iter_records(run_file)]
    assert kinds[0] == "header" and "run" in kinds and kinds.count("history") == len(LOSSES) + 2


def test_logged_media_finds_table_and_image(run_file):
    assert logged_media(run_file) == {"tables/ppl": "table-file", "figures/loss": "image-file"}


def test_history_has_the_scalars_in_order(run_file):
    rows = history(run_file)
    assert [row["train/loss"] for row in rows if "train/loss" in row] == LOSSES
    assert [row["_step"] for row in rows] == list(range(len(LOSSES) + 2))


def test_run_summary_has_last_values(run_file):
    summary = run_summary(run_file)
    assert summary["final"] == 3.5
    assert summary["train/loss"] == LOSSES[-1]
    assert summary["figures/loss/_type"] == "image-file"


def test_run_config(run_file):
    config = run_config(run_file)
    assert config["a"] == 1 and config["nested"] == {"b": 2} and config["long"] == LONG


def test_bad_header_raises(tmp_path, run_file):
    bad = tmp_path / "run-bad.wandb"
    bad.write_bytes(b"NOTW&B!" + run_file.read_bytes()[7:])
    with pytest.raises(ValueError, match="run-bad.wandb: not a W&B run file"):
        list(iter_records(bad))


def test_truncated_file_raises(tmp_path, run_file):
    cut = tmp_path / "run-cut.wandb"
    cut.write_bytes(run_file.read_bytes()[:-3])  # inside the last record's payload
    with pytest.raises(ValueError, match="run-cut.wandb: truncated record"):
        list(iter_records(cut))


def test_corrupt_payload_fails_the_checksum(tmp_path, run_file):
    data = bytearray(run_file.read_bytes())
    data[7 + 7] ^= 0xFF  # first byte of the first record's payload
    corrupt = tmp_path / "run-corrupt.wandb"
    corrupt.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="checksum mismatch"):
        list(iter_records(corrupt))
