"""The names the pipeline gives methods: pretrained, full_finetune, `<variant>-soft|hard`, `lora_r<rank>_lr<lr>`, and
the training-free peers `<selector>@<budget>` (hard top-k only: a selection rule has no soft form); and the variants
that are methods only (`adapter_of`: a trained variant's adapter with changes made at inference)."""

from __future__ import annotations

import re
from typing import Any

from focus.config import ConfigError

PRETRAINED = "pretrained"
FULL_FINETUNE = "full_finetune"
MODES = ("soft", "hard")

SCRATCH_METHODS = ("full", "focus")
SCRATCH_EVALUATED = {"full": "full causal attention", "focus": "Focus soft (as trained)",
                     "focus-hard": "Focus hard top-k"}
"""The from-scratch comparison's methods, and what attention each result was evaluated with."""


def method_variant(method: str) -> tuple[str, str] | None:
    """("<variant>", "soft"|"hard") for a Focus method name, None for "pretrained" and "full_finetune"."""
    if method in (PRETRAINED, FULL_FINETUNE) or parse_lora_name(method) is not None or parse_peer_name(method):
        return None
    variant, _, mode = method.rpartition("-")
    if not variant or mode not in MODES:
        raise ValueError(f"unknown method {method!r}: not pretrained, full_finetune or <variant>-soft|hard")
    return variant, mode


LORA_PREFIX = "lora_"
_NAME = re.compile(r"^lora_r(\d+)_lr(\d+(?:\.\d+)?e-?\d+)$")


def lora_name(rank: int, lr: float) -> str:
    """The method name of one grid cell: lora_name(8, 1e-4) == "lora_r8_lr1e-4"."""
    mantissa, exponent = f"{lr:.3e}".split("e")
    mantissa = mantissa.rstrip("0").rstrip(".")
    return f"{LORA_PREFIX}r{rank}_lr{mantissa}e{int(exponent)}"


def parse_lora_name(method: str) -> tuple[int, float] | None:
    """(rank, lr) of a `lora_name`, None for any other method."""
    match = _NAME.match(method)
    return None if match is None else (int(match.group(1)), float(match.group(2)))


_PEER = re.compile(r"^([a-z]+)@(\d+(?:\.\d+)?)$")
PEER = "peer"


def peer_name(selector: str, budget: float) -> str:
    """The method name of a training-free selector (`FocusConfig.selector`) at a budget: peer_name("quest", 0.3) ==
    "quest@0.3"."""
    return f"{selector}@{budget:g}"


def parse_peer_name(method: str) -> tuple[str, float] | None:
    """(selector, budget) of a `peer_name`, None for any other method."""
    match = _PEER.match(method)
    return None if match is None else (match.group(1), float(match.group(2)))


def method_kind(method: str) -> str:
    """"pretrained", "focus-soft", "focus-hard" (any variant), "lora", "peer" or the method itself."""
    if parse_lora_name(method) is not None:
        return "lora"
    if parse_peer_name(method) is not None:
        return PEER
    variant = method_variant(method)
    return method if variant is None else f"focus-{variant[1]}"


INFERENCE_SETTINGS = ("top_k", "window", "sink_tokens", "dense_heads", "dense_below")
"""The FocusConfig settings a trained adapter takes at inference without training anew (`set_focus_mode`'s)."""


def evaluated_variants(variants: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """{variant: {"adapter_of", "changes"}} of the variants that name `adapter_of`: a trained variant (not the first:
    the profile's main design, which the peers and the claims build on, is trained), changed only in
    `INFERENCE_SETTINGS`."""
    evaluated = {}
    for position, (variant, changes) in enumerate(variants.items()):
        if "adapter_of" not in changes:
            continue
        where, source = f"variants.{variant}", changes["adapter_of"]
        if position == 0:
            raise ConfigError(f"{where}.adapter_of: the first variant is the profile's main design and is trained; "
                              "put the variants that reuse an adapter after it")
        if source not in variants or "adapter_of" in variants[source]:
            trained = sorted(name for name, spec in variants.items() if "adapter_of" not in spec)
            raise ConfigError(f"{where}.adapter_of: {source!r} names no trained variant of this profile {trained}")
        other = sorted(set(changes) - {"adapter_of", *INFERENCE_SETTINGS})
        if other:
            raise ConfigError(f"{where}: {other} need a training of their own; a variant with adapter_of changes only "
                              f"{list(INFERENCE_SETTINGS)}")
        evaluated[variant] = {"adapter_of": source,
                              "changes": {key: value for key, value in changes.items() if key != "adapter_of"}}
    return evaluated
