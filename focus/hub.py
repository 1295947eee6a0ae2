"""Focus adapters on the Hugging Face hub: found by repo id, loaded with their base model in one call, pushed, and
described by a model card (the adapter folder's README.md, which is what the hub shows).

    model, tokenizer = load_focus_model("user/smollm2-focus-books")          # base model + adapter
    load_focus(model, "user/smollm2-focus-books", revision="v1")             # adapter onto a model you have
    push_to_hub(model, "user/smollm2-focus-books", training=summary)         # adapter + card

Downloads go through huggingface_hub's `snapshot_download`: its local cache, `revision` pinning (a branch, tag or
commit), tokens, and HF_HUB_OFFLINE (cached adapters only) behave as for any hub model.
"""

from __future__ import annotations

import math
import tempfile
from pathlib import Path

import torch
from transformers import PreTrainedModel

from focus.adapter import (
    CARD_NAME,
    CONFIG_NAME,
    WEIGHTS_NAME,
    load_focus,
    read_adapter_config,
    resolve_adapter,
    save_focus,
)
from focus.files import atomic_write


def load_focus_model(source: str | Path, revision: str | None = None, dtype: torch.dtype | None = None,
                     device: str = "cpu", strict: bool = True):
    """(model, tokenizer): the base model an adapter was saved from, with the adapter on it.

    Args:
        source: an adapter folder or hub repo id.
        revision: a branch, tag or commit of the adapter's hub repo.
        dtype: of the model's weights (torch.float32 when None).
        strict: refuse an adapter whose recorded base model does not load as the same model type.
    """
    from focus.models import load_model

    directory = resolve_adapter(source, revision)
    record = read_adapter_config(directory)
    model, tokenizer = load_model(record["base_model"], dtype or torch.float32, device)
    load_focus(model, directory, strict=strict)
    return model, tokenizer


def write_model_card(directory: str | Path, training: dict | None = None, evaluation: dict | None = None) -> Path:
    """Write `directory`/README.md for the adapter there: base model, FocusConfig, and (when given) how it was trained
    and what it measured. `training`: a training summary (`train_focus`'s); `evaluation`: {name: perplexity}."""
    directory = Path(directory)
    record = read_adapter_config(directory)
    base, config = record["base_model"], record["focus_config"]
    front = ["---", f"base_model: {base}" if "/" in base and not Path(base).exists() else None,
             "library_name: focus-attention", "tags:", "- focus", "- sparse-attention", "- adapter", "---"]
    lines = [line for line in front if line is not None]
    lines += ["", f"# Focus adapter for {base}", "",
              "Learnable centroids for Focus sparse attention (\"Why Attend to Everything? Focus is the Key\", "
              "arXiv 2604.03260) on a frozen model: tokens join groups, distant attention stays within a group, a "
              f"local window of {config['window']} tokens stays dense, and only the centroids were trained "
              f"({record['num_layers']} layers of {' x '.join(map(str, record['centroid_shape']))} centroids).", "",
              "```python", "from focus import load_focus_model", "",
              f"model, tokenizer = load_focus_model({_repo_or_folder(directory)!r})",
              "model.generate(**tokenizer(\"...\", return_tensors=\"pt\"), max_new_tokens=50)", "```", "",
              "## Configuration", "", "| field | value |", "|---|---|"]
    lines += [f"| `{key}` | {value} |" for key, value in sorted(config.items())]
    if training:
        lines += ["", "## Training", "", "| | |", "|---|---|"]
        lines += [f"| {name} | {value} |" for name, value in _training_rows(training)]
    if evaluation:
        lines += ["", "## Evaluation", "", "| | perplexity |", "|---|---:|"]
        lines += [f"| {name} | {value:.2f} |" for name, value in evaluation.items()]
    lines += ["", f"Saved by focus {record.get('focus_version', '?')} (commit {record.get('git_commit', '?')}).", ""]
    path = directory / CARD_NAME
    atomic_write(path, lambda tmp: tmp.write_text("\n".join(lines)))
    return path


def _repo_or_folder(directory: Path) -> str:
    """How a reader loads this adapter: its hub id when the folder sits in the hub cache, else a placeholder."""
    parts = directory.resolve().parts
    for part in parts:
        if part.startswith("models--"):
            return part.removeprefix("models--").replace("--", "/")
    return "user/adapter"


def _training_rows(summary: dict) -> list[tuple[str, object]]:
    """The card's training table from a training summary."""
    final = summary.get("final", {})
    train = summary.get("train", {})
    rows = [("steps", final.get("step")), ("training tokens", final.get("train/tokens")),
            ("batch size", train.get("batch_size")), ("learning rate", train.get("lr")),
            ("validation perplexity after training", _rounded(final.get("eval/ppl")))]
    reference = summary.get("reference_eval", {})
    rows += [(f"validation perplexity, {name.replace('_', ' ')}", _rounded(value)) for name, value in reference.items()]
    return [(name, value) for name, value in rows if value is not None]


def _rounded(value):
    return None if value is None or (isinstance(value, float) and not math.isfinite(value)) else round(value, 2)


def push_to_hub(model: PreTrainedModel, repo_id: str, base_model: str | None = None, training: dict | None = None,
                evaluation: dict | None = None, private: bool = False, token: str | None = None,
                revision: str | None = None, commit_message: str = "Upload Focus adapter") -> str:
    """Save the model's adapter with its model card and upload it to `repo_id` (created if needed); returns the
    commit's URL."""
    from huggingface_hub import HfApi

    api = HfApi(token=token)
    with tempfile.TemporaryDirectory() as folder:
        save_focus(model, folder, base_model=base_model)
        write_model_card(folder, training, evaluation)
        api.create_repo(repo_id, private=private, exist_ok=True)
        commit = api.upload_folder(repo_id=repo_id, folder_path=folder, revision=revision,
                                   commit_message=commit_message,
                                   allow_patterns=[CONFIG_NAME, WEIGHTS_NAME, CARD_NAME])
    return str(commit.commit_url if hasattr(commit, "commit_url") else commit)
