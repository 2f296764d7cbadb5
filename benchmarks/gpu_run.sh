#!/usr/bin/env bash
# Run one benchmark on a GPU machine from a copy of this tree, with .gpu_kit/ carried beside it
# (benchmarks/gpu_kit.sh gathers it): installs the kit's wheels into /tmp/site once, then runs
# `python3 -m benchmarks.NAME ARGS...` with this tree's src/ on the path.
#   bash benchmarks/gpu_run.sh gpu_sizes --tokenizer .gpu_kit/tokenizer --results "$OUT/gpu_sizes.json" --commit SHA
#   bash benchmarks/gpu_run.sh pytest tests/integration/test_cuda.py   (the tests, with the same path)
set -euo pipefail
cd "$(dirname "$0")/.."
[ -d .gpu_kit/wheels ] || { echo "no .gpu_kit/wheels: run benchmarks/gpu_kit.sh and carry .gpu_kit" >&2; exit 2; }
if [ ! -f /tmp/site/.gpu_kit_installed ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpu_kit/wheels/*.whl
  touch /tmp/site/.gpu_kit_installed
fi
if [ -d .gpu_kit_bnb ] && [ ! -d /tmp/site/bitsandbytes ]; then  # carried beside the kit: 8-bit optimizer state
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .gpu_kit_bnb/*.whl
fi
export PYTHONPATH="/tmp/site:$PWD/src:$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
[ "$1" = pytest ] && exec python3 -m pytest -p no:cacheprovider "${@:2}"  # e.g. the CUDA tests first
exec python3 -m "benchmarks.$1" "${@:2}"
