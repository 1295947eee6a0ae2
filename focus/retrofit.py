"""Retrofit Focus onto a Hugging Face causal LM: add centroids, freeze the rest, switch attention.

Attention is switched only through transformers' `AttentionInterface` and `AttentionMaskInterface`
(both under the name "focus"); no model class is patched. Registering the mask function matters:
without it transformers hands custom attention no mask at all, silently dropping causal, padding
and sliding-window masking.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator

import torch
from torch import nn
from transformers import AttentionInterface, PreTrainedModel
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from focus.attention.function import FOCUS_ATTENTION, focus_attention
from focus.attention.pattern.reference import unmodified_attention
from focus.attention.routers.centroids import spherical_kmeans
from focus.attention.routers.indexer import KEY_WEIGHTS, QUERY_WEIGHTS, calibrate_indexer
from focus.attention.routers.routing import key_positions, routing_vectors
from focus.config import FocusConfig, dense_head_address
from focus.distributed import copy_full_
from focus.models import input_device

logger = logging.getLogger(__name__)

_SAVERS = ("save_pretrained", "push_to_hub")
"""The model's own save and upload, refused on a Focus model (`_refuse_saving`)."""

_CALIBRATION = "focus_calibration"
_CALIBRATION_TOKENS = 2048  # random-token calibration size when the caller gives no text


def _register_interfaces() -> None:
    for name, fn in ((FOCUS_ATTENTION, focus_attention), (_CALIBRATION, _calibration_attention)):
        AttentionInterface.register(name, fn)
        # sdpa_mask: a boolean mask (True = attend), or None when the mask is plainly causal, so long
        # unpadded prompts never materialise an L x L mask.
        AttentionMaskInterface.register(name, sdpa_mask)


def attention_modules(model: nn.Module) -> list[nn.Module]:
    """The self-attention modules of `model`, in layer order (those that carry a `layer_idx`)."""
    found = [
        m for m in model.modules()
        if type(m).__name__.endswith("Attention") and isinstance(getattr(m, "layer_idx", None), int)
    ]
    return sorted(found, key=lambda m: m.layer_idx)


def head_shape(model: PreTrainedModel) -> tuple[int, int]:
    """(key/value heads, head size) of the model's attention layers."""
    config = model.config.get_text_config()
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return kv_heads, head_dim


def rotary_frequencies(model: nn.Module, module: nn.Module) -> torch.Tensor | None:
    """(D / 2,) rotary frequencies the attention layer `module` is embedded with, or None (no rotary embedding).

    transformers keeps one rotary module per model (`inv_freq`), or, where layer types differ (Gemma 3's local and
    global layers), one frequency buffer per type (`<layer type>_inv_freq`).
    """
    layer_types = getattr(model.config.get_text_config(), "layer_types", None)
    for name, rotary in model.named_modules():
        if not name.endswith("rotary_emb"):
            continue
        if layer_types is not None and hasattr(rotary, f"{layer_types[module.layer_idx]}_inv_freq"):
            return getattr(rotary, f"{layer_types[module.layer_idx]}_inv_freq")
        if isinstance(getattr(rotary, "inv_freq", None), torch.Tensor):
            return rotary.inv_freq
    return None


def has_focus(model: nn.Module) -> bool:
    return hasattr(model, "_focus_original")


def apply_focus(
    model: PreTrainedModel,
    config: FocusConfig,
    calibration_ids: torch.Tensor | None = None,
    calibration_mask: torch.Tensor | None = None,
    seed: int = 0,
    init_centroids: bool = True,
) -> PreTrainedModel:
    """Add Focus centroids to every attention layer of `model` (in place) and freeze everything else.

    Centroids start as spherical k-means of each layer's own routing vectors (keys or values) on
    `calibration_ids`; pass a few sequences of real text. Without it, random token ids are used and a
    warning says so: the groups then start from the model's vectors for noise, not for language.

    Args:
        calibration_ids: (N, T) token ids, with an optional (N, T) `calibration_mask` for padding.
        init_centroids: False leaves the centroids at zero, for a caller about to load them.
    Returns:
        The same model, now routing attention through Focus.
    """
    if not isinstance(config, FocusConfig):
        raise TypeError(f"apply_focus expects a FocusConfig, got {type(config).__name__}")
    if has_focus(model):
        raise ValueError("model already has Focus; call remove_focus(model) first")
    modules = attention_modules(model)
    if not getattr(model, "_supports_attention_backend", False) or not modules:
        raise ValueError(
            f"unsupported architecture {type(model).__name__}: its attention does not go through "
            "transformers' AttentionInterface"
        )
    heads = model.config.get_text_config().num_attention_heads
    if config.selector == "indexer" and config.indexer_rank > head_shape(model)[1]:  # before the model is touched
        raise ValueError(f"FocusConfig.indexer_rank {config.indexer_rank} exceeds the head size {head_shape(model)[1]} "
                         f"of {type(model).__name__}")
    _register_interfaces()
    model._focus_original = {
        "attn_implementation": model.config._attn_implementation,
        "requires_grad": {name: p.requires_grad for name, p in model.named_parameters()},
    }
    model.requires_grad_(False)
    output_embeddings = model.get_output_embeddings()
    if output_embeddings is not None:
        model._focus_original["output_hook"] = output_embeddings.register_forward_pre_hook(_contiguous_input)
    kv_heads, head_dim = head_shape(model)
    for name in config.dense_heads:
        layer, head = dense_head_address(name)
        if layer >= len(modules) or head >= kv_heads:
            raise ValueError(f"FocusConfig.dense_heads {name!r} is not a head of {type(model).__name__}: it has "
                             f"{len(modules)} layers of {kv_heads} key/value heads")
    sets = 1 if config.shared_centroids else kv_heads
    if config.unrotate and rotary_frequencies(model, modules[0]) is None:
        # Not a warning: unrotate is the default. Learned absolute positions (GPT-2) are mixed into the hidden
        # state before the key projection, so there is no exact way to take them out.
        logger.info("Focus: %s has no rotary embedding to undo; it routes on its keys as they are", type(model).__name__)
    for module in modules:
        device = next(module.parameters()).device  # its own: a model spread over GPUs has layers on each
        module.focus_config = config
        inv_freq = rotary_frequencies(model, module)
        if inv_freq is not None:  # kept whatever the config, so set_focus_mode can switch unrotate on
            if inv_freq.numel() * 2 != head_dim:
                raise ValueError(f"unsupported architecture {type(model).__name__}: a rotary embedding on "
                                 f"{inv_freq.numel() * 2} of {head_dim} head dimensions (partial rotary)")
            # Not persistent: derived from the model, never part of an adapter or a checkpoint.
            module.register_buffer("focus_inv_freq", inv_freq.detach().float().clone().to(device), persistent=False)
        # float32 whatever the model's dtype: these are the only weights an optimizer updates.
        module.focus_centroids = nn.Parameter(torch.zeros(sets, config.num_groups, head_dim, device=device))
        module.register_buffer("focus_group_bias", torch.zeros(sets, config.num_groups, device=device))
        if config.selector == "indexer":  # the indexer is the router that trains; the centroids are kept, unused
            module.focus_centroids.requires_grad_(False)
            setattr(module, QUERY_WEIGHTS, nn.Parameter(torch.zeros(heads, head_dim, config.indexer_rank, device=device)))
            setattr(module, KEY_WEIGHTS, nn.Parameter(torch.zeros(kv_heads, head_dim, config.indexer_rank, device=device)))
    if init_centroids:
        calibrate_centroids(model, calibration_ids, calibration_mask, seed)
    model.set_attn_implementation(FOCUS_ATTENTION)
    for name in _SAVERS:
        setattr(model, name, _refuse_saving(name))
    logger.info("Focus: %s trainable centroid parameters", f"{focus_parameter_count(model):,}")
    return model


def _contiguous_input(module: nn.Module, args: tuple) -> tuple | None:
    """The output embeddings' input, contiguous. transformers hands them the prompt's last position as a view
    (`hidden_states[:, -1:, :]`, with the whole prompt's strides); torch.matmul folds such an input into one matrix
    product only while the weight requires grad, and with the weight frozen, as Focus freezes it, it multiplies
    through bmm with the weight expanded and copied (SmolLM2: 57 MB in bfloat16, 104 ms of a 2K prefill on 2 cores,
    on every prompt). Copying the one position instead costs nothing (`contiguous()` would not copy it: a size-1
    dimension's stride does not count there)."""
    hidden = args[0] if args else None
    if not isinstance(hidden, torch.Tensor) or hidden.dim() < 3:
        return None
    sizes, strides = hidden.shape, hidden.stride()
    if all(strides[i] == strides[i + 1] * sizes[i + 1] for i in range(hidden.dim() - 2)):
        return None  # matmul folds it as it is
    return (torch.empty_like(hidden, memory_format=torch.contiguous_format).copy_(hidden), *args[1:])


class FocusSaveError(RuntimeError):
    """A Focus model's own `save_pretrained` or `push_to_hub` was called: it would write the centroids into the base
    model's weights, which `from_pretrained` then drops (unexpected keys), giving back the plain model."""


class _refuse_saving:  # noqa: N801 (stands where a method was); a class, so a Focus model still pickles
    """The instance's `save_pretrained` / `push_to_hub` on a Focus model: a one-line error naming the calls to use."""

    def __init__(self, name: str):
        self.name = name

    def __call__(self, *args, **kwargs):
        use = ("focus.push_to_hub(model, repo_id) uploads the adapter, load_focus_model(repo_id) loads it back"
               if self.name == "push_to_hub" else
               "save_focus(model, folder) writes the adapter (~0.4 MB), load_focus_model(folder) or "
               "load_focus(base_model, folder) loads it back")
        raise FocusSaveError(f"{self.name} on a Focus model would save the base model with the centroids inside, "
                             f"which from_pretrained loads as the plain model; {use} (or remove_focus(model) first)")


def calibrate_centroids(
    model: PreTrainedModel,
    calibration_ids: torch.Tensor | None = None,
    calibration_mask: torch.Tensor | None = None,
    seed: int = 0,
) -> None:
    """(Re)initialise the centroids of a Focus model as `apply_focus` does: k-means on `calibration_ids`, or on random
    token ids (with a warning) when None. Works on a model sharded over processes (every process calls it)."""
    if calibration_ids is None:
        warnings.warn(
            "apply_focus: no calibration_ids given, initialising centroids from random token ids; "
            "pass a few sequences of real text for meaningful groups",
            stacklevel=3,
        )
        gen = torch.Generator().manual_seed(seed)
        vocab = model.config.get_text_config().vocab_size
        calibration_ids = torch.randint(vocab, (4, _CALIBRATION_TOKENS // 4), generator=gen)
    kmeans_centroids(model, calibration_ids, calibration_mask, seed)


def remove_focus(model: PreTrainedModel) -> PreTrainedModel:
    """Undo `apply_focus`: drop centroids, restore the original attention and trainable flags."""
    if not has_focus(model):
        raise ValueError("model has no Focus to remove")
    original = model._focus_original
    for module in attention_modules(model):
        del module.focus_centroids, module.focus_group_bias, module.focus_config
        for name in (QUERY_WEIGHTS, KEY_WEIGHTS):
            if hasattr(module, name):
                delattr(module, name)
        if hasattr(module, "focus_inv_freq"):
            del module.focus_inv_freq
    model.set_attn_implementation(original["attn_implementation"])
    for name, param in model.named_parameters():
        param.requires_grad_(original["requires_grad"][name])
    for name in _SAVERS:
        model.__dict__.pop(name, None)  # the class's own again
    if "output_hook" in original:
        original["output_hook"].remove()
    del model._focus_original
    return model


@contextlib.contextmanager
def focus_disabled(model: PreTrainedModel) -> Iterator[PreTrainedModel]:
    """Within the block every layer attends as the pretrained model does (centroids kept, untouched)."""
    if not has_focus(model):
        raise ValueError("model has no Focus; call apply_focus first")
    model.set_attn_implementation(model._focus_original["attn_implementation"])
    try:
        yield model
    finally:
        model.set_attn_implementation(FOCUS_ATTENTION)


def set_focus_mode(model: nn.Module, mode: str, **changes) -> None:
    """Switch every layer to `mode` ("soft" or "hard"), optionally changing other routing settings
    (top_k, window, dense_below, ...) that need no new parameters."""
    if not has_focus(model):
        raise ValueError("model has no Focus; call apply_focus first")
    for module in attention_modules(model):
        module.focus_config = module.focus_config.replace(mode=mode, **changes)
        if module.focus_config.num_groups != module.focus_centroids.shape[1]:
            raise ValueError("set_focus_mode cannot change num_groups: the centroids are fixed")


def focus_config(model: nn.Module) -> FocusConfig:
    """The FocusConfig the model's layers run with."""
    if not has_focus(model):
        raise ValueError("model has no Focus; call apply_focus first")
    return attention_modules(model)[0].focus_config


def focus_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The router's parameters in layer order: the centroids, one (sets, G, D) tensor per layer, or, for
    `selector="indexer"`, the indexer's query and key weights, (H, D, r) and (K, D, r) per layer."""
    found = []
    for module in attention_modules(model):
        if hasattr(module, KEY_WEIGHTS):
            found += [getattr(module, QUERY_WEIGHTS), getattr(module, KEY_WEIGHTS)]
        elif hasattr(module, "focus_centroids"):
            found.append(module.focus_centroids)
    return found


def focus_parameter_count(model: nn.Module) -> int:
    return sum(p.numel() for p in focus_parameters(model))


# --- k-means initialisation ---------------------------------------------------------------------


@torch.no_grad()
def kmeans_centroids(
    model: PreTrainedModel,
    calibration_ids: torch.Tensor,
    calibration_mask: torch.Tensor | None = None,
    seed: int = 0,
) -> None:
    """Set each layer's centroids to spherical k-means of that layer's routing vectors, and its indexer, if it has one
    (`selector="indexer"`), to the principal directions of its keys
    (`focus.attention.routers.indexer.calibrate_indexer`).

    The model runs with its own (dense) attention while the vectors are collected, so layer l sees
    exactly the vectors the unmodified network produces.
    """
    modules = attention_modules(model)
    for module in modules:
        module._focus_calibration = []
    current = model.config._attn_implementation
    model.set_attn_implementation(_CALIBRATION)
    device = input_device(model)
    try:
        model(
            input_ids=calibration_ids.to(device),
            attention_mask=None if calibration_mask is None else calibration_mask.to(device),
            use_cache=False,
        )
    finally:
        model.set_attn_implementation(current)
    for module in modules:
        vectors = torch.cat(module._focus_calibration, dim=0)  # (N, K, D) real tokens only
        del module._focus_calibration
        second_moment = module.__dict__.pop("_focus_key_moment", None)
        if second_moment is not None:
            calibrate_indexer(module, second_moment)
        sets, num_groups, _ = module.focus_centroids.shape
        points = [vectors.flatten(0, 1)] if sets == 1 else vectors.unbind(dim=1)
        centroids = [
            spherical_kmeans(p, num_groups, seed=seed + 1000 * module.layer_idx + h) for h, p in enumerate(points)
        ]
        copy_full_(module.focus_centroids, torch.stack(centroids))  # a shard of it when the model is sharded
        module.focus_group_bias.zero_()


def _calibration_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, softcap=None, **kwargs):
    """Dense attention that records each layer's routing vectors (real tokens only) for k-means."""
    k_len = key.shape[-2]
    base_mask = None if attention_mask is None else attention_mask[..., :k_len]
    positions = key_positions(kwargs.get("position_ids"), k_len, key.device)
    vectors = routing_vectors(module, key if module.focus_config.route_on == "key" else value, positions)  # (B, K, L, D)
    tokens = vectors.transpose(1, 2).float()  # (B, L, K, D)
    if base_mask is not None:
        tokens = tokens[base_mask.any(dim=-2)[:, 0]]  # (N, K, D)
    else:
        tokens = tokens.flatten(0, 1)
    module._focus_calibration.append(tokens.cpu())
    if hasattr(module, KEY_WEIGHTS):  # the indexer starts from the principal directions of the keys as attended
        keys = key.transpose(1, 2).float()  # (B, L, K, D)
        keys = keys[base_mask.any(dim=-2)[:, 0]] if base_mask is not None else keys.flatten(0, 1)  # (N, K, D)
        moment = torch.einsum("nkd,nke->kde", keys, keys).cpu().double()
        module.__dict__["_focus_key_moment"] = module.__dict__.get("_focus_key_moment", 0) + moment
    out = unmodified_attention(query, key, value, base_mask, scaling, dropout, softcap)
    return out.transpose(1, 2).contiguous(), None
