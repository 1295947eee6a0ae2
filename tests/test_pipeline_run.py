"""The Snakemake pipeline run for real on a minimal profile (real SmolLM2 and a tiny Qwen2): its artifacts, its W&B
run file read back, the HTML report, --forcerun."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest
from helpers import wandb_file
from helpers.pipeline import MINI, job_counts, snakemake, write_config

from focus.pipeline.stamp import STAMP
from focus.report.claims import BEYOND_THE_PAPER, CLAIMS

pytestmark = [pytest.mark.e2e, pytest.mark.filterwarnings("ignore::DeprecationWarning")]


# ---- a real run of the minimal profile (the mini_run fixture, tests/conftest.py) -----------------------------


@pytest.mark.slow
def test_minimal_run_writes_sane_artifacts(mini_run):
    _, results = mini_run
    table = pd.read_csv(results / "tables" / "perplexity.csv")
    assert len(table) == 2 * 4 + 2  # models x methods, one domain; + the LoRA cell and the peer of tiny-qwen2
    ppl = table.set_index(["model", "method"])["perplexity"]
    assert 10 < ppl["smollm2", "pretrained"] < 60  # SmolLM2 on books text at context 128
    for method in ("full_finetune", "focus-soft", "focus-hard"):
        assert ppl["smollm2", "pretrained"] / 2 < ppl["smollm2", method] < ppl["smollm2", "pretrained"] * 2
    assert all(30_000 < ppl["tiny-qwen2", method] < 80_000 for method in table["method"].unique())  # random init

    training = pd.read_csv(results / "tables" / "training.csv").set_index(["model", "variant"])
    assert training.loc[("smollm2", "focus"), "trainable_parameters"] == 30 * 3 * 4 * 64  # layers x kv x G x D
    assert training.loc[("smollm2", "full_finetune"), "trainable_parameters"] > 100_000_000
    assert (training["tokens"] == 4 * 2 * 128).all() and not training["resumed"].any()
    assert all(math.isfinite(loss) for loss in training["train_loss"])
    assert "| model" in (results / "tables" / "perplexity.md").read_text()
    for figure in ("loss_curves", "perplexity"):
        assert (results / "figures" / f"{figure}.png").stat().st_size > 10_000
        assert (results / "figures" / f"{figure}.svg").read_text().lstrip().startswith("<?xml")

    summary = json.loads((results / "train" / "smollm2" / "focus" / "summary.json").read_text())
    assert summary["provenance"]["git_commit"] and summary["provenance"]["packages"]["torch"]
    assert summary["focus_config"]["window"] == 32
    assert not (results / "train" / "smollm2" / "focus" / "run").exists()  # checkpoint folder removed when done
    adapter = json.loads((results / "train" / "smollm2" / "focus" / "adapter" / "focus_config.json").read_text())
    assert adapter["base_model"] == "smollm2-135m-instruct"

    speed = pd.read_csv(results / "bench" / "attention.csv")
    assert len(speed) == 2 * 2 * 2 and (speed["speedup"] > 0).all() and (speed["theoretical"] > 1).all()
    assert sorted(set(speed["routing"])) == ["key", "query"]
    assert len(pd.read_csv(results / "bench" / "prefill.csv")) == 2  # key and query routing
    bench = (results / "bench" / "attention.md").read_text().splitlines()  # stamped: the profile, the command
    assert bench[0].startswith("*Made at commit ") and " for profile mini@" in bench[0] and bench[2].startswith(
        "Measured on: ")
    for table in ("perplexity", "training", "claims", "truthfulqa", "peers"):
        assert (results / "tables" / f"{table}.md").read_text().startswith("*Made at commit "), table
        record = json.loads((results / "tables" / f"{table}.provenance.json").read_text())
        assert record["profile"].startswith("mini@") and record["command"].startswith("snakemake results/mini/")
        assert record["command"].endswith(" --configfile config.yaml")  # as typed where it ran: no machine's path

    # The evaluation stages: one row per (method, task), a real PEFT adapter, every claim judged.
    truthfulqa = pd.read_csv(results / "tables" / "truthfulqa.csv")
    methods = ["pretrained", "focus-soft", "focus-hard", "lora_r2_lr1e-3"]
    assert sorted(truthfulqa["method"]) == sorted(methods * 2) and set(truthfulqa["task"]) == {"truthfulqa_mc1", "truthfulqa_mc2"}
    assert truthfulqa["chat_template"].all() and (truthfulqa["documents"] == 3).all()
    benchmarks = pd.read_csv(results / "tables" / "benchmarks.csv")
    assert sorted(benchmarks["method"]) == sorted(methods) and set(benchmarks["task"]) == {"arc_easy"}  # hellaswag offline
    record = json.loads((results / "harness" / "tiny-qwen2" / "pretrained.json").read_text())
    assert record["tasks"]["hellaswag"]["skipped"] == "not in the data mirror and the hub is offline"
    assert len((results / "harness" / "tiny-qwen2" / "focus-hard_samples" / "arc_easy.jsonl").read_text().splitlines()) == 3
    lengths = pd.read_csv(results / "tables" / "prompt_lengths.csv").set_index("task")
    assert lengths.loc["truthfulqa_mc1", "share_focus_differs"] == 1.0  # the 6-shot preamble is longer than 32 tokens
    assert json.loads((results / "train" / "tiny-qwen2" / "lora_r2_lr1e-3" / "adapter" / "adapter_config.json").read_text())["r"] == 2
    long_context = pd.read_csv(results / "tables" / "long_context.csv")
    assert set(long_context["measure"]) == {"perplexity", "needle_accuracy", "needle_key_logprob", "perplexity_change",
                                            "perplexity_change_low", "perplexity_change_high", "distant_kept"}
    change = long_context[long_context["measure"].str.startswith("perplexity_change")].pivot_table(
        index=["method", "context_length"], columns="measure", values="value")
    assert "pretrained" not in change.index.get_level_values("method")  # (the change is against it)
    assert ((change["perplexity_change_low"] <= change["perplexity_change"])
            & (change["perplexity_change"] <= change["perplexity_change_high"])).all()
    ruler = pd.read_csv(results / "tables" / "ruler.csv")  # niah_single_2 reads essays from the hub: skipped
    assert len(ruler) == 4 and set(ruler["task"]) == {"niah_single_1"} and set(ruler["documents"]) == {1}  # + the peer
    record = json.loads((results / "long_context" / "tiny-qwen2" / "focus-hard" / "ruler.json").read_text())
    assert record["tasks"]["niah_single_2"] == {"skipped": "not in the data mirror and the hub is offline"}
    claims = pd.read_csv(results / "tables" / "claims.csv")
    assert "RULER 1 tasks at 256 tokens" in claims.set_index("claim").loc["downstream benchmarks after retrofit", "setting"]
    assert len(claims) == len(CLAIMS) + len(BEYOND_THE_PAPER)
    assert set(claims["verdict"]) <= {"holds", "does not hold", "not testable in this profile"}
    # The training-free peer: built (never trained) with its selector, scored on the trained router's windows.
    peer = json.loads((results / "peers" / "tiny-qwen2" / "quest@0.5" / "adapter" / "focus_config.json").read_text())
    assert (peer["focus_config"]["selector"], peer["focus_config"]["budget"]) == ("quest", 0.5)
    peers = pd.read_csv(results / "tables" / "peers.csv")  # at the perplexity context and the long-context one
    assert list(zip(peers["context_length"], peers["design"])) == [(64, "focus-hard"), (64, "quest@0.5"),
                                                                   (128, "focus-hard"), (128, "quest@0.5")]
    assert (peers["domain"] == "books").all()
    peers = peers[peers["context_length"] == 128].set_index("design")
    assert 0 < peers.loc["focus-hard", "distant_kept"] < 1 and 0.5 <= peers.loc["quest@0.5", "distant_kept"] < 1
    assert math.isfinite(peers.loc["quest@0.5", "against_router"])
    router = claims.set_index("claim").loc["a learned router beats training-free selection at the same budget"]
    assert "quest@0.5" in router["ours"] + router["setting"]
    ruler = json.loads((results / "long_context" / "tiny-qwen2" / "quest@0.5" / "ruler.json").read_text())
    assert ruler["focus_config"]["selector"] == "quest"

    study = pd.read_csv(results / "tables" / "study.csv").set_index("design")
    assert list(study.index) == ["pretrained", "focus"]
    assert study.loc["pretrained", "books_validation"] == pytest.approx(
        json.loads((results / "perplexity" / "tiny-qwen2" / "pretrained" / "books.validation.json").read_text())["perplexity"])
    for column in ("books_validation_soft", "books_validation_hard", "books_test_hard", "ctx128_hard", "needle_hard",
                   "nmi_category", "nmi_position", "distant_recall", "distant_kept", "train_seconds"):
        assert math.isfinite(study.loc["focus", column]), column
    for split in ("validation", "test"):
        versus = study.loc["focus", [f"books_{split}_hard_vs_pretrained{b}" for b in ("_low", "", "_high")]]
        assert versus.iloc[1] == pytest.approx(
            study.loc["focus", f"books_{split}_hard"] / study.loc["pretrained", f"books_{split}"] - 1)
        assert versus.iloc[0] <= versus.iloc[1] <= versus.iloc[2]  # the paired interval over the windows
    reference = json.loads((results / "train" / "tiny-qwen2" / "focus" / "summary.json").read_text())["reference_eval"]
    assert set(reference) == {"pretrained", "init_soft", "init_hard"} and reference["pretrained"] > 1000  # random init
    assert (results / "figures" / "study_curves.png").stat().st_size > 10_000

    executed = json.loads((results / "notebooks" / "results.ipynb").read_text())
    outputs = [out for cell in executed["cells"] if cell["cell_type"] == "code" for out in cell["outputs"]]
    assert not [out for out in outputs if out["output_type"] == "error"] and len(outputs) >= 5
    groups = next(cell for cell in executed["cells"] if cell.get("id") == "groups")
    assert "### tiny-qwen2 / focus" in "".join(groups["outputs"][0]["data"]["text/markdown"])
    headings = "".join("".join(out.get("data", {}).get("text/markdown", "")) for out in outputs)
    assert "### wandb/" not in headings and "### notebooks/" not in headings  # (W&B's copies of the figures)


@pytest.mark.slow
def test_every_file_the_run_wrote_follows_the_group_shared_umask(mini_run):
    """Run under umask 002: a colleague in the group reads (and may replace) every token cache, adapter, table and
    figure. W&B's own folders (its offline runs, artifact staging copies and cache) keep the modes W&B gives them."""
    workdir, results = mini_run
    wandbs_own = ("offline-run-", ".data", ".cache")
    too_private = [f"{oct(path.stat().st_mode & 0o777)} {path.relative_to(workdir)}"
                   for path in [*results.rglob("*"), workdir / "report.html"]
                   if not path.is_symlink() and not any(part.startswith(wandbs_own) for part in path.parts)
                   and path.stat().st_mode & 0o777 != (0o775 if path.is_dir() else 0o664)]
    assert not too_private


@pytest.mark.slow
def test_wandb_run_file_holds_every_table_and_figure(mini_run):
    _, results = mini_run
    record = json.loads((results / "wandb" / "report.json").read_text())
    assert record["mode"] == "offline"
    run_file = Path(record["run_file"])
    assert run_file.is_relative_to(results / "wandb")
    # Every table (CSV), figure (PNG; its SVG twin is the same picture) and page (HTML) a rule wrote, walked on disk:
    # each is logged under the key the record names. Not walked: W&B's own files, logs, the executed notebook.
    written = {path.relative_to(results).as_posix() for suffix in ("csv", "png", "html")
               for path in results.rglob(f"*.{suffix}") if not {"wandb", "logs", "notebooks"} & set(path.parts)}
    logged = {**record["tables"], **record["figures"], **record["pages"]}
    assert sorted(logged.values()) == sorted(written)
    kinds = {"tables": "table-file", "figures": "image-file", "pages": "html-file"}
    assert wandb_file.logged_media(run_file) == {key: kinds[key.split("/")[0]] for key in logged}
    assert "pages/group_examples" in record["pages"] and "tables/group_top_tokens" in record["tables"]
    # The tables as an Artifact, downstream of every training job's weights.
    runs = 1 + 2 * 2 + 1  # report + 2 models x (Focus, full fine-tune) + 1 LoRA cell
    assert len(list((results / "wandb").glob("offline-run-*/run-*.wandb"))) == runs
    trained = [json.loads(path.read_text())["artifact"] for path in (results / "wandb" / "train").rglob("*.json")]
    assert sorted(artifact["type"] for artifact in trained) == ["focus-adapter"] * 2 + ["lora-adapter"] + ["model"] * 2
    (tables,) = [r.artifact for r in wandb_file.iter_records(run_file)
                 if r.WhichOneof("record_type") == "artifact" and r.artifact.type == "results"]
    assert sorted(json.loads(tables.metadata)["trained"], key=str) == sorted(trained, key=str)
    # Each table with its provenance (focus.pipeline.stamp), as a file of the artifact and in its metadata.
    files = {entry.path for entry in tables.manifest.contents}
    assert {f"{key}.csv" for key in record["tables"]} <= files
    assert all(path.endswith(".provenance.json") for path in files - {f"{key}.csv" for key in record["tables"]})
    provenance = json.loads(tables.metadata)["provenance"]
    assert provenance["tables/perplexity"]["profile"].startswith("mini@") and "tables/claims" in provenance
    # One run per training job, mirroring its metrics.jsonl step for step.
    train = json.loads((results / "wandb" / "train" / "smollm2" / "focus.json").read_text())
    assert wandb_file.run_config(train["run_file"])["model"] == "smollm2"
    metrics = [json.loads(line) for line in (results / "train" / "smollm2" / "focus" / "metrics.jsonl").open()]
    logged = wandb_file.history(train["run_file"])
    assert [row["_step"] for row in logged] == [row["step"] for row in metrics]
    assert [row.get("train/loss") for row in logged] == [row.get("train/loss") for row in metrics]


@pytest.mark.slow
def test_html_report_embeds_tables_and_figures(mini_run):
    workdir, _ = mini_run
    html = (workdir / "report.html").read_text()
    for name in ("perplexity.csv", "training.csv", "loss_curves.png", "perplexity.png", "speedup.png", "attention.csv",
                 "truthfulqa.csv", "truthfulqa.png", "claims.csv", "long_context.png", "provenance.csv"):
        assert name in html


@pytest.mark.slow
def test_forcerun_rebuilds_only_the_rule_and_its_dependants(mini_run):
    workdir, results = mini_run
    config = str(workdir / "config.yaml")
    planned = job_counts(snakemake(workdir, "--configfile", config, "-n", "--forcerun", "train_focus").stdout)
    assert planned == {"train_focus": 2, "perplexity": 2 * 2, "perplexity_validation": 2 * 2, "benchmarks": 2,
                       "long_context_perplexity": 2 * 2, "needle": 2, "ruler": 2, "interpret": 1, "evaluation_tables": 1,
                       "tables": 1, "study": 1, "peers_table": 1, "claims": 1, "figures": 1, "provenance": 1,
                       "wandb_report": 1, "notebook": 1, "all": 1}  # not tokenize, the baselines (full, LoRA, peer), or their evaluations

    files = [p for p in results.rglob("*") if p.is_file() and "wandb" not in p.parts]
    before = {p: p.stat().st_mtime_ns for p in files}
    snakemake(workdir, "--configfile", config, "--forcerun", "figures")
    changed = {p.relative_to(results).as_posix() for p in files if p.stat().st_mtime_ns != before[p]}
    assert changed == {"figures/loss_curves.png", "figures/loss_curves.svg", "figures/perplexity.png",
                       "figures/perplexity.svg", "notebooks/results.ipynb", "logs/figures.log", "logs/notebook.log",
                       "logs/wandb_report.log", "figures/loss_curves.provenance.json",
                       "figures/perplexity.provenance.json",  # (the figures' provenance: made again with them)
                       "tables/provenance.csv", "tables/provenance.md", "tables/provenance.provenance.json",
                       "logs/provenance.log"}


@pytest.mark.slow
def test_the_snapshot_copies_every_table_and_figure_with_its_provenance(mini_run):
    """`snakemake snapshot`: the run's tables and figures, byte for byte, each with its provenance, in the folder
    README and docs cite (benchmarks/results/<profile>/ under the working directory)."""
    workdir, results = mini_run
    snakemake(workdir, "snapshot", "--configfile", str(workdir / "config.yaml"))  # (--configfile takes several)
    folder = workdir / "benchmarks" / "results" / "mini"
    files = sorted(path for path in folder.rglob("*") if path.is_file())
    tables = [path for path in files if path.suffix == ".md"]
    assert len(tables) > 10 and all(path.read_text().startswith(STAMP) for path in tables)
    assert all(path.with_suffix(".provenance.json").is_file() for path in files if path.suffix in (".csv", ".png"))
    assert all(path.read_bytes() == (results / path.relative_to(folder)).read_bytes() for path in files)


def test_the_recall_screen_runs_as_a_rule_its_figures_where_the_rule_says(tmp_path):
    """Rule recall_screen for real on the tiny model (no profile had run it as a rule: its figures went beside its
    tables, and Snakemake threw its half hour of work away)."""
    config = json.loads(json.dumps(MINI))
    config["recall_screen"] = {"model": "tiny-qwen2", "domains": ["books"], "lengths": [128], "rows": 1,
                               "shares": [0.5], "routers": {"groups": "centroids", "quest": "quest"},
                               "ppl_routers": ["groups"], "ppl_rows": 2}  # (no budget: the groups at their pattern)
    path = write_config(tmp_path, config)
    snakemake(tmp_path, "results/mini/tables/recall_screen.csv", "--configfile", str(path))
    results = tmp_path / "results" / "mini"
    assert set(pd.read_csv(results / "tables" / "recall_screen.csv")["router"]) == {"groups", "quest"}
    scored = pd.read_csv(results / "tables" / "recall_screen_perplexity.csv")  # declared by the rule: kept
    assert list(zip(scored["router"], scored["budget_kind"])) == [("groups", "pattern"), ("oracle", "pattern")]
    for name in ("recall_screen.png", "recall_screen.svg", "recall_screen_layers.png", "recall_screen_layers.svg"):
        assert (results / "figures" / name).stat().st_size > 0, name


def test_a_microbenchmark_of_benchmarks_runs_as_a_rule_and_is_stamped(tmp_path):
    """`benchmarks/indexer_step.py` run by rule microbenchmark with the profile's arguments: its table where the rule
    says, with the script's own provenance line (the command that re-makes it) and the rule's sidecar; and
    `benchmarks/profile_focus.py` under an entry with its tag."""
    config = json.loads(json.dumps(MINI))
    config["microbenchmarks"] = {"indexer_step": {"args": "--lengths 512 --budgets 0.25 --repeats 2"},
                                 "profile_focus_short": {"args": "--lengths 256 --top-k 1"}}
    path = write_config(tmp_path, config)
    snakemake(tmp_path, "results/mini/bench/indexer_step.csv", "results/mini/bench/profile_focus_short.csv",
              "--configfile", str(path))
    bench = tmp_path / "results" / "mini" / "bench"
    # A script that takes --tag, run under the entry's name: its table is the entry's, stamped by the rule.
    parts = pd.read_csv(bench / "profile_focus_short.csv")
    assert set(parts["phase"]) == {"prefill", "step"} and set(parts["model"]) == {"focus", "unmodified"}
    assert (bench / "profile_focus_short.md").read_text().startswith(STAMP)
    rows = pd.read_csv(bench / "indexer_step.csv")
    assert list(rows["keys"]) == [512] and list(rows["budget"]) == [0.25] and (rows["native_speedup"] > 0).all()
    assert (bench / "indexer_step.md").read_text().startswith(STAMP)  # (the script's line, naming its command)
    record = json.loads((bench / "indexer_step.provenance.json").read_text())
    assert record["rule"] == "microbenchmark" and record["profile"].startswith("mini@")


def test_a_variant_with_adapter_of_scores_the_trained_adapter_changed_at_inference(tmp_path):
    """A variant that names `adapter_of` trains nothing: its perplexity, long-context and pass-key jobs load the trained
    variant's adapter and run it with their own top_k, which their records say."""
    config = json.loads(json.dumps(MINI))
    config["models"] = {"tiny-qwen2": {"source": "tiny:qwen2"}}
    config["variants"] = {"focus": {}, "focus_top2": {"adapter_of": "focus", "top_k": 2}}
    config["long_context"].pop("ruler")
    for section in ("lora", "harness", "interpret", "peers", "study", "benchmark"):
        config.pop(section)
    path = write_config(tmp_path, config)
    records = {method: f"results/mini/perplexity/tiny-qwen2/{method}/books.json" for method in ("focus-hard",
                                                                                                "focus_top2-hard")}
    long_context = "results/mini/long_context/tiny-qwen2/focus_top2-hard/books/ctx128.json"
    on_validation = long_context.replace(".json", ".validation.json")  # (rule long_context_perplexity_validation)
    needle = "results/mini/long_context/tiny-qwen2/focus_top2-hard/needle.json"
    snakemake(tmp_path, *records.values(), long_context, on_validation, needle, "--configfile", str(path))
    assert [folder.name for folder in (tmp_path / "results" / "mini" / "train" / "tiny-qwen2").iterdir()] == ["focus"]
    scored = {method: json.loads((tmp_path / file).read_text()) for method, file in records.items()}
    assert [scored[method]["focus_config"]["top_k"] for method in records] == [1, 2]
    assert scored["focus_top2-hard"]["distant_kept"] > scored["focus-hard"]["distant_kept"]  # (two groups keep more)
    for file in (long_context, on_validation, needle):
        assert json.loads((tmp_path / file).read_text())["focus_config"]["top_k"] == 2, file
    splits = [json.loads((tmp_path / file).read_text()) for file in (long_context, on_validation)]
    assert [record["split"] for record in splits] == ["test", "validation"]
    assert splits[0]["perplexity"] != splits[1]["perplexity"]
