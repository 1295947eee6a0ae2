"""The kernels of hard Focus as rows of one ordered table, each the fastest for the calls the rows above it decline:
each says why it declines a call, the plan (`focus.attention.dispatch.planning`) takes the first that does not and keeps
every refusal (`Plan.declined`); the row then runs the call (`run(state, call)`,
`focus.attention.dispatch.kernel_runs`).

As PyTorch's `sdp_utils` and xformers' dispatch do it: a kernel's conditions live in its row, not in the planner, so a
new kernel (a router's own prefill or step) is a new row and nothing else changes; `explain` and
docs/attention_plan.md print the refusals. Every kernel computes the dense masked reference's output over the pairs
the plan's router keeps (`tests/test_decomposed.py`, `tests/test_decoding.py`, `tests/test_native_step.py`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

import focus.attention.dispatch.kernel_runs as runs
from focus.attention.dispatch.facts import CallFacts
from focus.attention.dispatch.step_cost import NATIVE_STEP_BELOW, sparse_step_pays
from focus.attention.kernels.call import AttentionCall, CallState
from focus.attention.native import MAX_DIM as NATIVE_MAX_DIM
from focus.attention.pattern.rule import GROUP_BITS
from focus.config import FocusConfig


@dataclass(frozen=True)
class Kernel:
    """One row: `name` (what `Plan.kernel` says), `text` (what it computes), `declines(config, facts)` (why not this
    call; None: it takes it), `takes` (what it is chosen for), `run(state, call)` (the call computed,
    `focus.attention.dispatch.kernel_runs`), `steps_only` (it computes only a decoding step: it is not asked about other
    calls), `selector` (it computes only this router's selection: it is not asked about another's) and `dtype` (it
    computes only calls of this dtype)."""

    name: str
    text: str
    declines: Callable[[FocusConfig, CallFacts], str | None]
    takes: str
    run: Callable[[CallState, AttentionCall], torch.Tensor]
    steps_only: bool = False
    selector: str | None = None
    dtype: str | None = None


def fast_path_blocker(config: FocusConfig, facts: CallFacts) -> str | None:
    """Why no kernel of the groups (a decomposition, a decoding step) can compute the call."""
    if config.selector != "centroids":
        return f"selector {config.selector!r}: its keys differ per query and fit no group index"
    return _pattern_blocker(facts)


def _pattern_blocker(facts: CallFacts) -> str | None:
    """Why no kernel but the dense masked one can compute the call, whatever routes it."""
    if facts.fast_path == "dense":
        return "the fast-path switch is 'dense'"
    if facts.softcap:
        return "the model soft-caps its logits"
    if facts.dropout:
        return "attention dropout"
    if facts.model_window is not None and facts.model_window < facts.keys:
        return f"the model's own window ({facts.model_window}) is shorter than the keys"
    if facts.gradients:
        return "a gradient flows through the attention"
    return None


def _step_blocker(config: FocusConfig, facts: CallFacts) -> str | None:
    if facts.traced:
        return "the routing logits are traced"
    return fast_path_blocker(config, facts)


def _pays(config: FocusConfig, facts: CallFacts) -> bool:
    routing_heads = facts.k_heads if config.route_queries == "kv_head" else facts.heads
    return sparse_step_pays(config.num_groups, config.top_k, routing_heads, facts.k_heads, facts.keys)


def _off_the_cpu(facts: CallFacts) -> str | None:
    return f"the native kernels run on the CPU, the call on {facts.device}" if facts.device != "cpu" else None


def _native_blocker(config: FocusConfig, facts: CallFacts) -> str | None:
    """Why the native kernels (the step and the prefill) cannot take the call, whatever the call."""
    if blocker := _off_the_cpu(facts):
        return blocker
    if config.num_groups > GROUP_BITS:
        return f"{config.num_groups} groups > {GROUP_BITS}"
    return None


def _indexer_step(config: FocusConfig, facts: CallFacts) -> str | None:
    if blocker := _pattern_blocker(facts):
        return blocker
    if config.dense_heads:
        return "dense heads (FocusConfig.dense_heads)"
    if not facts.index_current:
        return "the key codes are behind the cache"
    return None


def _indexer_prompt(config: FocusConfig, facts: CallFacts) -> str | None:
    if blocker := _pattern_blocker(facts):
        return blocker
    if config.dense_heads:
        return "dense heads (FocusConfig.dense_heads)"
    return None


def _indexer_native_prompt(config: FocusConfig, facts: CallFacts) -> str | None:
    if blocker := _indexer_prompt(config, facts):
        return blocker
    if facts.cache == "eager":
        return "the cache runs no native kernels (FocusCache(native=False))"
    if blocker := _off_the_cpu(facts):
        return blocker
    if not facts.has_native_kernels:
        return "the native kernels cannot be built here"
    return None


def _native_cache_step(facts: CallFacts) -> str | None:
    """Why no native step (the groups' or the indexer's) can take the call, whatever routes it."""
    if facts.cache != "native":
        return "the cache runs no native kernels (FocusCache(native=False))"
    return _off_the_cpu(facts)


def _indexer_native_step(config: FocusConfig, facts: CallFacts) -> str | None:
    return _indexer_step(config, facts) or _native_cache_step(facts)


def _native_step(config: FocusConfig, facts: CallFacts) -> str | None:
    if blocker := _step_blocker(config, facts) or _native_cache_step(facts):
        return blocker
    if blocker := _native_blocker(config, facts):
        return blocker
    if not facts.index_current:
        return "the index is cropped or a row's sink tokens are not all seen"
    if facts.keys >= NATIVE_STEP_BELOW and _pays(config, facts):
        return (f"{facts.keys} keys >= {NATIVE_STEP_BELOW}, beyond the longest cache it was measured to beat the "
                "sparse step at, and the sparse step pays")
    return None


def _masked_step(config: FocusConfig, facts: CallFacts) -> str | None:
    if blocker := _step_blocker(config, facts):
        return blocker
    if config.num_groups > GROUP_BITS:
        return f"{config.num_groups} groups > {GROUP_BITS}: no group bits"
    if _pays(config, facts):
        return (f"{facts.keys} keys: the sparse step pays, by the step cost model fitted on a 2-core CPU "
                "(docs/decoding.md)")
    return None


def _sparse_step(config: FocusConfig, facts: CallFacts) -> str | None:
    return _step_blocker(config, facts)


def _whole_sequence(config: FocusConfig, facts: CallFacts) -> str | None:
    if blocker := fast_path_blocker(config, facts):
        return blocker
    if facts.queries != facts.keys:
        return "queries after a cached past (the decomposition takes whole sequences)"
    return None


def _decomposed_native(config: FocusConfig, facts: CallFacts) -> str | None:
    if blocker := _whole_sequence(config, facts):
        return blocker
    if facts.cache != "native":
        return "not a native FocusCache's prompt"
    if facts.fast_path != "auto":
        return f"the fast-path switch is {facts.fast_path!r}"
    if blocker := _native_blocker(config, facts):
        return blocker
    if facts.traced:
        return "the routing logits are traced"
    if config.route_queries == "key":
        return "queries routed by their keys (route_queries='key')"
    if facts.head_dim > NATIVE_MAX_DIM:
        return f"head size {facts.head_dim} > {NATIVE_MAX_DIM}"
    if not facts.left_padded:
        return "padding not only on the left"
    return None


def _decomposed_native_on_matrix_units(config: FocusConfig, facts: CallFacts) -> str | None:
    if blocker := _decomposed_native(config, facts):
        return blocker
    if not facts.has_matrix_units:
        return "no bfloat16 matrix units (AMX) on this CPU, or `use_matrix_units(False)`"
    if facts.head_dim % 2:
        return f"head size {facts.head_dim} is odd (the matrix units take pairs of bfloat16)"
    return None


def _decomposed_flash(config: FocusConfig, facts: CallFacts) -> str | None:
    if blocker := _whole_sequence(config, facts):
        return blocker
    if facts.fast_path == "flash":
        return None  # pinned: the kernel fails in one line where flash-attn is missing
    if facts.fast_path == "torch":
        return "the fast-path switch is 'torch'"
    if facts.device != "cuda":
        return f"flash-attn runs on CUDA, the call on {facts.device}"
    if not facts.has_flash_attn:
        return "flash-attn is not installed"
    return None


def _decomposed_torch(config: FocusConfig, facts: CallFacts) -> str | None:
    return _whole_sequence(config, facts)


KERNEL_TABLE: tuple[Kernel, ...] = (
    Kernel("indexer_native_step", "the indexer's decoding step as one native CPU call: scores from the cached key "
           "codes, the top keys by a histogram and a partial sort, the kept keys attended in place",
           _indexer_native_step, "a native FocusCache's step of the indexer", runs.run_indexer_native_step,
           steps_only=True, selector="indexer"),
    Kernel("indexer_step", "a decoding step of the per-key indexer: every distant key scored from its cached code, the "
           "top ones gathered with the window and the sinks", _indexer_step, "the indexer's eager step",
           runs.run_indexer_step, steps_only=True, selector="indexer"),
    Kernel("indexer_native_prompt", "the indexer's prompt a block of queries at a time (every causal pair under "
           "the block's mask), each query's threshold by a native histogram", _indexer_native_prompt,
           "the indexer's prompt on the CPU", runs.run_indexer_native_prompt, selector="indexer"),
    Kernel("indexer_prompt", "the indexer's prompt a block of queries at a time, each query's threshold by topk",
           _indexer_prompt, "the indexer's prompt elsewhere", runs.run_indexer_prompt, selector="indexer"),
    Kernel("native_step", "a decoding step as one native CPU call: routing, index upkeep, the kept keys' attention",
           _native_step, "a native FocusCache's step on the CPU", runs.run_native_step, steps_only=True),
    Kernel("masked_step", "a decoding step over every cached key under the mask the index's group bits make",
           _masked_step, "a decoding step, below the sparse step's break-even", runs.run_masked_step, steps_only=True),
    Kernel("sparse_step", "a decoding step over the keys of the query's groups, read through the index's group lists",
           _sparse_step, "a decoding step through the group lists", runs.run_sparse_step, steps_only=True),
    Kernel("decomposed_native_amx", "decomposed_native with its bfloat16 rectangles on the CPU's matrix units (AMX)",
           _decomposed_native_on_matrix_units, "a native FocusCache's bfloat16 prompt on a CPU with AMX",
           runs.run_decomposed_native_amx, dtype="bfloat16"),
    Kernel("decomposed_native", "the query-routed decomposition as four native CPU calls (band, segments, "
           "rectangles, merge)", _decomposed_native, "a native FocusCache's prompt on the CPU, query-routed",
           runs.run_decomposed_native),
    Kernel("decomposed_flash", "the decomposition, every group segment in one flash-attn varlen call (CUDA)",
           _decomposed_flash, "a whole sequence through flash-attn (on CUDA where it is installed, or pinned)",
           runs.run_decomposed_flash),
    Kernel("decomposed_torch", "the decomposition (focus.attention.kernels.decomposed): a band and group segments, "
           "PyTorch kernels", _decomposed_torch, "a whole sequence", runs.run_decomposed_torch),
    Kernel("dense_masked", "PyTorch SDPA under the Focus mask over every pair (the oracle, "
           "`focus.attention.pattern.reference`)", lambda config, facts: None,
           "the reference, which computes every call", runs.run_dense_masked),
)
"""Every kernel of hard Focus, in the order the plan asks them."""


def choose_kernel(config: FocusConfig, facts: CallFacts) -> tuple[Kernel, tuple[tuple[str, str], ...]]:
    """The first row of `KERNEL_TABLE` that takes the call, and the (name, reason) of each row before it that declined
    (rows for decoding steps only, another selector or another dtype are not asked)."""
    declined = []
    for kernel in KERNEL_TABLE:
        if ((kernel.steps_only and not facts.decoding_step) or kernel.selector not in (None, config.selector)
                or kernel.dtype not in (None, facts.dtype)):
            continue
        reason = kernel.declines(config, facts)
        if reason is None:
            return kernel, tuple(declined)
        declined.append((kernel.name, reason))
    raise AssertionError("the dense masked kernel takes every call")


def kernel_row(name: str) -> Kernel:
    """The row of `KERNEL_TABLE` named `name` (a plan's kernel)."""
    return next(kernel for kernel in KERNEL_TABLE if kernel.name == name)
