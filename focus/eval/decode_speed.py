"""Speed of Focus decoding through the cache's group index against full attention over the cache, both sides timed
in one process.

`decode_step_rows` times one attention layer's decoding step (a query token against a cache of L keys): SDPA over
the whole cache against `sparse_decode_attention`, with the pair-count limit (cached keys / keys the step reads).
`generate_rows` times a model's greedy decoding after a prompt: the unmodified model (DynamicCache, SDPA) against
Focus hard through a `FocusCache`, in decoded tokens per second.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Iterator
from typing import Callable

import torch
import torch.nn.functional as F

from focus.attention.cache.decoding import FocusCache, masked_decode_attention, sparse_decode_attention
from focus.attention.cache.group_index import GroupIndex
from focus.eval.speed import balanced_groups, interleaved_seconds


def decode_step_rows(
    cache_lengths: list[int],
    settings: list[tuple[int, int, int]],
    head_layouts: list[tuple[int, int]],
    head_dim: int = 64,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    repeats: int = 5,
    sink_tokens: int = 1,
    progress: Callable[[str], None] = print,
    routings: tuple[str, ...] = ("query",),
    native: bool = False,
) -> list[dict]:
    """One row per (cache length, (groups, window, top_k), (query heads, key/value heads), routing): the median seconds
    of one decoding step, full SDPA over the cache against the sparse step and the masked step (taking turns), their
    ratios, the pair-count limit (cached keys over keys a query head reads), the read limit (key/value rows each side
    reads) and the index's size against the cache's. Groups are random and balanced, as trained groups are in
    expectation. Routing "query": each query head has groups of its own; "kv_head": the query heads of a key/value
    head share theirs (`FocusConfig.route_queries`), so the sparse step reads them once. `native`: also the
    step as one native call, routing and index upkeep included (`focus.attention.native`; CPU only)."""
    device = torch.device(device)
    rows = []
    for length, (heads, k_heads) in ((n, layout) for n in cache_lengths for layout in head_layouts):
        gen = torch.Generator().manual_seed(length)
        q = torch.randn(1, heads, 1, head_dim, generator=gen).to(device, dtype)
        key, value = (torch.randn(1, k_heads, length, head_dim, generator=gen).to(device, dtype) for _ in range(2))
        for (num_groups, window, top_k), routing in ((s, r) for s in settings for r in routings):
            index = GroupIndex(1, k_heads, num_groups, top_k, sink_tokens, device)
            index.extend(balanced_groups(length, num_groups, top_k, k_heads).to(device), None)
            routed = heads if routing == "query" else k_heads
            step_groups = balanced_groups(1, num_groups, top_k, routed, seed=1)[:, :, 0].to(device)  # (1, H or K, k)
            query_groups = step_groups.repeat_interleave(heads // routed, dim=1)  # (1, H, top_k)
            steps = [
                lambda: F.scaled_dot_product_attention(q, key, value, enable_gqa=True),
                lambda: sparse_decode_attention(q, key, value, index, step_groups, window, None, None),
                lambda: masked_decode_attention(q, key, value, index, query_groups, window, None, None),
            ]
            if native:
                steps.append(_native_masked_step(q, key, value, index, window, routing))
            full_s, focus_s, masked_s, *native_s = interleaved_seconds(steps, repeats, device)
            read = keys_read(index, query_groups, window, length)
            row = {
                "cache": length, "heads": heads, "kv_heads": k_heads, "head_dim": head_dim,
                "dtype": str(dtype).removeprefix("torch."), "groups": num_groups, "window": window, "top_k": top_k,
                "routing": routing,
                "full_s": full_s, "focus_s": focus_s, "speedup": full_s / focus_s,
                # The same step under the hard mask over every key (what FocusCache runs where lists do not pay).
                "masked_s": masked_s, "masked_speedup": full_s / masked_s, "pair_limit": length / read,
                # Full attention reads each key/value head's rows once for its query heads; the sparse step reads
                # each routing head's own rows: with grouped-query attention, the bound the bytes set.
                "read_limit": k_heads * length / (routed * read),
                "index_share": index_share(index, key, value),
            }
            row["of_limit"] = row["speedup"] / row["pair_limit"]
            if native:  # the native step routes the token itself and writes its groups over the last key's
                row["native_s"], row["native_speedup"] = native_s[0], full_s / native_s[0]
            rows.append(row)
            progress(f"cache={length:>6} H={heads}/{k_heads} G={num_groups} w={window} k={top_k} {routing}: full "
                     f"{full_s * 1e3:.2f} ms focus {focus_s * 1e3:.2f} ms -> {row['speedup']:.2f}x "
                     f"(pairs {row['pair_limit']:.2f}x)")
    return rows


def _native_masked_step(q, key, value, index: GroupIndex, window: int, routing: str) -> Callable[[], torch.Tensor]:
    """The native step (`focus.attention.native`) of this row, with random unit centroids: its routing work is
    the same whichever groups it picks."""
    from focus.attention.native import ROUTE_QUERIES, kernels

    b, heads, _, d = q.shape
    k_heads, length = key.shape[1], key.shape[2]
    gen = torch.Generator().manual_seed(0)
    unit = F.normalize(torch.randn(k_heads + heads, index.num_groups, d, generator=gen), dim=-1)
    bias = torch.zeros(k_heads + heads, index.num_groups)
    positions = torch.full((1, 1), length - 1)
    inv_freq = 1.0 / 10000 ** (torch.arange(0, d, 2).float() / d)
    panel, step = kernels().router_panel(unit), kernels().masked_step
    return lambda: step(q, key, value, index.key_groups, index.key_bits, positions, inv_freq, panel, bias, None, None,
                        0.1, index.top_k, window, False, ROUTE_QUERIES[routing], None)


def keys_read(index: GroupIndex, query_groups: torch.Tensor, window: int, length: int) -> float:
    """Mean over query heads of the keys a step attends to: the window, the sinks before it, and the distinct
    distant keys of the query's groups."""
    k_heads = index.counts.shape[1]
    r = query_groups.shape[1] // k_heads
    groups = index.groups()[0]  # (K, L, top_k)
    start = max(length - window, 0)
    total = 0
    for head in range(query_groups.shape[1]):
        wanted = torch.isin(groups[head // r, :start], query_groups[0, head]).any(dim=-1)  # (start,)
        wanted[: int(index.sink_last[0]) + 1] = True  # the sinks: every group
        total += min(length, window) + int(wanted.sum())
    return total / query_groups.shape[1]


def index_share(index: GroupIndex, key: torch.Tensor, value: torch.Tensor) -> float:
    """The index's bytes (growth headroom included) over the bytes of the keys and values it indexes."""
    return index.nbytes() / (key.numel() * key.element_size() + value.numel() * value.element_size())


@torch.no_grad()
def generate_rows(
    model,
    prompt_lengths: list[int],
    focus_settings: list[tuple[int, int, int]],
    new_tokens: int = 32,
    progress: Callable[[str], None] = print,
    adapter: str | None = None,
    prompt_ids: torch.Tensor | None = None,
    native: bool | None = None,
    rounds: int = 3,
) -> list[dict]:
    """Greedy decoding of `new_tokens` after a prompt, per (groups, window, top_k): Focus hard through a
    FocusCache against the unmodified model through a GrowingCache (the same in-place cache without Focus: the ratio
    is what Focus saves) and through transformers' DynamicCache (what a user has by default; it copies the whole
    cache at every step). Prefill is timed apart; tokens per second count decoding alone.

    Focus is a trained `adapter` (its groups; window and top-k as the setting asks) or, without one, k-means
    centroids of the prompt's first tokens; removed afterwards. Prompts are the first tokens of `prompt_ids` (1, N),
    or random tokens. Trained groups are less balanced than k-means groups of random tokens, and a step reads its
    groups' keys: each row reports the balance the index saw (`group_balance`: largest over mean group, median over
    layers and key/value heads). `native`: the FocusCache's kernels (`FocusCache(model, native=...)`; None: the
    library's default, native on the CPU where they build; built before the timing starts). Per setting, the
    unmodified model and Focus decode `rounds` times each, taking turns from the same prompt state, and each side
    reports its median."""
    from transformers import DynamicCache

    from focus.attention.cache.growing_cache import GrowingCache
    from focus.retrofit import remove_focus

    device = next(model.parameters()).device
    if native is not False and device.type == "cpu":
        from focus.attention.native import kernels_built

        kernels_built(required=bool(native))  # built (or loaded) here, not inside the first timed step
    limit = getattr(model.config.get_text_config(), "max_position_embeddings", None)
    rows = []
    for length in prompt_lengths:
        if prompt_ids is None:
            seeded = torch.Generator().manual_seed(length)
            ids = torch.randint(0, model.config.vocab_size, (1, length), generator=seeded)
        else:
            if prompt_ids.shape[1] < length:
                raise ValueError(f"a {length}-token prompt needs {length} tokens of text; {prompt_ids.shape[1]} given")
            ids = prompt_ids[:, :length]
        ids = ids.to(device)
        dynamic = DynamicCache(config=model.config)
        logits = _prefill(model, ids, dynamic)[1]
        growing = GrowingCache(config=model.config)
        for layer_idx, layer in enumerate(dynamic.layers):  # the same prompt state, appended to in place
            growing.update(layer.keys.clone(), layer.values.clone(), layer_idx)
        dynamic_decode = _decode_seconds(model, logits, new_tokens, dynamic)
        short = GrowingCache(config=model.config)
        short_decode = _decode_seconds(model, _prefill(model, ids[:, :16], short)[1], new_tokens, short)
        for setting in focus_settings:
            num_groups, window, top_k = _attach_focus(model, setting, adapter, ids)
            try:
                # Prefills in turns too, each side into a fresh in-place cache: `rounds` of each, medians. The last
                # Focus prefill's cache is the one decoded from.
                # Each timing's attention-only part beside it: the seconds inside the attention functions.
                base_prefills, focus_prefills, base_attention, focus_attention = [], [], [], []
                with attention_clock() as clock:
                    for _ in range(rounds):
                        remove_focus(model)
                        base_prefills.append(_prefill(model, ids, GrowingCache(config=model.config))[0])
                        base_attention.append(_lap(clock))
                        _attach_focus(model, setting, adapter, ids)
                        cache = FocusCache(model, native=native)
                        seconds, focus_logits = _prefill(model, ids, cache)
                        focus_prefills.append(seconds)
                        focus_attention.append(_lap(clock))
                    base_prefill, focus_prefill, base_prefill_attention, focus_prefill_attention = map(
                        _median, (base_prefills, focus_prefills, base_attention, focus_attention))
                    # Both sides take turns, round after round, from the same prompt state (each cache cropped back
                    # after its round): a drift in the machine's speed reaches both alike.
                    base_times, focus_times, base_attention, focus_attention = [], [], [], []
                    for _ in range(rounds):
                        focus_times.append(_decode_seconds(model, focus_logits, new_tokens, cache))
                        focus_attention.append(_lap(clock))
                        cache.crop(-new_tokens)
                        remove_focus(model)
                        base_times.append(_decode_seconds(model, logits, new_tokens, growing))
                        base_attention.append(_lap(clock))
                        growing.crop(-new_tokens)
                        _attach_focus(model, setting, adapter, ids)
                base_decode, focus_decode, base_decode_attention, focus_decode_attention = map(
                    _median, (base_times, focus_times, base_attention, focus_attention))
                share = cache.index_nbytes() / sum(
                    layer.keys.numel() * layer.keys.element_size() * 2 for layer in cache.layers if layer.is_initialized
                )
                balance = group_balance(cache)
            finally:
                remove_focus(model)
            row = {
                "prompt": length, "new_tokens": new_tokens, "groups": num_groups, "window": window, "top_k": top_k,
                "beyond_position_limit": limit is not None and length + new_tokens > limit,
                "unmodified_tok_s": new_tokens / base_decode, "focus_tok_s": new_tokens / focus_decode,
                "decode_speedup": base_decode / focus_decode,
                "unmodified_dynamic_cache_tok_s": new_tokens / dynamic_decode,
                "speedup_over_dynamic_cache": dynamic_decode / focus_decode,
                # The unmodified step's time beyond a 16-token prompt's is (about) its attention over the cache.
                "attention_share": max(0.0, 1 - short_decode / base_decode),
                "unmodified_prefill_s": base_prefill, "focus_prefill_s": focus_prefill,
                "prefill_speedup": base_prefill / focus_prefill, "index_share": share,
                "unmodified_prefill_attention_s": base_prefill_attention,
                "focus_prefill_attention_s": focus_prefill_attention,
                "prefill_attention_speedup": base_prefill_attention / focus_prefill_attention,
                "unmodified_decode_attention_s": base_decode_attention,
                "focus_decode_attention_s": focus_decode_attention,
                "decode_attention_speedup": base_decode_attention / focus_decode_attention,
                "adapter": "" if adapter is None else str(adapter), "group_balance": balance,
                "native": cache.native,
            }
            rows.append(row)
            progress(f"prompt={length:>6} G={num_groups} w={window} k={top_k}: unmodified "
                     f"{row['unmodified_tok_s']:.1f} tok/s ({row['unmodified_dynamic_cache_tok_s']:.1f} with "
                     f"DynamicCache), focus {row['focus_tok_s']:.1f} tok/s -> {row['decode_speedup']:.2f}x "
                     f"(attention {row['attention_share']:.0%} of the unmodified step)")
    return rows


def _attach_focus(model, setting: tuple[int, int, int], adapter: str | None, ids: torch.Tensor) -> tuple[int, int, int]:
    """Focus hard on `model` for `setting` (groups, window, top_k): the trained `adapter` (its groups), or k-means
    centroids of the prompt `ids`' first tokens (the same centroids at every call); returns the setting applied."""
    from focus.adapter import load_focus
    from focus.config import FocusConfig
    from focus.retrofit import apply_focus, focus_config, set_focus_mode

    num_groups, window, top_k = setting
    if adapter is not None:
        load_focus(model, adapter)
        set_focus_mode(model, "hard", window=window, top_k=top_k)
    else:  # the prompt's own tokens: no warning
        apply_focus(model, FocusConfig(num_groups=num_groups, window=window, top_k=top_k, mode="hard"),
                    calibration_ids=ids[:, :512])
    return focus_config(model).num_groups, window, top_k


def group_balance(cache: FocusCache) -> float:
    """Largest group over the mean group of the keys a FocusCache indexed, median over layers and key/value heads
    (1.0: balanced)."""
    counts = [index.counts.double() for index in cache.indexes.values()]  # (B, K, G) each
    ratios = [(c.amax(dim=-1) / c.mean(dim=-1).clamp_min(1e-9)).flatten() for c in counts]
    return float(torch.cat(ratios).median()) if ratios else float("nan")


def _median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


def _lap(clock: dict) -> float:
    """The attention seconds `clock` (`attention_clock`) counted since the last lap."""
    lap = clock["seconds"] - clock.get("lapped", 0.0)
    clock["lapped"] = clock["seconds"]
    return lap


@contextlib.contextmanager
def attention_clock() -> Iterator[dict]:
    """Within the block, the seconds spent inside the attention functions transformers calls (SDPA, eager, Focus)
    add up in the yielded dict's "seconds": a model's attention-only time, routing and index upkeep included. The
    CPU's clock (no device synchronisation): for CPU timings."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    clock = {"seconds": 0.0}

    def timed(function):
        @functools.wraps(function)
        def call(*args, **kwargs):
            tic = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                clock["seconds"] += time.perf_counter() - tic
        return call

    names = [name for name in ALL_ATTENTION_FUNCTIONS if name in ("sdpa", "eager", "focus")]
    overridden = {name: ALL_ATTENTION_FUNCTIONS._local_mapping[name] for name in names
                  if name in ALL_ATTENTION_FUNCTIONS._local_mapping}  # restored as they were, not dropped
    for name in names:
        ALL_ATTENTION_FUNCTIONS[name] = timed(ALL_ATTENTION_FUNCTIONS[name])  # a local override of the global entry
    try:
        yield clock
    finally:
        for name in names:
            del ALL_ATTENTION_FUNCTIONS[name]
        for name, function in overridden.items():
            ALL_ATTENTION_FUNCTIONS[name] = function


def _prefill(model, ids: torch.Tensor, cache) -> tuple[float, torch.Tensor]:
    """(seconds, last logits) of the prompt's forward into `cache`."""
    tic = time.perf_counter()
    logits = model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1).logits
    _sync(ids.device)
    return time.perf_counter() - tic, logits


def _decode_seconds(model, logits: torch.Tensor, new_tokens: int, cache) -> float:
    """Seconds of `new_tokens` greedy steps through `cache`, from the prompt's last `logits`."""
    tic = time.perf_counter()
    for _ in range(new_tokens):
        token = logits[:, -1:].argmax(dim=-1)
        logits = model(input_ids=token, past_key_values=cache, use_cache=True).logits
    _sync(logits.device)
    return time.perf_counter() - tic


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
