"""The committed results (benchmarks/results/) that README and docs cite: each exists, and each table says where it came
from in its first line (`focus.provenance.provenance_line`: commit, machine, torch, date, the command that re-makes it),
except the tables made before tables named their commit, listed in LEGACY until a rule re-makes them (issue 55). The
list only shrinks: a listed table that gains its line, or stops being cited, fails until it leaves the list."""

import base64
import json
import re
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
STAMP = "*Made at commit "

LEGACY = {  # the table: the profile whose run re-makes what it cites
    "forgetting_screen_validation.md": "forgetting",
    "no_worse_lengths_validation.md": "no_worse_lengths",
    "no_worse_screen2_validation.md": "no_worse", "no_worse_screen3_validation.md": "no_worse",
    "no_worse_screen4_validation.md": "no_worse", "no_worse_top1_validation.md": "no_worse",
    "no_worse_validation.md": "no_worse", "ruler_screen_no_worse.md": "no_worse",
    "ruler_screen_peers.md": "peers", "ruler_screen_peers_4k.md": "peers", "ruler_screen_screen.md": "forgetting",
}
"""Cited tables without the provenance line, 54 of 66 at the start; eight speed tables left when the docs came to quote
the speed profile's snapshot (benchmarks/results/speed/), part 4's oracle test when configs/study.yaml took it on,
the oracle floor's when its profile re-made every row, the two routing screens' when theirs did
(configs/routing_designs.yaml and routing_shapes.yaml), FlexAttention's when the speed profile's microbenchmark
re-made it, part 5's and part 6's test reports when configs/forgetting_test.yaml and no_worse_test.yaml did, the peers'
pass-key when configs/peers_test.yaml did, its three perplexity tables (the lower budget, 2K on every text) when
that profile grew to them, part 6's per-length table when configs/no_worse_lengths_test.yaml re-made it, and the
design study's four part tables when one run of configs/study.yaml re-made every design. Their
text says the machine; `git log` the commit they came with."""


BRACES = re.compile(r"([\w\-/.]*)\{([\w,]+)\}([\w\-]*\.(?:md|csv|png|svg|json)\b)?")
"""A brace form, `STEM.{csv,md}` or `STEM_{fp32,bf16}.md`: what comes before the braces, the alternatives, the rest."""


def names_in(text: str, results: Path = RESULTS) -> set[str]:
    """The file names of `results` that `text` names: `benchmarks/results/NAME` and its brace forms
    (`benchmarks/results/STEM.{csv,md}`), whether or not the file is there; a bare `NAME.md` / `.csv` / `.png` / `.svg`
    or brace form (`generate_{fp32,bf16}.md`) that is there (a page that names a table by its name alone)."""
    names = set(re.findall(r"benchmarks/results/([\w\-/]+\.(?:md|csv|png|svg|json))\b", text))
    names |= {name for name in re.findall(r"[\w\-]+\.(?:md|csv|png|svg)\b", text) if (results / name).exists()}
    for head, alternatives, tail in BRACES.findall(text):
        _, in_results, stem = head.rpartition("benchmarks/results/")  # (in_results: the folder, or "" when bare)
        expanded = {f"{stem}{alternative}{tail}" for alternative in alternatives.split(",")}
        names |= expanded if in_results else {name for name in expanded if (results / name).exists()}
    return names


def cited_names() -> set[str]:
    """Every file name of benchmarks/results that README or a page of docs/ names (`names_in`)."""
    return {name for page in PAGES for name in names_in(page.read_text())}


def test_a_brace_form_is_cited_with_or_without_its_folder(tmp_path):
    """A brace form with the folder names its files even when they are gone; a bare one names those that are there."""
    for name in ("generate_fp32.md", "generate_bf16.md", "table.md"):
        (tmp_path / name).write_text("")
    text = "`benchmarks/results/gone.{csv,md}`, `generate_{fp32,bf16,int8}.md`, `table.{csv,md}`, `x_{m + D/2}`"
    assert names_in(text, tmp_path) == {"gone.csv", "gone.md", "generate_fp32.md", "generate_bf16.md", "table.md"}


def test_every_cited_result_is_committed():
    missing = sorted(name for name in cited_names() if not (RESULTS / name).exists())
    assert not missing, f"cited in README/docs but not in benchmarks/results: {missing}"


SIDECAR = re.compile(r"(\.provenance)?\.(?:md|csv|png|svg|json)$")


def orphans(results: Path, cited: set[str]) -> list[str]:
    """The files of `results` (its profiles' snapshot folders aside) that nothing cites: neither named by a page nor
    the sidecar of one that is (the same stem, or the stem and a suffix: `T.csv`, `T.provenance.json`,
    `T_layers.png` beside a cited `T.md`)."""
    stems = {SIDECAR.sub("", name) for name in cited}
    return sorted(path.name for path in results.iterdir() if path.is_file() and path.name not in cited
                  and SIDECAR.sub("", path.name) not in stems
                  and not any(path.name.startswith(f"{stem}_") for stem in stems))


def test_every_committed_result_is_cited():
    """A result README and docs do not cite is not left standing (issue 55: 29 of 91 were cited nowhere, two tables
    assembled by hand): it is cited, re-made by a rule into a profile's snapshot, or removed."""
    assert not orphans(RESULTS, cited_names()), "committed in benchmarks/results but cited nowhere: cite or remove"


def test_the_orphan_check_keeps_sidecars_and_sees_an_uncited_table(tmp_path):
    for name in ("cited.md", "cited.csv", "cited.provenance.json", "cited_layers.png", "stale.md", "stale.csv"):
        (tmp_path / name).write_text("")
    (tmp_path / "snapshot").mkdir()
    assert orphans(tmp_path, {"cited.md"}) == ["stale.csv", "stale.md"]


def test_every_cited_table_says_where_it_came_from():
    tables = {name for name in cited_names() if name.endswith(".md") and (RESULTS / name).exists()}
    unstamped = {name for name in tables if not (RESULTS / name).read_text().startswith(STAMP)}
    assert not sorted(unstamped - set(LEGACY)), "cited tables without a provenance line (provenance_line)"
    assert not sorted(set(LEGACY) - unstamped), "LEGACY tables now stamped or no longer cited: take them off the list"


def test_each_legacy_table_names_a_profile_that_exists():
    """What is left of issue 55 is compute, not design: each LEGACY table names the profile whose run re-makes it."""
    assert all((ROOT / "configs" / f"{profile}.yaml").is_file() for profile in LEGACY.values())


def snapshot_faults(folder: Path) -> list[str]:
    """What makes `folder` no snapshot of rule outputs: a Markdown table without its provenance line, a table or
    figure without its provenance sidecar."""
    files = [path for path in folder.rglob("*") if path.is_file()]
    return [f"{path}: no provenance line" for path in files if path.suffix == ".md"
            and not path.read_text().startswith(STAMP)] + [
           f"{path}: no sidecar" for path in files if path.suffix in (".csv", ".png", ".html")
           and not path.with_suffix(".provenance.json").is_file()]


def test_every_snapshot_is_whole():
    """A profile's snapshot (`snakemake snapshot`, benchmarks/results/<profile>/) holds rule outputs only."""
    faults = [fault for folder in RESULTS.iterdir() if folder.is_dir() for fault in snapshot_faults(folder)]
    assert not faults, faults


def test_the_snapshot_check_sees_a_pasted_table_and_a_bare_figure(tmp_path):
    """The check above is not vacuous: a hand-pasted table and a figure without its sidecar are both reported, a
    stamped table with its sidecar is not."""
    (tmp_path / "tables").mkdir()
    (tmp_path / "tables" / "made.md").write_text(f"{STAMP}abc*\n\n| a |\n")
    (tmp_path / "tables" / "made.csv").write_text("a\n")
    (tmp_path / "tables" / "made.provenance.json").write_text("{}")
    (tmp_path / "tables" / "pasted.md").write_text("| a |\n")
    (tmp_path / "curve.png").write_bytes(b"png")
    assert sorted(snapshot_faults(tmp_path)) == [f"{tmp_path / 'curve.png'}: no sidecar",
                                                 f"{tmp_path / 'tables' / 'pasted.md'}: no provenance line"]


SNAPSHOT = RESULTS / "tiny-eval"
"""The committed snapshot docs/evaluation.md quotes and the notebook is tried on (`snakemake snapshot --configfile
configs/tiny-eval.yaml`)."""


def unquoted(section: str, tables: list[Path], percent: bool = False) -> tuple[list[str], list[str]]:
    """(every decimal in the Markdown table rows of `section`, past their first column; those that are no value of
    `tables` at the precision shown, or with `percent` no value x 100 either, sign included)."""
    rows = [line.strip() for line in section.splitlines() if line.strip().startswith("| ") and "---" not in line]
    decimal = re.compile(r"[-+]?(?<![\d,.])\d+\.\d+(?!\d|,\d)")  # (not a piece of 16,384)
    quoted = [number for row in rows for number in decimal.findall(row.split("|", 2)[2])]
    frames = [pd.read_csv(table).select_dtypes("number") for table in tables]
    values = [float(value) for frame in frames for column in frame.columns for value in frame[column].dropna()]
    values += [100 * value for value in values] if percent else []
    return quoted, [number for number in quoted
                    if not any(round(value, len(number.split(".")[1])) == float(number) for value in values)]


def test_the_evaluation_page_quotes_its_snapshot():
    """Every decimal in docs/evaluation.md's measured tables (between the sentence that names the snapshot and the
    comparison with the earlier run) is a value of one of the snapshot's tables at the precision shown: a number
    pasted from another run, or left standing when the snapshot changed, fails."""
    text = (ROOT / "docs" / "evaluation.md").read_text()
    section = text[text.index("Every number below is in"):text.index("**Re-made from nothing")]
    quoted, missing = unquoted(section, sorted((SNAPSHOT / "tables").glob("*.csv")))
    assert len(quoted) > 60 and not missing, missing


def test_the_forgetting_report_quotes_its_snapshot():
    """docs/study.md's part-5 test table (configs/forgetting_test.yaml): each perplexity, change, bound and share is a
    value of the snapshot's study table (changes and shares in percent)."""
    text = (ROOT / "docs" / "study.md").read_text()
    start = text.index("| test | kept |", text.index("profile `configs/forgetting_test.yaml`"))
    quoted, missing = unquoted(text[start:text.index("\n\n", start)],
                               [RESULTS / "forgetting_test" / "tables" / "study.csv"], percent=True)
    assert len(quoted) == 9 and not missing, missing


def test_the_design_study_quotes_its_snapshot():
    """docs/study.md's answer table and parts 1-4 (configs/study.yaml): each perplexity, change, bound, share kept and
    NMI is a value of the snapshot's study table or its oracle test (changes and shares in percent); the answer
    table's part-5 row, of configs/forgetting_test.yaml's."""
    text = (ROOT / "docs" / "study.md").read_text()
    tables = [RESULTS / "study" / "tables" / name for name in ("study.csv", "recall_screen_perplexity.csv")]
    quoted, missing = unquoted(text[:text.index("**Part 5")], [*tables, RESULTS / "forgetting_test" / "tables" /
                                                                "study.csv"], percent=True)
    assert len(quoted) == 234 and not missing, missing  # (the answer table, parts 1-4's tables)


def test_the_peers_page_quotes_its_snapshot():
    """docs/peers.md's tables made by configs/peers_test.yaml: each share kept, change, bound and pass-key log-prob is
    a value of the snapshot's peers or long-context table (changes and shares in percent)."""
    text = (ROOT / "docs" / "peers.md").read_text()
    section = text[text.index("**Made by the profile**"):text.index("**Retrieval.**")]
    tables = [RESULTS / "peers_test" / "tables" / name for name in ("peers.csv", "long_context.csv")]
    quoted, missing = unquoted(section, tables, percent=True)
    assert len(quoted) > 200 and not missing, missing


def test_the_per_length_table_quotes_its_snapshot():
    """docs/study.md part 6's per-length table: each change, bound and share kept is a value of the long-context table
    of configs/no_worse_lengths_test.yaml's snapshot, each speed one of the speed profile's generate() table."""
    text = (ROOT / "docs" / "study.md").read_text()
    start = text.index("| context (windows) |", text.index("**Length decides where Focus acts**"))
    tables = [RESULTS / "no_worse_lengths_test" / "tables" / "long_context.csv",
              RESULTS / "speed" / "bench" / "generate.csv"]
    quoted, missing = unquoted(text[start:text.index("\n\n", start)], tables, percent=True)
    assert len(quoted) == 5 * 16 - 2 and not missing, missing  # (no speed timed at 512)


SNAPSHOTS = sorted(folder.name for folder in RESULTS.iterdir() if folder.is_dir())


@pytest.mark.parametrize("profile", SNAPSHOTS)
def test_the_notebook_runs_top_to_bottom_on_each_committed_snapshot(profile, tmp_path):
    """notebooks/results.ipynb reads a snapshot as it reads results/<profile>/: every table of the profile shown, every
    figure drawn, its provenance listed (3 s a snapshot here)."""
    import papermill  # (the notebook extra: installed with the tests)

    snapshot, executed = RESULTS / profile, tmp_path / "results.ipynb"
    papermill.execute_notebook(str(ROOT / "notebooks" / "results.ipynb"), str(executed), cwd=str(ROOT),
                               parameters={"results_dir": str(snapshot.relative_to(ROOT))}, kernel_name="python3",
                               progress_bar=False)
    outputs = [output for cell in json.loads(executed.read_text())["cells"] for output in cell.get("outputs", [])]
    shown = "".join(text if isinstance(text, str) else "".join(text)
                    for output in outputs for text in [*output.get("data", {}).values(), output.get("text", "")])
    drawn = {output["data"]["image/png"].strip() for output in outputs if "image/png" in output.get("data", {})}
    tables, figures = sorted(snapshot.rglob("*.md")), sorted(snapshot.rglob("*.png"))
    unshown = [str(table.relative_to(snapshot)) for table in tables if table.read_text().strip().splitlines()[-1]
               not in shown]
    undrawn = [str(figure.relative_to(snapshot)) for figure in figures
               if base64.b64encode(figure.read_bytes()).decode() not in drawn]
    assert len(tables) >= 4 and len(figures) >= 3 and not unshown and not undrawn, (unshown, undrawn)
    assert "git_commit" in shown and "no claims table" not in shown


def test_the_routers_page_quotes_its_snapshot():
    """docs/routers.md's validation tables and its kernels' (configs/routers.yaml): each share of the mass kept, change
    and bound is a value of the snapshot's recall screen or its perplexity table (in percent), each time and ratio one
    of its microbenchmarks' tables."""
    text = (ROOT / "docs" / "routers.md").read_text()
    snapshot = RESULTS / "routers"
    screen = [snapshot / "tables" / name for name in ("recall_screen.csv", "recall_screen_perplexity.csv")]
    quoted, missing = unquoted(text[text.index("### What the routers keep (validation)"):
                                    text.index("### On the test splits, once")], screen, percent=True)
    assert len(quoted) == 250 and not missing, missing
    start = text.index("| keys | kept per query |")
    quoted, missing = unquoted(text[start:text.index("\n\n", text.index("| prompt, keys per query |"))],
                               sorted((snapshot / "bench").glob("*.csv")))
    assert len(quoted) == 33 and not missing, missing
