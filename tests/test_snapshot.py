"""The snapshot of a profile's results (`focus.pipeline.snapshot`): what README and docs cite is copied from rule
outputs with their provenance, whole or not at all."""

import json

import pytest

from focus.pipeline.snapshot import SnapshotError, snapshot_inputs, snapshot_results
from focus.pipeline.stamp import STAMP, profile_hash


def made(results, name: str, stamped: bool = True, sidecar: bool = True):
    """A table a rule made: its CSV, its Markdown (stamped or not) and its provenance sidecar."""
    tables = results / "tables"
    tables.mkdir(parents=True, exist_ok=True)
    (tables / f"{name}.csv").write_text("a,b\n1,2\n")
    (tables / f"{name}.md").write_text(f"{STAMP}abc for profile p on a CPU*\n\n| a |\n" if stamped else "| a |\n")
    if sidecar:
        (tables / f"{name}.provenance.json").write_text(json.dumps({"git_commit": "abc"}))
    return tables / f"{name}.csv"


def test_a_snapshot_holds_each_result_with_its_siblings_and_nothing_stale(tmp_path):
    results, folder = tmp_path / "results" / "p", tmp_path / "benchmarks" / "results" / "p"
    folder.mkdir(parents=True)
    (folder / "hand_made.md").write_text("| pasted |\n")
    figure = results / "figures" / "curve.png"
    figure.parent.mkdir(parents=True)
    figure.write_bytes(b"png")
    figure.with_suffix(".svg").write_text("<svg/>")
    figure.with_suffix(".provenance.json").write_text("{}")
    written = snapshot_results(results, [made(results, "perplexity"), figure], folder, tmp_path / "snapshot.json")
    names = sorted(str(path.relative_to(folder)) for path in folder.rglob("*") if path.is_file())
    assert names == ["figures/curve.png", "figures/curve.provenance.json", "figures/curve.svg", "tables/perplexity.csv",
                     "tables/perplexity.md", "tables/perplexity.provenance.json"]
    assert sorted(written) == sorted(folder / name for name in names)
    assert (folder / "tables" / "perplexity.md").read_text() == (results / "tables" / "perplexity.md").read_text()
    assert json.loads((tmp_path / "snapshot.json").read_text())["files"] == [str(path) for path in written]


@pytest.mark.parametrize("fault", ["no sidecar", "no provenance line", "unmade", "elsewhere"])
def test_a_result_without_its_provenance_is_refused_and_the_old_snapshot_stays_whole(tmp_path, fault):
    results, folder = tmp_path / "results" / "p", tmp_path / "snap"
    snapshot_results(results, [made(results, "old")], folder)
    before = {path: path.read_bytes() for path in folder.rglob("*") if path.is_file()}
    table = {"no sidecar": lambda: made(results, "new", sidecar=False),
             "no provenance line": lambda: made(results, "new", stamped=False),
             "unmade": lambda: results / "tables" / "missing.csv",
             "elsewhere": lambda: made(tmp_path / "other", "new")}[fault]()
    with pytest.raises(SnapshotError, match="provenance|not made|not under"):
        snapshot_results(results, [results / "tables" / "old.csv", table], folder)
    assert {path: path.read_bytes() for path in folder.rglob("*") if path.is_file()} == before
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted(["results", "snap"] + (
        ["other"] if fault == "elsewhere" else []))  # no staging folder left behind


def test_a_profile_may_leave_the_group_pages_out_of_its_snapshot_and_keeps_its_hash():
    """`snapshot.interpret: false` drops what rule interpret made (and only that) from the snapshot's inputs; the
    section is no setting of the results, so the profile's hash, which every sidecar names, stays the same."""
    made = ["results/s/tables/study.csv", "results/s/interpret/smollm2/base/group_layers.csv",
            "results/s/interpret/smollm2/base/group_examples.html", "results/s/figures/interpret_note.png"]
    assert snapshot_inputs(made, "results/s") == made
    assert snapshot_inputs(made, "results/s", interpret=False) == [made[0], made[3]]
    profile = {"name": "s", "variants": {"base": {}}}
    assert profile_hash({**profile, "snapshot": {"interpret": False}}) == profile_hash(profile)
    assert profile_hash({**profile, "variants": {"other": {}}}) != profile_hash(profile)
