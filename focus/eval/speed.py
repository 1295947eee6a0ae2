"""Speed of hard Focus against full causal attention, both sides timed in the same process.

`attention_rows` times one attention layer (full causal SDPA, flash-attn where present, and the Focus
decomposition) across sequence lengths and (groups, window, top-k), with the pair-count ratio as the
theoretical limit. `prefill_rows` times a model's whole-prompt forward, unmodified against Focus hard.
"""

from __future__ import annotations

import itertools
import statistics
import threading
import time
from typing import Callable

import torch
import torch.nn.functional as F

from focus.attention.dispatch.facts import decomposition_backend
from focus.attention.kernels.decomposed import decomposed_hard_attention, pair_counts
from focus.attention.routers.routing import sink_keys


def parse_settings(values: list[str], fields: str = "groups:window:top_k") -> list[list[int]]:
    """Command-line settings such as "16:256:1" -> [[16, 256, 1]], each with as many integers as `fields` names."""
    parsed = []
    for value in values:
        parts = value.split(":")
        if len(parts) != fields.count(":") + 1 or not all(part.isdigit() for part in parts):
            raise ValueError(f"a setting is {fields} (integers), got {value!r}")
        parsed.append([int(part) for part in parts])
    return parsed


def median_seconds(call: Callable[[], object], repeats: int, device: torch.device) -> tuple[float, float]:
    """(median seconds over `repeats` after one warm-up call, peak memory in GiB above the start)."""
    call()
    times = []
    with _PeakMemory(device) as memory:
        for _ in range(repeats):
            _sync(device)
            tic = time.perf_counter()
            call()
            _sync(device)
            times.append(time.perf_counter() - tic)
    return statistics.median(times), memory.peak_gib


def interleaved_seconds(calls: list[Callable[[], object]], repeats: int, device: torch.device) -> list[float]:
    """Median seconds of each call over `repeats` rounds, the calls taking turns within a round (after one warm-up
    round). Taking turns keeps slow drifts of a shared machine out of the ratios, and times each call with the caches
    as the others left them, as a layer finds them in a model, not warmed by its own previous run."""
    times: list[list[float]] = [[] for _ in calls]
    for round_ in range(repeats + 1):
        for call, measured in zip(calls, times):
            _sync(device)
            tic = time.perf_counter()
            call()
            _sync(device)
            if round_:
                measured.append(time.perf_counter() - tic)
    return [statistics.median(measured) for measured in times]


def balanced_groups(length: int, num_groups: int, top_k: int, heads: int, seed: int = 0) -> torch.Tensor:
    """(1, heads, L, top_k) distinct random groups per token, uniform over groups (balanced in expectation)."""
    scores = torch.rand(1, heads, length, num_groups, generator=torch.Generator().manual_seed(seed))
    return scores.topk(top_k, dim=-1).indices


def attention_rows(
    lengths: list[int],
    settings: list[tuple[int, int, int]],
    heads: int = 1,
    head_dim: int = 64,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    repeats: int = 3,
    sink_tokens: int = 1,
    progress: Callable[[str], None] = print,
    routings: tuple[str, ...] = ("key",),
) -> list[dict]:
    """One row per (length, (groups, window, top_k), routing): medians of full causal SDPA, flash-attn (CUDA, if
    installed) and the Focus decomposition, the measured and theoretical (pair-count) ratios, peak memory.

    routings: "key" (a query takes its token's groups) and/or "query" (every query its own groups, drawn
    independently: `route_queries="query"`)."""
    device = torch.device(device)
    rows = []
    backend = decomposition_backend(torch.device(device).type)
    for length in lengths:
        gen = torch.Generator().manual_seed(length)
        q, k, v = (torch.randn(1, heads, length, head_dim, generator=gen).to(device, dtype) for _ in range(3))
        full_s, full_mem = median_seconds(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), repeats,
                                          device)
        flash_s = _flash_seconds(q, k, v, repeats, device)
        for (num_groups, window, top_k), routing in itertools.product(settings, routings):
            groups = balanced_groups(length, num_groups, top_k, heads).to(device)
            query_groups = balanced_groups(length, num_groups, top_k, heads, seed=1).to(device) if routing == "query" else None
            sinks = sink_keys(None, length, sink_tokens, device) if sink_tokens else None
            focus_s, focus_mem = median_seconds(
                lambda: decomposed_hard_attention(q, k, v, groups, window, None, sinks, backend=backend,
                                                  query_groups=query_groups),
                repeats, device,
            )
            full_pairs, focus_pairs = pair_counts(length, window, groups[0, 0].cpu(), sink_tokens,
                                                  None if query_groups is None else query_groups[0, 0].cpu())
            row = {
                "length": length, "heads": heads, "head_dim": head_dim, "dtype": str(dtype).removeprefix("torch."),
                "groups": num_groups, "window": window, "top_k": top_k, "routing": routing,
                "backend": backend,
                "full_sdpa_s": full_s, "flash_attn_s": flash_s, "focus_s": focus_s,
                "speedup": full_s / focus_s, "theoretical": full_pairs / focus_pairs,
                "full_peak_gib": full_mem, "focus_peak_gib": focus_mem,
            }
            row["of_theoretical"] = row["speedup"] / row["theoretical"]
            rows.append(row)
            progress(f"L={length:>7} G={num_groups} w={window} k={top_k} {routing}: full {full_s:.3f}s focus {focus_s:.3f}s "
                     f"-> {row['speedup']:.2f}x (pairs {row['theoretical']:.2f}x)")
    return rows


def prefill_rows(
    model,
    focus_settings: list[tuple[int, int, int]],
    lengths: list[int],
    repeats: int = 2,
    progress: Callable[[str], None] = print,
    routings: tuple[str, ...] = ("key",),
) -> list[dict]:
    """Whole-prompt forward of `model` (random token ids, no KV cache, logits of the last token only):
    unmodified against Focus hard top-k for each (groups, window, top_k) and routing: "key" is the old default
    (`route_queries="key"`, rotary kept), "query" today's (`route_queries="query"`, rotary undone), "kv_head" the
    query heads of a key/value head routed together (rotary undone). Focus is
    applied with random-token k-means centroids (speed does not depend on training) and removed again afterwards."""
    from focus.config import FocusConfig
    from focus.retrofit import apply_focus, remove_focus

    device = next(model.parameters()).device
    limit = getattr(model.config.get_text_config(), "max_position_embeddings", None)
    rows = []
    for length in lengths:
        beyond = limit is not None and length > limit
        if beyond:  # on purpose: speed does not depend on what the positions mean
            progress(f"prefill L={length}: beyond the model's {limit} positions, timed for speed only (its outputs "
                     "there are meaningless)")
        ids = torch.randint(0, model.config.vocab_size, (1, length), generator=torch.Generator().manual_seed(0))
        ids = ids.to(device)

        def forward():
            with torch.no_grad():
                return model(input_ids=ids, use_cache=False, logits_to_keep=1)

        base_s, base_mem = median_seconds(forward, repeats, device)
        for (num_groups, window, top_k), routing in itertools.product(focus_settings, routings):
            config = FocusConfig(num_groups=num_groups, window=window, top_k=top_k, mode="hard", route_queries=routing,
                                 unrotate=routing != "key")
            apply_focus(model, config, calibration_ids=ids[:, :512])
            try:
                focus_s, focus_mem = median_seconds(forward, repeats, device)
            finally:
                remove_focus(model)
            rows.append({"length": length, "beyond_position_limit": beyond, "groups": num_groups, "window": window,
                         "top_k": top_k, "routing": routing,
                         "unmodified_s": base_s, "focus_s": focus_s, "speedup": base_s / focus_s,
                         "unmodified_peak_gib": base_mem, "focus_peak_gib": focus_mem})
            progress(f"prefill L={length}: unmodified {base_s:.2f}s focus(G={num_groups} w={window} k={top_k} "
                     f"{routing}) {focus_s:.2f}s -> {base_s / focus_s:.2f}x")
    return rows


def _flash_seconds(q, k, v, repeats, device) -> float | None:
    if device.type != "cuda":
        return None
    try:
        from flash_attn import flash_attn_func
    except ImportError:
        return None
    qf, kf, vf = (t.transpose(1, 2).to(torch.bfloat16) for t in (q, k, v))  # flash-attn wants (B, L, H, D)
    return median_seconds(lambda: flash_attn_func(qf, kf, vf, causal=True), repeats, device)[0]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class _PeakMemory:
    """Peak memory above the start of the block: CUDA allocator stats, or the process RSS sampled every 2 ms
    on CPU (torch's CPU allocator keeps no statistics)."""

    def __init__(self, device: torch.device):
        self.device, self.peak_gib = device, 0.0

    def __enter__(self):
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
            self._start = torch.cuda.memory_allocated(self.device)
        else:
            self._start, self._peak, self._stop = _rss(), _rss(), threading.Event()
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def _sample(self):
        while not self._stop.wait(0.002):
            self._peak = max(self._peak, _rss())

    def __exit__(self, *exc):
        if self.device.type == "cuda":
            peak = torch.cuda.max_memory_allocated(self.device)
        else:
            self._stop.set()
            self._thread.join()
            peak = self._peak
        self.peak_gib = max(0, peak - self._start) / 2**30


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096
