"""Downstream benchmarks through lm-evaluation-harness, run on a live (Focus, LoRA or plain) model object.

The stock lm-eval task YAMLs are reused as they are; `write_mirror_tasks` writes one small YAML per task that
`include:`s the stock file by absolute path and overrides only where the data comes from (the offline mirror,
which follows the hub schema), so prompts, choices and metrics are lm-eval's own. HellaSwag is not mirrored:
its stock task runs only when the hub is reachable, and is recorded as skipped otherwise.

Prompt format (ours, PAPER.md open point 6): zero-shot everywhere. The knowledge benchmarks are scored as plain
completions; TruthfulQA (the alignment check on an instruction-tuned model) is scored with the model's chat
template applied, as `lm_eval --apply_chat_template` does for chat models: the stock 6-shot QA preamble and the
question become one user turn, the answer options are scored as the assistant's reply.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from focus.data import find_mirror, verify_mirror_file

_log = logging.getLogger(__name__)

MIRROR_SUFFIX = "_mirror"
# Task -> (stock YAML under lm_eval/tasks, mirror files by split, overrides). Splits the mirror lacks are turned
# off: a task collects few-shot docs from its training split when it is built, so a missing one fails even at 0-shot.
_MIRRORED = {
    "arc_easy": (
        "arc/arc_easy.yaml",
        {"train": "arc/arc_easy_train.jsonl", "validation": "arc/arc_easy_validation.jsonl", "test": "arc/arc_easy_test.jsonl"},
        {},
    ),
    "arc_challenge": (
        "arc/arc_challenge.yaml",
        {
            "train": "arc/arc_challenge_train.jsonl",
            "validation": "arc/arc_challenge_validation.jsonl",
            "test": "arc/arc_challenge_test.jsonl",
        },
        {},
    ),
    "piqa": ("piqa/piqa.yaml", {"validation": "piqa/piqa_validation.jsonl"}, {"training_split": None}),
    "winogrande": (
        "winogrande/default.yaml",
        {"validation": "winogrande/winogrande_xl_validation.jsonl"},
        {"training_split": None},
    ),
    "lambada_openai": ("lambada/lambada_openai.yaml", {"test": "lambada_openai/lambada_openai_test.jsonl"}, {}),
    "truthfulqa_mc1": (
        "truthfulqa/truthfulqa_mc1.yaml",
        {"validation": "truthfulqa/truthful_qa_multiple_choice_validation.jsonl"},
        {},
    ),
    "truthfulqa_mc2": (
        "truthfulqa/truthfulqa_mc2.yaml",
        {"validation": "truthfulqa/truthful_qa_multiple_choice_validation.jsonl"},
        {},
    ),
}
MIRRORED_TASKS = tuple(_MIRRORED)
"""The tasks that run offline, from the data mirror."""
HUB_ONLY = ("hellaswag",)
TASKS = (*_MIRRORED, *HUB_ONLY)
"""The tasks the pipeline's profiles choose from (their tables know each one's headline metric); the library and
`focus eval --tasks` take any task lm-eval knows, the others from the hub."""
CHAT_TASKS = ("truthfulqa_mc1", "truthfulqa_mc2")
# The headline metric of each task (lm-eval's names; acc_norm where the task defines it).
HEADLINE = {
    "arc_easy": "acc_norm",
    "arc_challenge": "acc_norm",
    "piqa": "acc_norm",
    "winogrande": "acc",
    "lambada_openai": "acc",
    "hellaswag": "acc_norm",
    "truthfulqa_mc1": "acc",
    "truthfulqa_mc2": "acc",
}


def hub_unavailable() -> str | None:
    """Why hub-only tasks cannot run here (offline by setting, or no answer from the hub), or None."""
    if any(os.environ.get(name, "").lower() in ("1", "true", "yes") for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")):
        return "not in the data mirror and the hub is offline"
    from huggingface_hub import constants
    from huggingface_hub.utils import get_session

    try:  # one quick request instead of datasets' five retries (about 40 s) on a machine without network
        get_session().head(constants.ENDPOINT, timeout=5)
    except Exception as err:  # noqa: BLE001 - any failure means the same: no hub
        return f"not in the data mirror and the hub is unreachable ({type(err).__name__})"
    return None


def mirror_task_files(tasks: list[str], mirror: str | Path | None = None) -> list[Path]:
    """The mirror files that `tasks` read (those present; hub-only tasks read none), for checking them early."""
    root = find_mirror(mirror)
    if root is None:
        return []
    files = {root / path for task in tasks if task in _MIRRORED for path in _MIRRORED[task][1].values()}
    return sorted(path for path in files if path.is_file())


def write_mirror_tasks(folder: str | Path, mirror: str | Path | None = None) -> dict[str, str]:
    """Write one lm-eval task YAML per mirrored task into `folder`; returns {stock task: local task name}.

    Raises:
        FileNotFoundError: no mirror was found, or it lacks a task's file.
    """
    import lm_eval.tasks

    root = find_mirror(mirror)
    if root is None:
        raise FileNotFoundError("no data mirror found (set $FOCUS_DATA_MIRROR or data.mirror); lm-eval tasks need one")
    stock = Path(lm_eval.tasks.__file__).parent
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    names = {}
    for task, (stock_yaml, files, overrides) in _MIRRORED.items():
        data_files = {split: str(root / path) for split, path in files.items()}
        for path in data_files.values():
            if not Path(path).is_file():
                raise FileNotFoundError(f"the data mirror {root} has no {path} (needed by lm-eval task {task})")
            verify_mirror_file(path)
        spec = {
            "include": str(stock / stock_yaml),
            "task": task + MIRROR_SUFFIX,
            "tag": None,  # tags are inherited: without this, `ai2_arc` would select the stock tasks too
            "dataset_path": "json",
            "dataset_name": None,  # the stock config names would be passed to the json builder and rejected
            "dataset_kwargs": {"data_files": data_files},
            **overrides,
        }
        (folder / f"{task}{MIRROR_SUFFIX}.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
        names[task] = task + MIRROR_SUFFIX
    return names


def run_tasks(
    model,
    tokenizer,
    tasks: list[str],
    task_folder: str | Path,
    limit: int | None,
    batch_size: int = 8,
    chat_template: bool = False,
    seed: int = 0,
) -> tuple[dict[str, dict], dict[str, list[dict]]]:
    """Evaluate `model` on `tasks` (stock names) through lm-eval; returns ({task: metrics}, {task: samples}).

    Mirrored tasks run from the YAMLs in `task_folder` (`write_mirror_tasks`); any other task lm-eval knows runs
    from the hub, or comes back as {"skipped": reason} when the hub is offline. Metrics are plain floats keyed by
    lm-eval's names without the filter suffix ("acc", "acc_stderr", ...). Samples are lm-eval's per-document logs.

    Raises:
        ValueError: a task lm-eval does not know (checked where the hub is reachable).
    """
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    metrics: dict[str, dict] = {}
    local = {task: task + MIRROR_SUFFIX for task in tasks if task in _MIRRORED}
    hub = [task for task in tasks if task not in _MIRRORED]
    reason = hub_unavailable() if hub else None
    if reason is not None:
        metrics.update({task: {"skipped": reason} for task in hub})
        hub = []
    manager = TaskManager(include_path=str(task_folder), include_defaults=bool(hub))
    unknown = sorted(set(hub) - set(manager.all_tasks))
    if unknown:
        raise ValueError(f"unknown lm-eval task(s) {', '.join(unknown)}: not among the tasks lm-eval knows "
                         "(lm_eval ls tasks lists them)")
    lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=batch_size, device=str(model.device))
    results = evaluate(lm, [*local.values(), *hub], manager, limit, seed, chat_template)
    samples = {}
    for task in [*local, *hub]:
        name = local.get(task, task)
        metrics[task] = _plain_metrics(results["results"][name])
        metrics[task]["documents"] = len(results["samples"][name])
        samples[task] = results["samples"][name]
    return metrics, samples


def evaluate(lm, tasks: list[str], manager, limit: int | None, seed: int, chat_template: bool = False) -> dict:
    """lm-eval's `simple_evaluate` as every task here runs: per-document logs kept, every RNG seeded with `seed`."""
    from lm_eval import simple_evaluate

    return simple_evaluate(
        model=lm,
        tasks=tasks,
        task_manager=manager,
        limit=limit,
        log_samples=True,
        apply_chat_template=chat_template,
        random_seed=seed,
        numpy_random_seed=seed,
        torch_random_seed=seed,
        fewshot_random_seed=seed,
        bootstrap_iters=1000,
    )


def _plain_metrics(result: dict[str, Any]) -> dict[str, float]:
    """lm-eval's "acc,none": np.float64 -> "acc": float (JSON-ready); the alias and filter names dropped."""
    plain = {}
    for key, value in result.items():
        metric, _, _filter = key.partition(",")
        if metric == "alias" or not isinstance(value, (int, float, np.floating, np.integer)):
            continue
        plain[metric] = float(value)
    return plain


def write_samples(folder: str | Path, samples: dict[str, list[dict]]) -> None:
    """lm-eval's per-document logs, one JSON-lines file per task (numpy values made plain)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for task, rows in samples.items():
        with open(folder / f"{task}.jsonl", "w") as f:
            for row in rows:
                f.write(json.dumps(row, default=_plain) + "\n")


def _plain(value: Any) -> Any:
    if isinstance(value, (np.floating, np.integer)):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    return str(value)
