"""The names the pipeline gives methods: pretrained, full_finetune, `<variant>-soft|hard`, `lora_r<rank>_lr<lr>`, and
the training-free peers `<selector>@<budget>` (hard top-k only: a selection rule has no soft form)."""

from __future__ import annotations

import re

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
