"""Focus adapters on disk: a JSON config plus a safetensors file of only the centroids.

    <dir>/focus_config.json          sorted keys: FocusConfig, base model id, shapes, version, git commit
    <dir>/focus_centroids.safetensors   layers.<i>.centroids (sets, G, D), layers.<i>.group_bias (sets, G), and
                                     for selector="indexer" layers.<i>.indexer_query (H, D, r) and
                                     layers.<i>.indexer_key (K, D, r)
    <dir>/README.md                  the model card, when written (`focus.hub.write_model_card`)

An adapter is read from a folder or from a hub repo id (`resolve_adapter`, through huggingface_hub's cache).

The safetensors file is written first and the JSON last, each atomically, so a folder with a
focus_config.json always holds a complete adapter.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from transformers import PreTrainedModel

from focus.attention.routers.indexer import KEY_WEIGHTS, QUERY_WEIGHTS
from focus.config import ConfigError, FocusConfig, to_dict
from focus.distributed import barrier, copy_full_, full_state, is_main_process
from focus.files import atomic_write, write_json
from focus.provenance import git_commit
from focus.retrofit import apply_focus, attention_modules, focus_config, has_focus, head_shape
from focus.sources import HUB_ID
from focus.version import __version__

_INDEXER = {"indexer_query": QUERY_WEIGHTS, "indexer_key": KEY_WEIGHTS}
"""An indexer's tensors (`selector="indexer"`) in the weights file, by the module attribute that holds each."""
CONFIG_NAME = "focus_config.json"
WEIGHTS_NAME = "focus_centroids.safetensors"
CARD_NAME = "README.md"
FORMAT = "focus-adapter/1"


def save_focus(model: PreTrainedModel, directory: str | Path, base_model: str | None = None) -> Path:
    """Write the model's Focus adapter to `directory` (created if needed); returns the folder.

    A model sharded over processes: every process calls it (the centroids are gathered whole), process 0 writes.
    """
    if not has_focus(model):
        raise ValueError("model has no Focus to save; call apply_focus first")
    directory = Path(directory)
    modules = attention_modules(model)
    tensors = {}
    for i, module in enumerate(modules):
        tensors[f"layers.{i}.centroids"] = full_state(module.focus_centroids.detach()).float().cpu().contiguous()
        tensors[f"layers.{i}.group_bias"] = full_state(module.focus_group_bias.detach()).float().cpu().contiguous()
        for name, attribute in _INDEXER.items():
            if hasattr(module, attribute):
                weights = full_state(getattr(module, attribute).detach())
                tensors[f"layers.{i}.{name}"] = weights.float().cpu().contiguous()
    if is_main_process():
        config = focus_config(model)
        record = {
            "format": FORMAT,
            # The mode it loads in: the one it was trained for, whatever mode the model was in when saved.
            "focus_config": to_dict(config.replace(mode=config.trained_mode)),
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


class AdapterError(ValueError):
    """A Focus adapter folder is damaged or does not fit the model. The message names the folder and the file."""


_REQUIRED = ("focus_config", "num_layers", "centroid_shape", "base_model", "model_type")


def read_adapter_config(directory: str | Path) -> dict:
    """The adapter's focus_config.json record, checked for what `load_focus` needs.

    Raises:
        FileNotFoundError: no focus_config.json in `directory`.
        AdapterError: the file is not valid JSON (truncated, damaged), not a focus adapter, or lacks a key.
    """
    path = Path(directory) / CONFIG_NAME
    if not path.is_file():
        raise FileNotFoundError(f"no Focus adapter at {directory}: {CONFIG_NAME} not found")
    try:
        record = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise AdapterError(f"Focus adapter {path} is not valid JSON ({err}); the file is damaged or truncated") from None
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        found = record.get("format") if isinstance(record, dict) else type(record).__name__
        raise AdapterError(f"{path} is not a {FORMAT} file (format={found!r})")
    missing = [key for key in _REQUIRED if key not in record]
    if missing:
        raise AdapterError(f"Focus adapter {path} lacks {missing[0]!r}; the file is damaged or was edited")
    return record


# FocusConfig fields added after adapters were first written, with the value every older adapter was trained with
# (not today's default, which may differ).
_LEGACY_FIELDS = {"route_queries": "key", "unrotate": False, "gate": "overlap", "objective": "language_model"}


def resolve_adapter(source: str | Path, revision: str | None = None, token: str | None = None) -> Path:
    """The folder holding the adapter `source`: itself when it is a folder, else the hub repo `source` ("user/name")
    at `revision`, downloaded through huggingface_hub's cache (offline with HF_HUB_OFFLINE=1: the cached copy).

    Raises:
        FileNotFoundError: one line, when `source` is neither a folder nor a repo found on the hub or in the cache.
    """
    path = Path(source).expanduser()
    if path.is_dir():
        if revision is not None:
            raise ValueError(f"revision={revision!r} names a hub revision, but {source} is a local folder")
        return path
    if not HUB_ID.match(str(source)):
        raise FileNotFoundError(f"no Focus adapter at {source}: no such folder (and not a hub repo id, user/name)")
    from huggingface_hub import constants, snapshot_download, try_to_load_from_cache
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError, OfflineModeIsEnabled

    if constants.HF_HUB_OFFLINE:  # the cached copy, looked up alike by every huggingface_hub (1.x asks the network
        cached = try_to_load_from_cache(str(source), CONFIG_NAME, revision=revision)  # for a commit's file list)
        if isinstance(cached, str):
            return Path(cached).parent
    try:
        folder = snapshot_download(str(source), revision=revision, token=token,
                                   allow_patterns=[CONFIG_NAME, WEIGHTS_NAME, CARD_NAME])
    except (LocalEntryNotFoundError, HfHubHTTPError, OfflineModeIsEnabled) as err:
        at = f" at revision {revision!r}" if revision else ""
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise FileNotFoundError(f"no Focus adapter {source}{at}: no such folder, nor on the hub or in its local cache "
                                f"({reason})") from None
    return Path(folder)


def load_focus(
    model: PreTrainedModel, source: str | Path, strict: bool = False, revision: str | None = None
) -> PreTrainedModel:
    """Put the adapter `source` (a folder, or a hub repo id at `revision`) onto `model` (applying Focus first if
    needed); returns the model, in the mode the adapter was trained for (`FocusConfig.trained_mode`: hard for the
    default straight-through objective); `set_focus_mode` chooses another.

    Every tensor is checked against the shape and dtype the model needs before anything is copied, so a damaged or
    foreign adapter leaves the model as it was. An adapter saved from another model type, or from another hub model
    (compared when both names are hub ids; local folders and packaged names differ between machines), loads with a
    warning, as PEFT does; `strict=True` refuses it.

    Raises:
        FileNotFoundError: `source` holds no adapter (or no centroid file), or the hub has none by that id.
        AdapterError: one line naming the folder, the file and what does not fit.
    """
    directory = resolve_adapter(source, revision)
    record = read_adapter_config(directory)
    try:
        config = FocusConfig.from_dict({**_LEGACY_FIELDS, **record["focus_config"]})
        config = config.replace(mode=config.trained_mode)  # adapters saved before the record said so
    except ConfigError as err:
        raise AdapterError(f"Focus adapter {directory / CONFIG_NAME}: {err}") from None
    _check_base_model(model, record, directory, strict)
    kv_heads, head_dim = head_shape(model)
    sets = 1 if config.shared_centroids else kv_heads
    expected = [sets, config.num_groups, head_dim]
    layers = len(attention_modules(model))
    if record["num_layers"] != layers or record["centroid_shape"] != expected:
        raise AdapterError(
            f"Focus adapter {directory} holds {record['num_layers']} layers of {tuple(record['centroid_shape'])} "
            f"centroids (base {record['base_model']}), but this model needs {layers} layers of {tuple(expected)}"
        )
    heads = model.config.get_text_config().num_attention_heads
    rank = config.indexer_rank
    indexer = {} if config.selector != "indexer" else {"indexer_query": (heads, head_dim, rank),
                                                       "indexer_key": (kv_heads, head_dim, rank)}
    tensors = _read_tensors(directory, layers, tuple(expected), indexer)
    if not has_focus(model):
        apply_focus(model, config, init_centroids=False)
    elif (focus_config(model).num_groups != config.num_groups
          or focus_config(model).shared_centroids != config.shared_centroids
          or any(tuple(getattr(attention_modules(model)[0], _INDEXER[name], torch.empty(0)).shape) != shape
                 for name, shape in indexer.items())):
        raise AdapterError(f"model's Focus layout differs from the adapter at {directory}; call remove_focus first")
    for i, module in enumerate(attention_modules(model)):
        module.focus_config = config
        copy_full_(module.focus_centroids, tensors[f"layers.{i}.centroids"])  # or this process's shard of them
        copy_full_(module.focus_group_bias, tensors[f"layers.{i}.group_bias"])
        for name in indexer:
            copy_full_(getattr(module, _INDEXER[name]), tensors[f"layers.{i}.{name}"])
    return model


def _check_base_model(model: PreTrainedModel, record: dict, directory: Path, strict: bool) -> None:
    """Warn (strict: raise) when the adapter was saved from another model type or another hub model."""
    problems = []
    if record["model_type"] != model.config.model_type:
        problems.append(f"model type {record['model_type']!r}, this model is {model.config.model_type!r}")
    here = getattr(model.config, "_name_or_path", "") or ""
    saved = str(record["base_model"])
    if _is_hub_id(saved) and _is_hub_id(here) and saved != here:
        problems.append(f"base model {saved!r}, this model is {here!r}")
    if problems:
        message = f"Focus adapter {directory / CONFIG_NAME} was saved from {' and '.join(problems)}"
        if strict:
            raise AdapterError(message)
        warnings.warn(message + "; its groups were trained for that model (strict=True refuses this)", stacklevel=3)


def _is_hub_id(name: str) -> bool:
    return bool(HUB_ID.match(name)) and not Path(name).expanduser().exists()


def _read_tensors(
    directory: Path, layers: int, centroid_shape: tuple[int, ...], per_layer: dict[str, tuple[int, ...]] | None = None,
) -> dict[str, torch.Tensor]:
    """The adapter's tensors, every one checked: present, no others, floating point, of the expected shape.
    `per_layer`: the shapes of further tensors each layer holds ({name: shape}, an indexer's)."""
    path = directory / WEIGHTS_NAME
    if not path.is_file():
        raise FileNotFoundError(f"Focus adapter {directory} has no {WEIGHTS_NAME}")
    try:
        tensors = load_file(str(path))
    except Exception as err:  # safetensors raises its own error types for a damaged header or a short file
        raise AdapterError(f"Focus adapter {path} cannot be read ({str(err).splitlines()[0]}); the file is damaged") from None
    expected = {}
    for i in range(layers):
        expected[f"layers.{i}.centroids"] = centroid_shape
        expected[f"layers.{i}.group_bias"] = centroid_shape[:2]
        for name, shape in (per_layer or {}).items():
            expected[f"layers.{i}.{name}"] = shape
    missing = sorted(set(expected) - set(tensors), key=_natural)
    unexpected = sorted(set(tensors) - set(expected), key=_natural)
    if missing or unexpected:
        what = f"lacks {missing[0]!r}" if missing else f"holds an unexpected tensor {unexpected[0]!r}"
        raise AdapterError(f"Focus adapter {path} {what} (focus_config.json says {layers} layers)")
    for name, shape in expected.items():
        tensor = tensors[name]
        if tuple(tensor.shape) != shape:
            raise AdapterError(f"Focus adapter {path}: {name} has shape {tuple(tensor.shape)}, but {CONFIG_NAME} "
                               f"and this model need {shape}")
        if not tensor.is_floating_point():
            raise AdapterError(f"Focus adapter {path}: {name} is {tensor.dtype}, not a floating-point tensor")
        if not torch.isfinite(tensor).all():
            raise AdapterError(f"Focus adapter {path}: {name} holds NaN or infinite values")
    return tensors


def _natural(name: str) -> tuple:
    return tuple(int(part) if part.isdigit() else part for part in name.split("."))
