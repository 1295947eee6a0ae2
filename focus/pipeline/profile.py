"""Experiment profiles of the replication pipeline (configs/*.yaml): validation and resolution.

`resolve_profile` turns a profile as written into one where every model carries its complete FocusConfig per
variant and complete TrainConfigs, and checks everything that can be checked before a job starts: structure
and types (a JSON schema), every FocusConfig/TrainConfig field, model sources, and that every data split the
profile needs is in the mirror or reachable on the hub. Each failure is one `ConfigError` line naming the key.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from focus.config import ConfigError, FocusConfig, to_dict, yaml_number_hint
from focus.data import MirrorError, corpus_location, verify_mirror_file
from focus.eval.harness import mirror_task_files
from focus.pipeline.methods import (FULL_FINETUNE, MODES, PRETRAINED, evaluated_variants, lora_name, method_variant,
                                    parse_peer_name)
from focus.pipeline.microbenchmarks import check_microbenchmarks
from focus.pipeline.sections import interpret_dict, recall_screen_dict, section_models, study_dict
from focus.sources import PACKAGED_SMOLLM2, check_model_source, position_limit
from focus.train.config import ScratchModel, TrainConfig


def with_base(config: dict[str, Any], folders: Sequence[str | Path]) -> dict[str, Any]:
    """The profile with the one it names in `include:` underneath it (a YAML file, found in the first of `folders`
    that holds it; a base may include its own): mappings merge key by key, the profile's values win, anything else
    (lists, numbers) is the profile's. So screens share their models, data and evaluation in one base file."""
    if "include" not in config:
        return config
    name = config["include"]
    found = next((Path(folder) / name for folder in folders if (Path(folder) / name).is_file()), None)
    if found is None:
        raise ConfigError(f"include: {name!r} is in none of {[str(folder) for folder in folders]}")
    base = with_base(yaml.safe_load(found.read_text()) or {}, [found.parent, *folders])
    return _merged(base, {key: value for key, value in config.items() if key != "include"})


def _merged(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in top.items():
        merged[key] = _merged(base[key], value) if isinstance(value, dict) and isinstance(base.get(key), dict) else value
    return merged


def resolve_profile(config: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    """Validate a profile and return it resolved (a new plain dict; `config` is not changed).

    Resolved keys: everything in the profile, plus `results` ("results/<name>"), `methods` (what perplexity is
    measured for: "pretrained", "full_finetune" when the baseline is on, "<variant>-soft", "<variant>-hard"),
    and per model `dtype`, `variants` ({variant: FocusConfig dict}), `training` ({variant: what its training job
    takes: domain, broad, rows, centroids}; the trained variants only), `centroids` and `full_finetune` (TrainConfig
    dicts, the profile's;
    `full_finetune` None when off), `gpus` (GPUs a training job asks for, one process each; 0 asks
    none) and `eval_gpus` (GPUs an evaluation job asks for and spreads the model over), each defaulting to the
    profile's own `gpus` / `eval_gpus`, themselves 0 by default; `methods` per model (the profile's, its LoRA cells,
    its peers), `domains` where the profile narrows the perplexity domains it is scored on (absent: all of them) and,
    for the models `peers` covers, `peers` ({"<selector>@<budget>": FocusConfig dict}). Where variants name
    `adapter_of`, `evaluated` ({variant: {"adapter_of": a trained variant, "changes": its inference-time settings}}):
    they train nothing and are scored hard only (`<variant>-hard`).

    Raises:
        ConfigError: one line naming the key and what is wrong with it.
    """
    _check_schema(config, schema)
    profile = dict(config)
    profile["results"] = f"results/{config['name']}"
    variants = config.get("variants") or {"focus": {}}
    evaluated = evaluated_variants(variants)
    trained = {variant: changes for variant, changes in variants.items() if variant not in evaluated}
    train = config["train"]
    baseline = train.get("full_finetune")
    models = {}
    for name, spec in config["models"].items():
        where = f"models.{name}"
        _check_source(where, spec["source"])
        focus = {**config["focus"], **spec.get("focus", {})}
        centroids = {**train["centroids"], **spec.get("centroids", {})}
        resolved = {
            "source": spec["source"],
            "dtype": spec.get("dtype", config.get("dtype", "float32")),
            "variants": {
                variant: _focus_dict(f"{where} variant {variant}",
                                     {**focus, **{k: v for k, v in changes.items() if k != "train"}})
                for variant, changes in trained.items()
            },
            "training": {
                variant: _variant_training(f"{where} variant {variant}", train, changes.get("train", {}), centroids)
                for variant, changes in trained.items()
            },
            "centroids": _train_dict(f"{where}.centroids", centroids),
            "full_finetune": None,
            "gpus": spec.get("gpus", config.get("gpus", 0)),
            "eval_gpus": spec.get("eval_gpus", config.get("eval_gpus", 0)),
        }
        if "domains" in spec:  # only where set: the hash of every profile that does not narrow them stays as it was
            resolved["domains"] = spec["domains"]
            unscored = sorted(set(spec["domains"]) - set(config["perplexity"]["domains"]))
            if unscored:
                raise ConfigError(f"{where}.domains: {unscored} are not in perplexity.domains "
                                  f"{config['perplexity']['domains']}")
        if baseline is not None:
            # The same budget (steps, batch, schedule) as this model's centroids unless overridden.
            merged = {**resolved["centroids"], **baseline, **spec.get("full_finetune", {})}
            resolved["full_finetune"] = _train_dict(f"{where}.full_finetune", merged)
        for variant, reuse in evaluated.items():  # the adapter's own config, with the changes made at inference
            resolved["variants"][variant] = _focus_dict(
                f"{where} variant {variant}", {**resolved["variants"][reuse["adapter_of"]], **reuse["changes"]})
        resolved["variants"] = {variant: resolved["variants"][variant] for variant in variants}  # the profile's order
        _check_gpus(where, resolved)
        for variant, focus_dict in resolved["variants"].items():
            if variant in evaluated:
                continue  # (scored at any length: the window bound is the training rows')
            seq_len = resolved["training"][variant]["rows"]["seq_len"]
            if focus_dict["window"] >= seq_len:
                raise ConfigError(
                    f"{where} variant {variant}: focus.window ({focus_dict['window']}) must be < train.seq_len "
                    f"({seq_len}): a window over the whole row leaves no distant pair for the centroids"
                )
        models[name] = resolved
    profile["models"] = models
    profile["variants"] = variants
    profile["methods"] = [PRETRAINED] + ([FULL_FINETUNE] if baseline is not None else []) + [
        f"{variant}-{mode}" for variant in variants for mode in (("hard",) if variant in evaluated else MODES)
    ]
    if evaluated:  # (only where set: the hash of every profile without one stays as it was)
        profile["evaluated"] = evaluated
    _check_data(config)
    bench = config.get("benchmark")
    if bench and bench.get("model") is not None and bench["model"] not in models:
        raise ConfigError(f"benchmark.model: {bench['model']!r} is not one of this profile's models {sorted(models)}")
    decode = (bench or {}).get("decode") or {}
    if decode.get("variant") is not None:
        if decode["variant"] not in trained:
            raise ConfigError(f"benchmark.decode.variant: {decode['variant']!r} names no trained variant of this "
                              f"profile {sorted(trained)}")
        if bench.get("model") is None or decode.get("adapter") is not None:
            raise ConfigError("benchmark.decode.variant: times that variant's adapter in benchmark.model's generate(); "
                              "name the model, and no adapter beside it")
    for where, settings in (("settings", (bench or {}).get("settings", [])),
                            ("prefill_settings", (bench or {}).get("prefill_settings", [])),
                            ("decode.settings", decode.get("settings", [])),
                            ("decode.generate_settings", decode.get("generate_settings", []))):
        for groups, window, top_k in settings:
            _focus_dict(f"benchmark.{where}", {"num_groups": groups, "window": window, "top_k": top_k})
    if config.get("peers") is not None:
        profile["peers"] = _peers_dict(config["peers"], models, variants)
    profile.update(_evaluation_sections(config, models, profile["methods"], profile.get("peers")))
    if config.get("interpret") is not None:
        profile["interpret"] = interpret_dict(config["interpret"], models)
    if config.get("scratch") is not None:
        profile["scratch"] = _scratch_dict(config["scratch"], config["data"]["domains"])
    profile["perplexity"] = _perplexity_dict(config["perplexity"], config["data"]["domains"])
    _check_positions(profile)
    if config.get("study") is not None:
        profile["study"] = study_dict(config["study"], variants, models, profile["perplexity"])
    if config.get("recall_screen") is not None:
        profile["recall_screen"] = recall_screen_dict(config["recall_screen"], trained, models, config["data"])
    check_microbenchmarks(config.get("microbenchmarks") or {}, trained, config["data"])
    compared = {"study": [profile["study"]["model"]] if "study" in profile else [],
                "peers": profile.get("peers", {}).get("models", [])}
    for section, names in compared.items():  # their tables and figures set one corpus against another
        for name in names:
            if models[name].get("domains", profile["perplexity"]["domains"]) != profile["perplexity"]["domains"]:
                raise ConfigError(f"models.{name}.domains: {section} compares it on every perplexity domain; "
                                  "leave its domains out")
    return profile


def _check_positions(profile: dict[str, Any]) -> None:
    """Every length the profile asks of a model fits its position limit (where it is known without a download)."""
    everyone = list(profile["models"])
    asked = [("train.seq_len", profile["train"]["seq_len"], everyone),
             ("perplexity.context_length", profile["perplexity"]["context_length"], everyone)]
    long = profile.get("long_context")
    if long:
        asked += [("long_context.context_lengths", length, long["models"]) for length in long["context_lengths"]]
        for length in (long.get("needle") or {}).get("lengths", []):
            asked.append(("long_context.needle.lengths", length, long["models"]))
        for length in (long.get("ruler") or {}).get("lengths", []):
            asked.append(("long_context.ruler.lengths", length, long["models"]))
    limits: dict[str, int | None] = {}
    for key, length, names in asked:
        for name in names:
            if name not in limits:
                limits[name] = position_limit(profile["models"][name]["source"])
            if limits[name] is not None and length > limits[name]:
                raise ConfigError(
                    f"models.{name}: {key} {length} exceeds the model's {limits[name]} positions "
                    "(max_position_embeddings); shorten it or leave the model out of that section"
                )


def _perplexity_dict(section: dict[str, Any], domains: dict[str, list[str]]) -> dict[str, Any]:
    """The `perplexity` section with `splits` (default [test]) and `validation_domains`: the domains scored on their
    validation split too (those whose data lists one, when `splits` asks for validation)."""
    resolved = {"splits": ["test"], **section}
    wanted = "validation" in resolved["splits"]
    resolved["validation_domains"] = [d for d in section["domains"] if wanted and "validation" in domains.get(d, [])]
    return resolved


def _peers_dict(section: dict[str, Any], models: dict[str, Any], variants: dict[str, Any]) -> dict[str, Any]:
    """The `peers` section resolved: `models` (default all), `methods` (the selectors' names as written), `routers`
    where set (the variants, trained, that every peer is paired against; checked), and per covered model `peers`
    ({name: FocusConfig dict}): its first variant's config, hard, with that selector and budget (the same window,
    sinks and groups as the trained router it is compared with)."""
    chosen = section_models("peers", section, models)
    for name in chosen:
        first = next(iter(models[name]["variants"].values()))
        models[name]["peers"] = {}
        for peer in section["selectors"]:
            selector, budget = parse_peer_name(peer)
            where = f"peers.selectors {peer}"
            if selector == "centroids":
                raise ConfigError(f"{where}: 'centroids' is the trained router, not a training-free peer")
            models[name]["peers"][peer] = _focus_dict(where, {**first, "mode": "hard", "selector": selector,
                                                              "budget": budget})
    resolved = {"models": chosen, "methods": list(section["selectors"])}
    if "routers" in section:  # (only where set: the hash of every profile that does not name them stays as it was)
        unknown = [router for router in section["routers"] if router not in variants]
        if unknown:
            raise ConfigError(f"peers.routers: {unknown} name no variant of this profile {sorted(variants)}")
        resolved["routers"] = list(section["routers"])
    return resolved


def _evaluation_sections(config: dict[str, Any], models: dict[str, Any], methods: list[str],
                         peers: dict[str, Any] | None = None) -> dict[str, Any]:
    """The `lora`, `harness` and `long_context` sections resolved, each with its `models` checked and the methods
    it covers; adds each model's own `methods` (the profile's, plus the LoRA grid for the models it trains and the
    training-free peers for the models `peers` covers)."""
    resolved: dict[str, Any] = {}
    lora_methods: list[str] = []
    if config.get("lora") is not None:
        lora = {"alpha_ratio": 2.0, "dropout": 0.0, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"],
                **config["lora"]}
        lora["models"] = section_models("lora", lora, models)
        lora["grid"] = {
            lora_name(rank, lr): {"rank": rank, "lr": lr, "alpha": lora["alpha_ratio"] * rank}
            for rank in lora["ranks"] for lr in lora["lrs"]
        }
        lora_methods = list(lora["grid"])
        resolved["lora"] = lora
    peer_methods = peers["methods"] if peers else []
    for name, model in models.items():
        model["methods"] = methods + (lora_methods if name in resolved.get("lora", {}).get("models", []) else [])
        model["methods"] += peer_methods if name in (peers or {}).get("models", []) else []
    focus_methods = [method for method in methods if method_variant(method) is not None]
    if config.get("harness") is not None:
        harness = {"limit": None, "batch_size": 8, "chat_tasks": [], **config["harness"]}
        harness["models"] = section_models("harness", harness, models)
        harness["methods"] = [PRETRAINED, *focus_methods, *lora_methods]
        resolved["harness"] = harness
    if config.get("long_context") is not None:
        long_context = {"batch_size": 1, "max_tokens": None, "needle": None, "ruler": None, **config["long_context"]}
        long_context["models"] = section_models("long_context", long_context, models)
        modes = long_context.get("modes", MODES)  # (the key stays unset where a profile does not set it: its hash)
        scored = [method for method in focus_methods if method_variant(method)[1] in modes]
        long_context["methods"] = [PRETRAINED, *scored, *peer_methods]  # each model's own: see its methods
        for domain in dict.fromkeys([long_context["domain"], *long_context.get("domains", [])]):
            for split in dict.fromkeys(["test", long_context.get("split", "test")]):  # (test: the pass-key's text)
                if split not in config["data"]["domains"].get(domain, []):
                    raise ConfigError(f"data.domains.{domain}: long_context needs split {split!r}; list it there")
        for stage in ("needle", "ruler"):
            unscored = [method for method in (long_context[stage] or {}).get("methods", [])
                        if method not in long_context["methods"]]
            if unscored:
                raise ConfigError(f"long_context.{stage}.methods: {unscored} are not among the long-context methods "
                                  f"{long_context['methods']}")
        resolved["long_context"] = long_context
    return resolved


def _check_schema(config: dict[str, Any], schema: dict[str, Any]) -> None:
    import jsonschema  # deferred: only profile loading needs it

    validator = jsonschema.Draft202012Validator(schema)
    error = jsonschema.exceptions.best_match(validator.iter_errors(config))
    if error is not None:
        where = ".".join(str(part) for part in error.absolute_path) or "profile"
        raise ConfigError(f"{where}: {error.message}" + yaml_number_hint(error.instance))


def _focus_dict(where: str, values: dict[str, Any]) -> dict[str, Any]:
    try:
        return to_dict(FocusConfig.from_dict(values))
    except ConfigError as err:
        raise ConfigError(f"{where}: {err}") from None


TRAINING_ROWS = ("seq_len", "calibration_rows", "train_rows", "eval_rows", "retrieval_share", "retrieval_weight",
                 "broad_share")
"""A training section's row settings, as `focus.pipeline.jobs.TrainingJob` takes them (it holds the defaults)."""


def training_rows(section: dict[str, Any]) -> dict[str, Any]:
    """The row settings (`TRAINING_ROWS`) a training section sets."""
    return {key: section[key] for key in TRAINING_ROWS if key in section}


def _variant_training(where: str, train: dict[str, Any], overrides: dict[str, Any],
                      centroids: dict[str, Any]) -> dict[str, Any]:
    """What one variant's training job takes: the profile's `train` section with the variant's own `train` changes
    (its corpus and mixture, its row length, its TrainConfig under `centroids`): {"domain", "broad", "rows",
    "centroids"}."""
    section = {**train, **{key: value for key, value in overrides.items() if key != "centroids"}}
    return {"domain": section["domain"], "broad": section.get("broad"), "rows": training_rows(section),
            "centroids": _train_dict(f"{where} train.centroids", {**centroids, **overrides.get("centroids", {})})}


def _train_dict(where: str, values: dict[str, Any]) -> dict[str, Any]:
    try:
        return to_dict(TrainConfig.from_dict(values))
    except ConfigError as err:
        raise ConfigError(f"{where}: {err}") from None


def _check_gpus(where: str, model: dict[str, Any]) -> None:
    """Every process of a multi-GPU training job scores an equal share of each batch (see train_parameters)."""
    sections = {f"{where}.{name}": model[name] for name in ("centroids", "full_finetune")}
    sections.update({f"{where} variant {v} train.centroids": t["centroids"] for v, t in model["training"].items()})
    for key, train in sections.items():
        if train is not None and model["gpus"] and train["batch_size"] % model["gpus"]:
            raise ConfigError(
                f"{key}.batch_size ({train['batch_size']}) must be a multiple of {where}.gpus "
                f"({model['gpus']}): each GPU scores an equal share of every batch"
            )


def _check_source(where: str, source: str) -> None:
    try:
        check_model_source(source)
    except ConfigError as err:
        raise ConfigError(f"{where}.source: {err}") from None


def _check_data(config: dict[str, Any]) -> None:
    domains = config["data"]["domains"]
    mirror = config["data"].get("mirror")
    needed = set()
    for changes in (config.get("variants") or {"focus": {}}).values():  # each variant's training corpora
        train = {**config["train"], **changes.get("train", {})}
        needed.add((train["domain"], "train"))
        if train.get("broad"):
            needed.add((train["broad"], "train"))
        if train.get("eval_rows", 0) > 0:
            needed.add((train["domain"], "validation"))
    train = config["train"]
    needed |= {(domain, "test") for domain in config["perplexity"]["domains"]}
    study = config.get("study")
    if study is not None:
        needed.add((study["domain"], "validation"))
    if config.get("interpret") is not None:  # held-out text of the training domain
        needed.add((train["domain"], "test"))
    for domain, split in sorted(needed):
        if split not in domains.get(domain, []):
            raise ConfigError(f"data.domains.{domain}: the profile needs split {split!r}; list it there")
    for domain, splits in domains.items():
        for split in splits:
            try:
                corpus_location(domain, split, mirror)
            except (FileNotFoundError, MirrorError) as err:
                raise ConfigError(f"data.domains.{domain}: {err}") from None
    if config.get("harness") is not None:
        tasks = [*config["harness"]["tasks"], *config["harness"].get("chat_tasks", [])]
        try:
            for path in mirror_task_files(tasks, mirror):
                verify_mirror_file(path)
        except MirrorError as err:
            raise ConfigError(f"harness: {err}") from None


def _scratch_dict(section: dict[str, Any], domains: dict[str, list[str]]) -> dict[str, Any]:
    """The `scratch` section resolved: defaults filled in, the model shape, TrainConfig (without seed) and FocusConfig
    complete, the window shorter than the sequence, and the corpus splits the stage reads listed."""
    resolved = {"tokenizer": PACKAGED_SMOLLM2, "domain": "books", "calibration_rows": 4, "train_rows": None, **section}
    try:
        _check_source("scratch", resolved["tokenizer"])
    except ConfigError as err:  # _check_source names the key `<where>.source`
        raise ConfigError(str(err).replace("scratch.source:", "scratch.tokenizer:", 1)) from None
    try:
        resolved["model"] = to_dict(ScratchModel.from_dict(section["model"]))
    except ConfigError as err:
        raise ConfigError(f"scratch.model: {err}") from None
    if "seed" in section["train"]:
        raise ConfigError("scratch.train.seed: list the seeds in scratch.seeds (each sets weights and batch order)")
    train = _train_dict("scratch.train", section["train"])
    resolved["train"] = {key: value for key, value in train.items() if key != "seed"}
    # From scratch every weight trains, through the soft gate unless the profile says otherwise: the straight-through
    # estimator (the library's default) is for the centroids of a frozen model.
    resolved["focus"] = _focus_dict("scratch.focus", {"objective": "language_model", **section["focus"]})
    if resolved["focus"]["window"] >= resolved["seq_len"]:
        raise ConfigError(
            f"scratch.focus.window ({resolved['focus']['window']}) must be < scratch.seq_len ({resolved['seq_len']}): "
            "a window covering the sequence makes Focus full attention"
        )
    for split in ("train", "validation"):
        if split not in domains.get(resolved["domain"], []):
            domain = resolved["domain"]
            raise ConfigError(f"data.domains.{domain}: the scratch stage needs split {split!r}; list it there")
    return resolved
