"""Focus adapters on disk: a JSON config plus a safetensors file of only the centroids.

    <dir>/focus_config.json          sorted keys: FocusConfig, base model id, shapes, version, git commit
    <dir>/focus_centroids.safetensors   layers.<i>.centroids (sets, G, D), layers.<i>.group_bias (sets, G)

The safetensors file is written first and the JSON last, each atomically, so a folder with a
focus_config.json always holds a complete adapter.
"""

from __future__ import annotations

import json
from pathlib import Path

from safetensors.torch import load_file, save_file
from transformers import PreTrainedModel

from .config import FocusConfig, to_dict
from .distributed import barrier, copy_full_, full_state, is_main_process
from .files import atomic_write, write_json
from .provenance import git_commit
from .retrofit import apply_focus, attention_modules, focus_config, has_focus, head_shape

CONFIG_NAME = "focus_config.json"
WEIGHTS_NAME = "focus_centroids.safetensors"
FORMAT = "focus-adapter/1"


def save_focus(model: PreTrainedModel, directory: str | Path, base_model: str | None = None) -> Path:
    """Write the model's Focus adapter to `directory` (created if needed); returns the folder.

    A model sharded over processes: every process calls it (the centroids are gathered whole), process 0 writes.
    """
    if not has_focus(model):
        raise ValueError("model has no Focus to save; call apply_focus first")
    from . import __version__

    directory = Path(directory)
    modules = attention_modules(model)
    tensors = {}
    for i, module in enumerate(modules):
        tensors[f"layers.{i}.centroids"] = full_state(module.focus_centroids.detach()).float().cpu().contiguous()
        tensors[f"layers.{i}.group_bias"] = full_state(module.focus_group_bias.detach()).float().cpu().contiguous()
    if is_main_process():
        record = {
            "format": FORMAT,
            "focus_config": to_dict(focus_config(model)),
            "base_model": base_model or getattr(model.config, "_name_or_path", "") or "unknown",
            "model_type": model.config.model_type,
            "num_layers": len(modules),
            "centroid_shape": list(modules[0].focus_centroids.shape),
            "focus_version": __version__,
            "git_commit": git_commit(),
        }
        directory.mkdir(parents=True, exist_ok=True)
        atomic_write(directory / WEIGHTS_NAME, lambda path: save_file(tensors, str(path), metadata={"format": "pt"}))
        write_json(directory / CONFIG_NAME, record)
    barrier()  # on return the adapter is there, for every process
    return directory


def read_adapter_config(directory: str | Path) -> dict:
    path = Path(directory) / CONFIG_NAME
    if not path.is_file():
        raise FileNotFoundError(f"no Focus adapter at {directory}: {CONFIG_NAME} not found")
    record = json.loads(path.read_text())
    if record.get("format") != FORMAT:
        raise ValueError(f"{path} is not a {FORMAT} file (format={record.get('format')!r})")
    return record


# FocusConfig fields added after adapters were first written, with the value every older adapter was trained with
# (not today's default, which may differ).
_LEGACY_FIELDS = {"route_queries": "key"}


def load_focus(model: PreTrainedModel, directory: str | Path) -> PreTrainedModel:
    """Put the adapter in `directory` onto `model` (applying Focus first if needed); returns the model."""
    record = read_adapter_config(directory)
    config = FocusConfig.from_dict({**_LEGACY_FIELDS, **record["focus_config"]})
    kv_heads, head_dim = head_shape(model)
    sets = 1 if config.shared_centroids else kv_heads
    expected = [sets, config.num_groups, head_dim]
    layers = len(attention_modules(model))
    if record["num_layers"] != layers or record["centroid_shape"] != expected:
        raise ValueError(
            f"Focus adapter {directory} holds {record['num_layers']} layers of {tuple(record['centroid_shape'])} "
            f"centroids (base {record['base_model']}), but this model needs {layers} layers of {tuple(expected)}"
        )
    tensors = load_file(str(Path(directory) / WEIGHTS_NAME))
    if not has_focus(model):
        apply_focus(model, config, init_centroids=False)
    elif focus_config(model).num_groups != config.num_groups or focus_config(model).shared_centroids != config.shared_centroids:
        raise ValueError(f"model's Focus layout differs from the adapter at {directory}; call remove_focus first")
    for i, module in enumerate(attention_modules(model)):
        module.focus_config = config
        copy_full_(module.focus_centroids, tensors[f"layers.{i}.centroids"])  # or this process's shard of them
        copy_full_(module.focus_group_bias, tensors[f"layers.{i}.group_bias"])
    return model
