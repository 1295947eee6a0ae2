"""RULER's long-context tasks (lm-evaluation-harness's `ruler` group) on a live model, one prompt length at a time.

RULER (Hsieh et al., 2024) builds each prompt to a target length in the model's own tokens: needles in a haystack,
variable tracking, word counting. lm-eval generates the documents when a task is built, sized with the tokenizer
named in the task metadata, so the tasks here are lm-eval's stock YAMLs, prompts and string-match scores unchanged.

Six tasks synthesise their haystack and run offline (`OFFLINE_TASKS`); the others read Paul Graham's essays or
SQuAD/HotpotQA from the hub (`HUB_TASKS`) and are recorded as skipped when it is unreachable, as HellaSwag is in
`focus.eval.harness`. Each length gets its own task build: lm-eval's `limit` takes a task's first documents, and with
several lengths in one build those would all be of the shortest.

Prompts are plain completions ending in lm-eval's answer prefix ("Answer: The special magic numbers for ... are"),
as lm-eval runs RULER by default; greedy decoding.
"""

from __future__ import annotations

import logging
import math
import statistics
from pathlib import Path

from focus.eval.harness import evaluate, hub_unavailable

_log = logging.getLogger(__name__)

OFFLINE_TASKS = ("niah_single_1", "niah_multikey_2", "niah_multikey_3", "ruler_vt", "ruler_cwe", "ruler_fwe")
HUB_TASKS = (
    "niah_single_2", "niah_single_3", "niah_multikey_1", "niah_multiquery", "niah_multivalue",
    "ruler_qa_squad", "ruler_qa_hotpot",
)
TASKS = (*OFFLINE_TASKS, *HUB_TASKS)


def run_ruler(
    model,
    tokenizer,
    tasks: list[str],
    lengths: list[int],
    limit: int | None,
    seed: int = 0,
) -> tuple[dict[str, dict], dict[str, list[dict]]]:
    """Score `model` on RULER `tasks` at each prompt length; returns ({task: scores}, {task: samples}).

    A task's scores are {str(length): {"score", "stderr", "documents"}} (score: lm-eval's string match, the share
    of the expected answers found in the greedy continuation, in [0, 1]), or {"skipped": reason} for a hub task
    when the hub is unreachable. Samples are lm-eval's per-document logs, every length's in one list.

    Raises:
        ValueError: an unknown task, or a tokenizer without the name or folder lm-eval needs to size prompts.
    """
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    unknown = sorted(set(tasks) - set(TASKS))
    if unknown:
        raise ValueError(f"unknown RULER task(s) {unknown}; known: {', '.join(TASKS)}")
    source = getattr(tokenizer, "name_or_path", None)
    if not source:  # lm-eval loads its own copy by name to size the prompts; an in-memory tokenizer has none
        raise ValueError("RULER needs a tokenizer loaded from a folder or hub id (tokenizer.name_or_path is empty)")
    scores: dict[str, dict] = {}
    runnable = [task for task in tasks if task in OFFLINE_TASKS]
    hub = [task for task in tasks if task in HUB_TASKS]
    reason = hub_unavailable() if hub else None
    if reason is None:
        runnable += hub
    else:
        scores.update({task: {"skipped": reason} for task in hub})
        _log.info("RULER tasks %s skipped: %s", ", ".join(hub), reason)
    samples: dict[str, list[dict]] = {task: [] for task in runnable}
    lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=1, device=str(model.device))
    for length in lengths:
        # Only RULER's own folder is indexed: indexing every lm-eval task took 29 s here, and this runs per length.
        manager = TaskManager(include_path=_ruler_folder(), include_defaults=False,
                              metadata={"tokenizer": source, "max_seq_lengths": [length]})
        results = evaluate(lm, runnable, manager, limit, seed)
        for task in runnable:
            result = results["results"][task]
            stderr = result.get(f"{length}_stderr,none")
            if stderr is None or stderr == "N/A" or math.isnan(float(stderr)):
                stderr = documents_stderr(results["samples"][task], length)
            scores.setdefault(task, {})[str(length)] = {
                "score": float(result[f"{length},none"]),
                "stderr": None if stderr is None else float(stderr),
                "documents": len(results["samples"][task]),
            }
            samples[task].extend(results["samples"][task])
    return scores, samples


def documents_stderr(samples: list[dict], length: int) -> float | None:
    """The standard error of a RULER score at `length` from its documents' scores (lm-eval's for a mean: their sample
    standard deviation over the square root of their count), None below two documents. lm-eval reports none ("N/A")
    at RULER's own lengths, 4,096 to 131,072, which RULER's YAML aggregates by its own function (another length falls
    back to a mean and gets one), and "within two standard errors" needs it. A document's score sits under its
    length's key; -1 or None marks the lengths it is not of."""
    scores = [float(sample[str(length)]) for sample in samples if (sample.get(str(length)) is not None
                                                                     and sample[str(length)] >= 0)]
    if len(scores) < 2:
        return None
    return statistics.stdev(scores) / math.sqrt(len(scores))


def _ruler_folder() -> str:
    import lm_eval.tasks

    return str(Path(lm_eval.tasks.__file__).parent / "ruler")
