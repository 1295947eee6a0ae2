# Profile loading and the helpers rules use: paths, targets, input functions, params.
import os
import re
import sys
from pathlib import Path

import yaml

from focus.config import ConfigError
from focus.pipeline.methods import FULL_FINETUNE, method_variant, parse_peer_name
from focus.eval.recall_report import screen_scores_perplexity
from focus.pipeline.microbenchmarks import microbenchmark_script
from focus.pipeline.profile import resolve_profile, training_rows, with_base
from focus.pipeline.slurm import wait_for_earlier_jobs
from focus.pipeline.snapshot import snapshot_inputs
from focus.pipeline.stamp import PROFILE, PROFILE_FILE, profile_hash


with open(workflow.source_path("../schemas/config.schema.yaml")) as schema_file:
    SCHEMA = yaml.safe_load(schema_file)
try:
    # `include:` names a base profile beside the profile's file or in configs/ (focus.pipeline.profile.with_base)
    _FOLDERS = [Path(path).parent for path in workflow.config_settings.configfiles] + [Path(workflow.basedir) / "configs"]
    P = resolve_profile(with_base(config, _FOLDERS), SCHEMA)
except ConfigError as err:
    # One line, before any job starts, instead of a traceback through Snakemake's parser.
    raise SystemExit(f"config error: {err}")

# A Snakemake killed and started again on a cluster first waits for the SLURM jobs its predecessor left queued or
# running here, instead of submitting each a second time (focus.pipeline.slurm). Not for commands that only look.
_LOOKING = ("--unlock", "--lint", "--report", "--list", "--summary", "--detailed-summary", "--dag", "--rulegraph",
            "--filegraph", "--cleanup-metadata", "--delete-all-output", "--delete-temp-output", "--touch")
_ONLY_LOOKING = any(argument.split("=")[0] in _LOOKING for argument in sys.argv)
if workflow.is_main_process and not workflow.output_settings.dryrun and not _ONLY_LOOKING:
    wait_for_earlier_jobs(os.getcwd(), report=lambda line: print(line, file=sys.stderr))

R = P["results"]
# Every table and figure names the profile and the file it came from (focus.pipeline.stamp): the jobs read these.
os.environ[PROFILE] = f"{P['name']}@{profile_hash(P)}"
# The file as one types it where snakemake runs (Snakemake makes it absolute: a re-make command would name this machine).
_PROFILE_PATH = Path(workflow.config_settings.configfiles[0] if workflow.config_settings.configfiles
                     else "configs/tiny.yaml")
os.environ[PROFILE_FILE] = (os.path.relpath(_PROFILE_PATH) if _PROFILE_PATH.is_relative_to(Path.cwd())
                            else str(_PROFILE_PATH))
# The software of every rule (scripts/install.sh builds the same environment as a venv). Its pip lines find the project
# through FOCUS_ROOT wherever --use-conda copies the file (see environment.yml).
ENVIRONMENT = "../../environment.yml"
os.environ.setdefault("FOCUS_ROOT", str(Path(workflow.basedir).absolute()))
MODELS = list(P["models"])
DOMAINS = list(P["data"]["domains"])
EVALUATED = P.get("evaluated", {})  # variants that score another's adapter with changes made at inference
VARIANTS = [variant for variant in P["variants"] if variant not in EVALUATED]  # the trained ones
SCORED_VARIANTS = list(P["variants"])  # the trained ones and those scored from their adapters
EVAL_DOMAINS = P["perplexity"]["domains"]
PPL_VALIDATION = P["perplexity"]["validation_domains"]  # also scored on their validation split
LORA = P.get("lora") or {"models": [], "grid": {}}
HARNESS = P.get("harness") or {"models": [], "methods": []}
LONG = P.get("long_context") or {"models": [], "methods": []}
PEERS = P.get("peers") or {"models": [], "methods": []}
WANDB = {"project": "focus", "entity": None, "mode": "offline", **P.get("wandb", {})}

# W&B: offline unless the user configured otherwise; its cache and settings stay inside the results folder.
os.environ.setdefault("WANDB_MODE", WANDB["mode"])
for variable, folder in (("WANDB_CACHE_DIR", "cache"), ("WANDB_CONFIG_DIR", "config"), ("WANDB_DATA_DIR", "data")):
    os.environ.setdefault(variable, os.path.abspath(f"{R}/wandb/.{folder}"))


def _alternatives(names):
    """A wildcard constraint matching exactly `names` (nothing at all when there are none)."""
    return "|".join(re.escape(name) for name in names) or "(?!)"


wildcard_constraints:
    model=_alternatives(MODELS),
    domain=_alternatives(DOMAINS),
    variant=_alternatives(SCORED_VARIANTS),
    method=_alternatives(sorted({method for spec in P["models"].values() for method in spec["methods"]})),
    lora=_alternatives(LORA["grid"]),
    peer=_alternatives(PEERS["methods"]),
    context=r"\d+",


# ---- paths ----------------------------------------------------------------------------------------------------


def tokens_file(model, domain):
    return f"{R}/data/{model}/{domain}.safetensors"


def train_folder(model, variant):
    return f"{R}/train/{model}/{variant}"


def peer_adapter(model, peer):
    """The adapter a training-free peer is evaluated from (built by the peer rule, never trained)."""
    return f"{R}/peers/{model}/{peer}/adapter"


def trained_variant(variant):
    """The variant whose adapter `variant` runs: itself, or an evaluated variant's `adapter_of`."""
    return EVALUATED[variant]["adapter_of"] if variant in EVALUATED else variant


def inference_changes(variant):
    """The settings an evaluated variant changes at inference over its adapter's ({} for a trained one)."""
    return EVALUATED[variant]["changes"] if variant in EVALUATED else {}


def trained_variants():
    return VARIANTS + ([FULL_FINETUNE] if FULL_FINETUNE in P["methods"] else [])


def train_summaries():
    return [f"{train_folder(m, v)}/summary.json" for m in MODELS for v in trained_variants()]


def train_metrics():
    return [f"{train_folder(m, v)}/metrics.jsonl" for m in MODELS for v in trained_variants()]


def scored_domains(model):
    """The corpora `model`'s perplexity is scored on: its own `domains`, else every one of perplexity.domains."""
    return P["models"][model].get("domains", EVAL_DOMAINS)


def perplexity_files():
    return [f"{R}/perplexity/{m}/{method}/{d}.json"
            for m in MODELS for method in P["models"][m]["methods"] for d in scored_domains(m)]


def validation_perplexity_files():
    return [
        f"{R}/perplexity/{m}/{method}/{d}.validation.json"
        for m in MODELS for method in P["models"][m]["methods"] for d in PPL_VALIDATION if d in scored_domains(m)
    ]


def training_runs():
    """The W&B record of every training job (`focus.pipeline.tracking.LiveTrainingRun`): Focus, full fine-tune,
    LoRA cells, from-scratch runs."""
    runs = [f"{R}/wandb/train/{m}/{v}.json" for m in MODELS for v in trained_variants()]
    runs += [f"{R}/wandb/train/{m}/{lora}.json" for m in LORA["models"] for lora in LORA["grid"]]
    return runs + [f"{R}/wandb/scratch/{method}/seed{seed}.json" for method in ("full", "focus")
                   for seed in SCRATCH.get("seeds", [])]


def lora_summaries():
    return [f"{train_folder(m, lora)}/summary.json" for m in LORA["models"] for lora in LORA["grid"]]


def harness_files():
    """Every (model, method) lm-eval record: pretrained, the Focus modes, and the LoRA cells of the models the grid
    trains (not the others')."""
    return [
        f"{R}/harness/{m}/{method}.json"
        for m in HARNESS["models"] for method in HARNESS["methods"]
        if method in P["models"][m]["methods"] or method not in LORA["grid"]
    ]


def harness_samples():
    return [f"{R}/harness/{m}/pretrained_samples" for m in HARNESS["models"]]


def long_context_methods(model):
    """The long-context stages' methods for one model: pretrained, the Focus modes, and its peers if it has them."""
    return [method for method in LONG["methods"] if method in P["models"][model]["methods"]]


LONG_DOMAINS = list(dict.fromkeys(LONG.get("domains") or [LONG["domain"]])) if LONG["models"] else []
LONG_SUFFIX = ".validation.json" if LONG.get("split") == "validation" else ".json"  # (rule *_validation's records)


def long_context_files(domains=None, lengths=None):
    """The long-context perplexity records of every model and method, on `domains` (default the section's) at
    `lengths` (default its context lengths), on the section's split."""
    return [
        f"{R}/long_context/{m}/{method}/{domain}/ctx{length}{LONG_SUFFIX}"
        for m in LONG["models"] for method in long_context_methods(m) for domain in (domains or LONG_DOMAINS)
        for length in (LONG["context_lengths"] if lengths is None else lengths)
    ]


def needle_files():
    """The pass-key records: every long-context method's, or those `needle.methods` names."""
    needle = LONG.get("needle")
    if not needle:
        return []
    return [f"{R}/long_context/{m}/{method}/needle.json" for m in LONG["models"] for method in long_context_methods(m)
            if method in needle.get("methods", [method])]


def ruler_files():
    """The RULER records: every long-context method's, or those `ruler.methods` names."""
    ruler = LONG.get("ruler")
    if not ruler:
        return []
    return [f"{R}/long_context/{m}/{method}/ruler.json" for m in LONG["models"] for method in long_context_methods(m)
            if method in ruler.get("methods", [method])]


TABLES = {name: f"{R}/tables/{name}.csv" for name in ("perplexity", "training")}
FIGURES = {name: f"{R}/figures/{name}.png" for name in ("loss_curves", "perplexity")}
if P.get("benchmark"):
    TABLES.update(speed_attention=f"{R}/bench/attention.csv", speed_prefill=f"{R}/bench/prefill.csv")
    FIGURES.update(speedup=f"{R}/figures/speedup.png")
    if P["benchmark"].get("decode"):
        TABLES.update(speed_decode=f"{R}/bench/decode_step.csv", speed_generate=f"{R}/bench/generate.csv")
        FIGURES.update(decode_speedup=f"{R}/figures/decode_speedup.png")
SCRATCH = P.get("scratch") or {}  # from-scratch comparison (workflow/rules/scratch.smk); resolved, every field set
if SCRATCH:
    TABLES.update(scratch=f"{R}/tables/scratch.csv")
    FIGURES.update(scratch=f"{R}/figures/scratch.png")


def scratch_runs(name):
    """`name` (summary.json or metrics.jsonl) of every from-scratch (method, seed) run."""
    seeds = SCRATCH.get("seeds", [])
    return [f"{R}/scratch/{method}/seed{seed}/{name}" for method in ("full", "focus") for seed in seeds]


def interpret_folder(model, variant):
    return f"{R}/interpret/{model}/{variant}"


def interpret_report(name, caption):
    """An output of rule interpret that the HTML report shows, under Interpretability / <model> <variant>."""
    return report(f"{interpret_folder('{model}', '{variant}')}/{name}", caption=f"../report/{caption}.rst",
                  category="Interpretability", subcategory="{model} {variant}")


PAGES = {}  # HTML a rule writes for reading (W&B shows it too)
INTERPRET = P.get("interpret")  # resolved: models, then focus.eval.config.InterpretConfig fields
for _model in (INTERPRET or {}).get("models", []):
    for _variant in SCORED_VARIANTS:
        _folder = interpret_folder(_model, _variant)
        for _table in ("group_layers", "group_shares", "group_categories", "group_top_tokens"):
            TABLES[f"interpret_{_table}_{_model}_{_variant}"] = f"{_folder}/{_table}.csv"
        PAGES[f"group_examples_{_model}_{_variant}"] = f"{_folder}/group_examples.html"
        for _figure in ("group_categories", "group_categories_overview", "group_balance", "group_alignment"):
            FIGURES[f"{_figure}_{_model}_{_variant}"] = f"{_folder}/{_figure}.png"


if LORA["models"]:
    TABLES.update(lora=f"{R}/tables/lora.csv")
if HARNESS["models"]:
    TABLES.update(benchmarks=f"{R}/tables/benchmarks.csv", prompt_lengths=f"{R}/tables/prompt_lengths.csv")
    FIGURES.update(benchmarks=f"{R}/figures/benchmarks.png", prompt_lengths=f"{R}/figures/prompt_lengths.png")
    if HARNESS["chat_tasks"]:
        TABLES.update(truthfulqa=f"{R}/tables/truthfulqa.csv")
        FIGURES.update(truthfulqa=f"{R}/figures/truthfulqa.png")
if LONG["models"]:
    TABLES.update(long_context=f"{R}/tables/long_context.csv")
    FIGURES.update(long_context=f"{R}/figures/long_context.png")
    if LONG.get("ruler"):
        TABLES.update(ruler=f"{R}/tables/ruler.csv")
        FIGURES.update(ruler=f"{R}/figures/ruler.png")
STUDY = P.get("study") or {}  # the design study (workflow/rules/study.smk)
if STUDY:
    TABLES.update(study=f"{R}/tables/study.csv")
    FIGURES.update(study_curves=f"{R}/figures/study_curves.png")
    # The trade-off figure: the study domain against another domain the profile scores on its test split.
    STUDY_OTHER = next((d for d in P["perplexity"]["domains"] if d != STUDY["domain"]), None)
    if STUDY_OTHER is not None and "test" in P["perplexity"]["splits"]:
        FIGURES.update(study_tradeoff=f"{R}/figures/study_tradeoff.png")
# The peers table: the trained routers (`peers.routers`, default the first variant; hard) against each training-free
# selector, on the perplexity domains and at the long-context lengths too.
PEER_ROUTERS = [f"{variant}-hard" for variant in PEERS.get("routers", VARIANTS[:1])]
PEER_OTHER = next((d for d in P["perplexity"]["domains"] if d != P["train"]["domain"]), None)


def peers_table_inputs():
    """The perplexity records the peers table pairs: pretrained, the routers and the peers on the perplexity domains,
    and on the long-context corpora at the lengths other than the perplexity context (where the long-context stages
    score them)."""
    methods = ["pretrained", *PEER_ROUTERS, *PEERS["methods"]]
    lengths = [n for n in LONG.get("context_lengths", []) if n != P["perplexity"]["context_length"]]
    return {
        "perplexity": [f"{R}/perplexity/{m}/{method}/{d}.json"
                       for m in PEERS["models"] for method in methods for d in EVAL_DOMAINS],
        "long_context": [f"{R}/long_context/{m}/{method}/{d}/ctx{n}{LONG_SUFFIX}"
                         for m in PEERS["models"] if m in LONG["models"] for method in methods
                         if method in long_context_methods(m) for d in LONG_DOMAINS for n in lengths],
    }


if PEERS["models"]:
    TABLES.update(peers=f"{R}/tables/peers.csv")
    if PEER_OTHER is not None and P["train"]["domain"] in P["perplexity"]["domains"]:
        FIGURES.update(peers_tradeoff=f"{R}/figures/peers_tradeoff.png")
RECALL = P.get("recall_screen") or {}  # the router recall screen (workflow/rules/recall.smk)
if RECALL:
    TABLES.update(recall_screen=f"{R}/tables/recall_screen.csv")
    if screen_scores_perplexity(RECALL["ppl_shares"], RECALL["ppl_keys"], RECALL["ppl_routers"]):
        TABLES.update(recall_screen_perplexity=f"{R}/tables/recall_screen_perplexity.csv")
    FIGURES.update(recall_screen=f"{R}/figures/recall_screen.png")
    # (per layer: registered, so that a snapshot and the provenance cover them as the notebook reads them)
    TABLES.update(recall_screen_layers=f"{R}/tables/recall_screen_layers.csv")
    FIGURES.update(recall_screen_layers=f"{R}/figures/recall_screen_layers.png")


def recall_settings(*keys):
    """The recall screen's settings named, those it gives (ppl_tokens has no default: a profile without it keeps its
    params, so its finished cells stay finished)."""
    return {key: RECALL[key] for key in keys if key in RECALL}


def recall_window():
    """The screen's window: the screened model's first variant's."""
    return next(iter(P["models"][RECALL["model"]]["variants"].values()))["window"]


def recall_routers():
    """The screen's routers as `focus.eval.router_screen.build_router` reads them: variant:NAME as its adapter."""
    return {name: f"adapter:{train_folder(RECALL['model'], spec.removeprefix('variant:'))}/adapter"
            if spec.startswith("variant:") else spec for name, spec in RECALL["routers"].items()}


MICRO = P.get("microbenchmarks") or {}  # kernel microbenchmarks of benchmarks/ (rule microbenchmark)
for _name in MICRO:
    TABLES[f"micro_{_name}"] = f"{R}/bench/{_name}.csv"


def microbenchmark_inputs(wildcards):
    """The trained adapter and the token file a microbenchmark times on, where its section names them (the profile's
    first model's)."""
    bench = MICRO[wildcards.name]
    return {**({"adapter": f"{train_folder(MODELS[0], bench['adapter'])}/adapter"} if bench.get("adapter") else {}),
            **({"tokens": tokens_file(MODELS[0], bench["tokens"])} if bench.get("tokens") else {})}


def microbenchmark_args(wildcards):
    tag = microbenchmark_script(wildcards.name)[1]
    return MICRO[wildcards.name].get("args", "") + (f" --tag {tag}" if tag else "")


def microbenchmark_path(wildcards):
    return f"{workflow.basedir}/benchmarks/{microbenchmark_script(wildcards.name)[0]}.py"


EVALUATION_TABLES = [name for name in ("benchmarks", "truthfulqa", "prompt_lengths", "lora", "long_context", "ruler")
                     if name in TABLES]
TABLES.update(claims=f"{R}/tables/claims.csv")
# Where every other table, figure and page came from, one row each (rule provenance; the report and W&B show it).
PROVENANCE_OF = [*TABLES.values(), *FIGURES.values(), *PAGES.values()]
TABLES.update(provenance=f"{R}/tables/provenance.csv")
# The model the claims are judged on: the one the evaluation stages cover (SmolLM2 in the tiny profiles).
MAIN_MODEL = (HARNESS["models"] or LONG["models"] or MODELS)[0]


def final_targets():
    return [*TABLES.values(), *FIGURES.values(), f"{R}/wandb/report.json", f"{R}/notebooks/results.ipynb"]


# ---- input functions and params (rules take these by name: no lambdas in rules) -------------------------------


def profile_results(wildcards, output):
    """The profile's results folder, from an output one folder below it (results/<profile>/notebooks/results.ipynb,
    results/<profile>/tables/provenance.csv -> results/<profile>)."""
    return str(Path(output[0]).parent.parent)


def train_tokens(wildcards):
    return tokens_file(wildcards.model, P["train"]["domain"])


def train_inputs(wildcards):
    """A training job's token files: the domain's (`tokens`) and the broad corpus's (`broad`) where it has one; a Focus
    variant's own (its `train` changes), a baseline's the profile's."""
    variant = getattr(wildcards, "variant", None)
    training = P["models"][wildcards.model]["training"].get(variant)
    if training is None:
        inputs = {"tokens": train_tokens(wildcards)}
        if P["train"].get("broad_share"):
            inputs["broad"] = tokens_file(wildcards.model, P["train"]["broad"])
        return inputs
    inputs = {"tokens": tokens_file(wildcards.model, training["domain"])}
    if training["rows"].get("broad_share"):
        inputs["broad"] = tokens_file(wildcards.model, training["broad"])
    return inputs


def trained_input(model, method):
    """{"trained": <the folder `method` loads on top of the model>} or {} for the pretrained model."""
    variant = method_variant(method)
    if variant is not None:
        return {"trained": f"{train_folder(model, trained_variant(variant[0]))}/adapter"}
    if method == FULL_FINETUNE:
        return {"trained": f"{train_folder(model, FULL_FINETUNE)}/model"}
    if method in LORA["grid"]:
        return {"trained": f"{train_folder(model, method)}/adapter"}
    if parse_peer_name(method) is not None:
        return {"trained": peer_adapter(model, method)}
    return {}


def perplexity_inputs(wildcards):
    return {"tokens": tokens_file(wildcards.model, wildcards.domain), **trained_input(wildcards.model, wildcards.method)}


def method_inputs(wildcards):
    return trained_input(wildcards.model, wildcards.method)


def method_focus_changes(wildcards):
    variant = method_variant(wildcards.method)
    return {} if variant is None else inference_changes(variant[0])


def variant_adapter(wildcards):
    return f"{train_folder(wildcards.model, trained_variant(wildcards.variant))}/adapter"


def variant_focus_changes(wildcards):
    return inference_changes(wildcards.variant)


def long_context_inputs(wildcards):
    """The corpus a long-context job reads (its `domain` wildcard; the pass-key's haystack: the section's `domain`)
    and the method's adapter."""
    domain = wildcards.get("domain", LONG["domain"])
    return {"tokens": tokens_file(wildcards.model, domain), **trained_input(wildcards.model, wildcards.method)}


def lora_training(wildcards):
    """The model's centroid TrainConfig with the grid cell's learning rate: the same rows, steps and batch."""
    return {**P["models"][wildcards.model]["centroids"], "lr": LORA["grid"][wildcards.lora]["lr"]}


def lora_cell(wildcards):
    return LORA["grid"][wildcards.lora]


def bench_decode_inputs(wildcards):
    """The trained adapter bench_decode's generate() times, where `benchmark.decode.variant` names it."""
    variant = BENCH["decode"].get("variant")
    return {"adapter": f"{train_folder(BENCH['model'], variant)}/adapter"} if variant else {}


def bench_model_source(wildcards):
    name = (P.get("benchmark") or {}).get("model")
    return None if name is None else P["models"][name]["source"]


def model_source(wildcards):
    return P["models"][wildcards.model]["source"]


def model_dtype(wildcards):
    return P["models"][wildcards.model]["dtype"]


def domain_splits(wildcards):
    return P["data"]["domains"][wildcards.domain]


def variant_focus(wildcards):
    return P["models"][wildcards.model]["variants"][wildcards.variant]


def peer_focus(wildcards):
    return P["models"][wildcards.model]["peers"][wildcards.peer]


def variant_rows(wildcards):
    """A Focus variant's row settings (the profile's `train` with the variant's changes: focus.pipeline.profile)."""
    return P["models"][wildcards.model]["training"][wildcards.variant]["rows"]


def retrieval_window(wildcards):
    """The window a baseline's retrieval rows are built for: its model's first Focus variant's, so that the baseline
    and that Focus run train on the same rows."""
    return next(iter(P["models"][wildcards.model]["variants"].values()))["window"]


def centroid_training(wildcards):
    return P["models"][wildcards.model]["training"][wildcards.variant]["centroids"]


def full_finetune_training(wildcards):
    return P["models"][wildcards.model]["full_finetune"]


def model_gpus(wildcards):
    """GPUs of the model's training jobs; the job runs one process per GPU (resources.gpu, so --set-resources wins).
    0: the profile asks for none (a CPU partition runs it)."""
    return P["models"][wildcards.model]["gpus"]


def model_eval_gpus(wildcards):
    """GPUs of the model's evaluation jobs: one process, the model's layers spread over them (focus.models.SPREAD)."""
    return P["models"][wildcards.model]["eval_gpus"]


def one_gpu_if_any(gpus):
    """A one-process job's GPU request: one where the profile asks for GPUs at all, else none."""
    return min(1, gpus)


def lora_gpus(wildcards):
    return one_gpu_if_any(P["models"][wildcards.model]["gpus"])


# Jobs that time themselves want the whole machine. Locally Snakemake lowers this to --cores; on a cluster, where
# nothing knows the machine a job lands on, the execution profile sets it (set-threads) with the CPUs it asks for.
# (Not workflow.cores: a cluster run has no --cores, and reading it stops every such run at parse time.)
MACHINE_THREADS = os.cpu_count() or 1


def evaluation_outputs():
    """Rule evaluation_tables' outputs: each table (CSV, in the report), its Markdown and figure where it has one."""
    outputs = {}
    for name in EVALUATION_TABLES:
        outputs[name] = report(TABLES[name], caption=f"../report/{name}_table.rst", category="Evaluation")
        outputs[f"{name}_md"] = TABLES[name].replace(".csv", ".md")
        if name in FIGURES:
            outputs[f"{name}_figure"] = report(FIGURES[name], caption=f"../report/{name}_figure.rst", category="Evaluation")
            outputs[f"{name}_figure_svg"] = FIGURES[name].replace(".png", ".svg")
    return outputs


def claims_extras():
    """JSON records the claims report reads besides the tables: the from-scratch and interpretability summaries."""
    extras = {}
    if P.get("scratch"):
        extras["scratch"] = f"{R}/scratch/summary.json"
    if MAIN_MODEL in (INTERPRET or {}).get("models", []):
        extras["interpret"] = f"{R}/interpret/{MAIN_MODEL}/{VARIANTS[0]}/summary.json"
    return extras


def claims_inputs(wildcards):
    """Every table of the profile but the claims and provenance tables (keys = table names), plus `claims_extras`."""
    return {**{name: path for name, path in TABLES.items() if name not in ("claims", "provenance")}, **claims_extras()}


def scratch_tokens(wildcards):
    return f"{R}/scratch/data/{SCRATCH['domain']}.safetensors"
