"""One build of the native decoding step (`focus/attention/native/csrc/step.cpp`, or an older copy of it) on random
keys: its attention over the kept keys against SDPA over every key, one layer, 9/3 heads, top-1 and top-2 of 16 groups,
1-8K keys. Compares builds (compiler flags, source versions), not adapters: a trained adapter's groups are uneven.

    .venv/bin/python benchmarks/native_step_builds.py                                  # the package's build flags
    mkdir /tmp/old && git archive HEAD~3 focus/attention/native/csrc | tar -x -C /tmp/old --strip-components=4
    .venv/bin/python benchmarks/native_step_builds.py --sources /tmp/old/*.cpp --name old --flags -O3 -fopenmp-simd

(Copies from commits since the fused-kernel branch was dropped: older ones take a last `kept_only` argument.)

Prints one line per (top_k, keys): microseconds a call, the best of 3 runs of 300 calls each.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F
from torch.utils.cpp_extension import load

from focus.attention.native import build_settings, define_flags
from focus.attention.pattern.rule import group_bits


def best_microseconds(call, calls: int = 300) -> float:
    for _ in range(20):
        call()
    runs = []
    for _ in range(3):
        tic = time.perf_counter()
        for _ in range(calls):
            call()
        runs.append((time.perf_counter() - tic) / calls * 1e6)
    return min(runs)


def main() -> None:
    name, flags, sources = build_settings()
    defines = define_flags()  # the values the sources take from Python, whatever the other flags
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sources", nargs="+", default=sources)
    parser.add_argument("--name", default=name, help="extension name (one per build)")
    parser.add_argument("--flags", nargs="+", default=[flag for flag in flags if flag not in defines])
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    args = parser.parse_args()
    ext = load(name=args.name, sources=args.sources, extra_cflags=args.flags + defines, extra_ldflags=["-fopenmp"],
               verbose=False)
    dtype = getattr(torch, args.dtype)
    torch.manual_seed(0)
    b, heads, k_heads, d, groups, window = 1, 9, 3, 64, 16, 64
    with torch.no_grad():
        for top_k in (1, 2):
            for length in (1024, 2048, 4096, 8192):
                capacity = length + 64  # a cache with room to grow, as FocusCache's
                query = torch.randn(b, heads, 1, d, dtype=dtype)
                key, value = (torch.randn(b, k_heads, capacity, d, dtype=dtype)[:, :, :length] for _ in range(2))
                chosen = torch.rand(b, k_heads, capacity, groups).topk(top_k, dim=-1).indices
                bits, key_groups = group_bits(chosen), chosen.to(torch.int8)
                position = torch.tensor([[length - 1]])
                inv_freq = 1 / (10000 ** (torch.arange(0, d, 2).float() / d))
                panel = ext.router_panel(F.normalize(torch.randn(k_heads + heads, groups, d), dim=-1))
                bias = torch.zeros(k_heads + heads, groups)

                def step():  # noqa: B023 (timed at once, inside this iteration)
                    return ext.masked_step(query, key, value, key_groups, bits, position, inv_freq, panel, bias, None,
                                           None, 0.1, top_k, window, False, 1, None)

                sdpa = best_microseconds(lambda: F.scaled_dot_product_attention(query, key, value, enable_gqa=True))
                native = best_microseconds(step)
                print(f"{args.name} {args.dtype} top-{top_k} {length} keys: SDPA {sdpa:.0f} us, native step "
                      f"{native:.0f} us ({sdpa / native:.2f}x)", flush=True)


if __name__ == "__main__":
    main()
