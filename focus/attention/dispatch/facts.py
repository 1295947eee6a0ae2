"""What decides how one attention call is computed: its facts, read from the call (`focus.attention.function`) or
stated (`focus.attention.explain`), and the facts of this installation (flash-attn, the fast-path switch).

A leaf: the kernels read these facts and the plan reads them; neither imports the other through here.
"""

from __future__ import annotations

import functools
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator

from focus.attention.dispatch.fast_path import current_fast_path
from focus.provenance import cpu_flags


@dataclass(frozen=True)
class CallFacts:
    """What decides the path of one attention call.

    queries, keys: Q and L of the call (a decoding step: Q = 1 with a cache); heads, k_heads, head_dim: its shapes.
    cache: "none", or the group index a `FocusCache` keeps ("eager", "native": whether it runs the native kernels).
    index_current: the index needs only the call's new keys (not cropped, every row's sink tokens seen).
    left_padded: padding, if any, is only on the left. gradients: a gradient flows through the query or the key.
    training: the centroids are training (`centroids_training`). traced: the routing logits are recorded.
    softcap, dropout: the model soft-caps its logits or drops attention weights; model_window: its own sliding
    window, or None. dense_rows: the first queries that attend as the unmodified model (`dense_below`).
    flash_attn: whether flash-attn imports (None: `flash_attn_installed` looks).
    fast_path: the fast-path switch the call is planned under (`focus.attention.dispatch.fast_path`; None: the
    one in force when the facts are made).
    dtype: the query's ("float32", "bfloat16", ...). matrix_units: the CPU's bfloat16 matrix units (AMX) may compute
    it (None: whether this CPU has them and `use_matrix_units` allows them). native_kernels: the native kernels are
    built or load here (None: build them, once per machine, to know: `native.kernels_built`).
    """

    queries: int
    keys: int
    heads: int = 9
    k_heads: int = 3
    head_dim: int = 64
    device: str = "cpu"
    cache: str = "none"
    index_current: bool = True
    left_padded: bool = True
    gradients: bool = False
    training: bool = False
    traced: bool = False
    softcap: bool = False
    dropout: bool = False
    model_window: int | None = None
    dense_rows: int = 0
    flash_attn: bool | None = None
    fast_path: str | None = None
    dtype: str = "float32"
    matrix_units: bool | None = None
    native_kernels: bool | None = None

    decoding_step: bool = field(init=False)
    """One new query against a `FocusCache`'s keys."""

    def __post_init__(self):
        # Resolved once, as the facts are made: every row reads the same switch, without a call back here per row.
        object.__setattr__(self, "decoding_step", self.cache != "none" and self.queries == 1)
        if self.fast_path is None:
            object.__setattr__(self, "fast_path", current_fast_path())

    @property
    def has_flash_attn(self) -> bool:
        return flash_attn_installed() if self.flash_attn is None else self.flash_attn

    @property
    def has_native_kernels(self) -> bool:
        if self.native_kernels is not None:
            return self.native_kernels
        from focus.attention.native import kernels_built  # (the build is asked only where a row needs it)

        return kernels_built(required=False)

    @property
    def has_matrix_units(self) -> bool:
        return (_MATRIX_UNITS_ALLOWED and cpu_matrix_units()) if self.matrix_units is None else self.matrix_units


_MATRIX_UNITS_ALLOWED = True


@contextmanager
def use_matrix_units(allowed: bool) -> Iterator[None]:
    """Inside the block, plans take the CPU's matrix units (AMX) only if `allowed` (benchmarks and tests time the
    vector units on the same CPU with `use_matrix_units(False)`); a fact of every call planned there."""
    global _MATRIX_UNITS_ALLOWED
    previous, _MATRIX_UNITS_ALLOWED = _MATRIX_UNITS_ALLOWED, allowed
    try:
        yield
    finally:
        _MATRIX_UNITS_ALLOWED = previous


@functools.cache
def cpu_matrix_units() -> bool:
    """Whether this CPU has bfloat16 matrix units (AMX: Linux's `amx_bf16` flag), without building the native
    kernels (their `matrix_units()` asks oneDNN, the same answer where both can ask)."""
    return "amx_bf16" in cpu_flags()


@functools.cache
def flash_attn_installed() -> bool:
    """Whether flash-attn's varlen kernel imports here."""
    try:
        from flash_attn import flash_attn_varlen_func  # noqa: F401
    except ImportError:
        return False
    return True


def available_backends(device: str = "cpu") -> list[str]:
    """The decomposition's backends that can run every call on `device` here ("native" takes only query-routed calls
    on the CPU)."""
    return ["flash", "torch"] if device.startswith("cuda") and flash_attn_installed() else ["torch"]


def decomposition_backend(device: str, flash_attn: bool | None = None) -> str:
    """The decomposition's backend for a call on `device` ("cpu", "cuda"): the one the fast-path switch pins ("flash",
    "torch"), else flash-attn on CUDA where it is installed (`flash_attn`; None: look), else "torch"."""
    switch = current_fast_path()
    if switch in ("flash", "torch"):
        return switch
    installed = flash_attn_installed() if flash_attn is None else flash_attn
    return "flash" if device == "cuda" and installed else "torch"
