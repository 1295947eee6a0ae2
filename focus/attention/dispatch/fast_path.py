"""The one switch over how hard Focus is computed: tests and benchmarks pin a path with it, users leave it alone.

    "auto"   the fastest path that applies: the decomposition for a whole sequence (flash-attn on CUDA when
             installed, else PyTorch's fused kernel) and the group index for a decoding step
    "flash"  as "auto", the decomposition through flash-attn
    "torch"  as "auto", the decomposition through PyTorch
    "dense"  every call through the dense masked path, as the oracle (`focus.attention.pattern.reference`) computes it

Where no fast path applies (gradients, soft-capping, a model window shorter than the keys), every setting takes
the dense masked path.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

PATHS = ("auto", "flash", "torch", "dense")
_current = "auto"


def current_fast_path() -> str:
    return _current


def use_fast_path(name: str) -> str:
    """Compute hard Focus by `name` (one of PATHS) from now on; returns the setting it replaces."""
    if name not in PATHS:
        raise ValueError(f"unknown fast path {name!r}; known: {', '.join(PATHS)}")
    global _current
    previous, _current = _current, name
    return previous


@contextmanager
def fast_path(name: str) -> Iterator[None]:
    """`use_fast_path(name)` inside the block, the previous setting after it."""
    previous = use_fast_path(name)
    try:
        yield
    finally:
        use_fast_path(previous)
