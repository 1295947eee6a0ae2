"""FlexAttention executing Focus's hard pattern against the project's kernels and dense SDPA (issue 47, part 2).

    .venv/bin/python benchmarks/flex_attention.py --lengths 2048 4096 8192 16384 --repeats 3

One SmolLM2-shaped layer (9 query heads, 3 key/value heads of 64), float32, random balanced groups (top-2 of 16, each
query head its own: `route_queries="query"`), window 128, one sink. Per prompt length, in turns (medians of
`--repeats` rounds after a warm-up round, `focus.eval.speed.interleaved_seconds`):
- `sdpa`: dense causal attention (`scaled_dot_product_attention`, grouped-query heads), what the unmodified model runs;
- `flex`: `focus.attention.kernels.flex.flex_hard_attention`, compiled, under the pattern's `BlockMask` (built outside
  the timing; `mask_s` is its build, once per layer and prompt in a model);
- `native`: the decomposition's native backend (what a FocusCache prefill runs on the CPU);
- `torch`: the decomposition's PyTorch backend (what a prompt without a cache runs).
And one decoding step over the same keys: dense SDPA, the native step (routing and index upkeep included), FlexAttention
with a one-query BlockMask. `density`: the share of causal 128 x 128 blocks FlexAttention computes; `kept`: the share
of causal pairs the pattern keeps. Written to <out>/flex_attention.{csv,md} after every length (rule microbenchmark:
`snakemake results/speed/bench/flex_attention.csv --configfile configs/speed.yaml`).
"""

from __future__ import annotations

import argparse
import platform
import time
from pathlib import Path

import pandas as pd
import torch

from focus.artifacts import markdown_table
from focus.attention.kernels.decomposed import decomposed_hard_attention
from focus.attention.kernels.flex import block_density, flex_hard_attention, focus_block_mask
from focus.eval.decode_speed import decode_step_rows
from focus.eval.speed import balanced_groups, interleaved_seconds
from focus.files import write_text

HEADS, K_HEADS, DIM, GROUPS, TOP_K, WINDOW = 9, 3, 64, 16, 2, 128


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[2048, 4096, 8192, 16384])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--torch-up-to", type=int, default=8192, help="the eager decomposition only up to this length")
    parser.add_argument("--out", default="benchmarks/results", help="the folder of flex_attention.{csv,md}")
    args = parser.parse_args()
    device = torch.device("cpu")
    # Every length compiles its own kernels (a prefill and a one-query step): past dynamo's default of 8 recompiles a
    # call would fall back to the unfused reference, which materialises every score (and runs out of memory at 16K).
    torch._dynamo.config.recompile_limit = 64
    torch.set_grad_enabled(False)  # the compile and the timed calls alike: a change of grad mode recompiles
    rows = []
    for length in args.lengths:
        rows.append(_prefill(length, args.repeats, device, with_torch=length <= args.torch_up_to))
        print(rows[-1], flush=True)
        rows.append(_decoding_step(length, args.repeats, device))
        print(rows[-1], flush=True)
        frame = pd.DataFrame(rows)
        write_text(Path(args.out) / "flex_attention.csv", frame.to_csv(index=False))
        write_text(Path(args.out) / "flex_attention.md", f"{_setting(args)}\n\n{markdown_table(frame, '.3g')}\n")


def _prefill(length: int, repeats: int, device: torch.device, with_torch: bool) -> dict:
    """A prompt of `length` tokens: dense SDPA, FlexAttention, the native and (`with_torch`) the eager decomposition, in
    turns; the BlockMask's build and the compile of this shape timed apart."""
    gen = torch.Generator().manual_seed(length)
    query = torch.randn(1, HEADS, length, DIM, generator=gen)
    key, value = (torch.randn(1, K_HEADS, length, DIM, generator=gen) for _ in range(2))
    key_groups = balanced_groups(length, GROUPS, TOP_K, K_HEADS)  # (1, K, L, k)
    query_groups = balanced_groups(length, GROUPS, TOP_K, HEADS, seed=1)  # (1, H, L, k)
    sinks = torch.zeros(1, length, dtype=torch.bool)
    sinks[0, 0] = True
    tic = time.perf_counter()
    mask = focus_block_mask(query_groups, key_groups, WINDOW, None, sinks, heads=HEADS)
    mask_s = time.perf_counter() - tic
    calls = {
        "sdpa": lambda: torch.nn.functional.scaled_dot_product_attention(query, key, value, is_causal=True,
                                                                        enable_gqa=True),
        "flex": lambda: flex_hard_attention(query, key, value, mask),
        "native": lambda: decomposed_hard_attention(query, key, value, key_groups, WINDOW, None, sinks,
                                                    backend="native", query_groups=query_groups),
    }
    if with_torch:
        calls["torch"] = lambda: decomposed_hard_attention(query, key, value, key_groups, WINDOW, None, sinks,
                                                           backend="torch", query_groups=query_groups)
    tic = time.perf_counter()
    calls["flex"]()  # the compile of this shape, outside the timing
    compile_s = time.perf_counter() - tic
    seconds = dict(zip(calls, interleaved_seconds(list(calls.values()), repeats, device)))
    row = {"phase": "prefill", "length": length, **{f"{name}_s": s for name, s in seconds.items()},
           "mask_s": mask_s, "compile_s": compile_s, "density": block_density(mask),
           "kept": _kept(query_groups, key_groups, length)}
    row.update({f"{name}_speedup": seconds["sdpa"] / s for name, s in seconds.items() if name != "sdpa"})
    return row


def _decoding_step(length: int, repeats: int, device: torch.device) -> dict:
    """One decoding step over `length` keys: dense SDPA and the native step (`decode_step_rows`, in turns), then
    FlexAttention's one-query step on the same shapes (timed after them, medians too)."""
    step = decode_step_rows([length], [(GROUPS, WINDOW, TOP_K)], [(HEADS, K_HEADS)], DIM, repeats=repeats,
                            progress=lambda _: None, native=True)[0]
    gen = torch.Generator().manual_seed(length)
    query = torch.randn(1, HEADS, 1, DIM, generator=gen)
    key, value = (torch.randn(1, K_HEADS, length, DIM, generator=gen) for _ in range(2))
    key_groups = balanced_groups(length, GROUPS, TOP_K, K_HEADS)
    query_groups = balanced_groups(1, GROUPS, TOP_K, HEADS, seed=1)
    sinks = torch.zeros(1, length, dtype=torch.bool)
    sinks[0, 0] = True
    mask = focus_block_mask(query_groups, key_groups, WINDOW, None, sinks, heads=HEADS)
    flex_hard_attention(query, key, value, mask)  # the compile of this shape
    (flex_s,) = interleaved_seconds([lambda: flex_hard_attention(query, key, value, mask)], repeats, device)
    return {"phase": "decoding step", "length": length, "sdpa_s": step["full_s"], "native_s": step["native_s"],
            "flex_s": flex_s, "native_speedup": step["full_s"] / step["native_s"],
            "flex_speedup": step["full_s"] / flex_s,
            "density": block_density(mask, causal=False)}


def _kept(query_groups: torch.Tensor, key_groups: torch.Tensor, length: int) -> float:
    """The share of causal pairs kept, estimated on 512 query rows spread over the sequence (every key of each)."""
    rows = torch.linspace(0, length - 1, 512).long()
    q_bits = (1 << query_groups[0, :, rows]).sum(-1)  # (H, 512)
    k_bits = (1 << key_groups[0]).sum(-1).repeat_interleave(HEADS // K_HEADS, 0)  # (H, L)
    meet = (q_bits[:, :, None] & k_bits[:, None, :]) != 0
    position = torch.arange(length)
    causal = position[None, :] <= rows[:, None]
    keep = causal & (meet | (rows[:, None] - position[None, :] < WINDOW) | (position[None, :] == 0))
    return (keep.sum() / (causal.sum() * HEADS)).item()


def _cpu_name() -> str:
    try:
        line = next(x for x in Path("/proc/cpuinfo").read_text().splitlines() if x.startswith("model name"))
        return line.split(":", 1)[1].strip()
    except (OSError, StopIteration):
        return platform.processor() or "this CPU"


def _setting(args) -> str:
    return (f"FlexAttention (compiled) executing Focus's hard pattern against the project's kernels, one SmolLM2 "
            f"layer ({HEADS}/{K_HEADS} heads of {DIM}), float32, top-{TOP_K} of {GROUPS} random balanced groups per "
            f"query head, window {WINDOW}, one sink; torch {torch.__version__} on {_cpu_name()}"
            f" ({torch.get_num_threads()} threads), in turns, medians of {args.repeats}. Speedups against dense causal "
            f"SDPA over the same keys. `benchmarks/flex_attention.py --lengths {' '.join(map(str, args.lengths))}`.")


if __name__ == "__main__":
    main()
