# Profile loading and the helpers rules use: paths, targets, input functions, params.
import os
import re
from pathlib import Path

import yaml

from focus.config import ConfigError
from focus.profile import FULL_FINETUNE, method_variant, resolve_profile


with open(workflow.source_path("../schemas/config.schema.yaml")) as schema_file:
    SCHEMA = yaml.safe_load(schema_file)
try:
    P = resolve_profile(config, SCHEMA)
except ConfigError as err:
    # One line, before any job starts, instead of a traceback through Snakemake's parser.
    raise SystemExit(f"config error: {err}")

R = P["results"]
# Names the software of every rule (scripts/install.sh builds the same environment as a venv); --use-conda untested.
ENVIRONMENT = "../../environment.yml"
MODELS = list(P["models"])
DOMAINS = list(P["data"]["domains"])
VARIANTS = list(P["variants"])
EVAL_DOMAINS = P["perplexity"]["domains"]
WANDB = {"project": "focus", "entity": None, "mode": "offline", **P.get("wandb", {})}

# W&B: offline unless the user configured otherwise; its cache and settings stay inside the results folder.
os.environ.setdefault("WANDB_MODE", WANDB["mode"])
for variable, folder in (("WANDB_CACHE_DIR", "cache"), ("WANDB_CONFIG_DIR", "config"), ("WANDB_DATA_DIR", "data")):
    os.environ.setdefault(variable, os.path.abspath(f"{R}/wandb/.{folder}"))


def _alternatives(names):
    return "|".join(re.escape(name) for name in names)


wildcard_constraints:
    model=_alternatives(MODELS),
    domain=_alternatives(DOMAINS),
    variant=_alternatives(VARIANTS),
    method=_alternatives(P["methods"]),


# ---- paths ----------------------------------------------------------------------------------------------------


def tokens_file(model, domain):
    return f"{R}/data/{model}/{domain}.safetensors"


def train_folder(model, variant):
    return f"{R}/train/{model}/{variant}"


def trained_variants():
    return VARIANTS + ([FULL_FINETUNE] if FULL_FINETUNE in P["methods"] else [])


def train_summaries():
    return [f"{train_folder(m, v)}/summary.json" for m in MODELS for v in trained_variants()]


def train_metrics():
    return [f"{train_folder(m, v)}/metrics.jsonl" for m in MODELS for v in trained_variants()]


def perplexity_files():
    return [f"{R}/perplexity/{m}/{method}/{d}.json" for m in MODELS for method in P["methods"] for d in EVAL_DOMAINS]


TABLES = {name: f"{R}/tables/{name}.csv" for name in ("perplexity", "training")}
FIGURES = {name: f"{R}/figures/{name}.png" for name in ("loss_curves", "perplexity")}
if P.get("benchmark"):
    TABLES.update(speed_attention=f"{R}/bench/attention.csv", speed_prefill=f"{R}/bench/prefill.csv")
    FIGURES.update(speedup=f"{R}/figures/speedup.png")


def final_targets():
    return [*TABLES.values(), *FIGURES.values(), f"{R}/wandb/report.json", f"{R}/notebooks/results.ipynb"]


# ---- input functions and params (rules take these by name: no lambdas in rules) -------------------------------


def notebook_results(wildcards, output):
    return str(Path(output[0]).parent.parent)  # results/<profile>/notebooks/results.ipynb -> results/<profile>


def train_tokens(wildcards):
    return tokens_file(wildcards.model, P["train"]["domain"])


def perplexity_inputs(wildcards):
    inputs = {"tokens": tokens_file(wildcards.model, wildcards.domain)}
    variant = method_variant(wildcards.method)
    if variant is not None:
        inputs["trained"] = f"{train_folder(wildcards.model, variant[0])}/adapter"
    elif wildcards.method == FULL_FINETUNE:
        inputs["trained"] = f"{train_folder(wildcards.model, FULL_FINETUNE)}/model"
    return inputs


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


def centroid_training(wildcards):
    return P["models"][wildcards.model]["centroids"]


def full_finetune_training(wildcards):
    return P["models"][wildcards.model]["full_finetune"]
