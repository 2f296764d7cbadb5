#!/usr/bin/env bash
# One call of a GPU machine for the sizes study, within a time budget: benchmarks/gpu_sizes.py part by
# part (limits, decode and its profile, update, step), benchmarks/vs_trl.py at 0.5B and 1.5B on the same card
# (8 prompts x 8 samples x 256 new tokens, 3 steps, the first a warm-up), then the largest shape that
# trains full-parameter. A stage starts only while the budget lasts and is stopped at its end, so the
# call ends with its records copied to OUT. Resumes: the records live in /tmp/gpu_sizes_state on the
# machine (kept while it stays warm), seeded from benchmarks/results on a fresh machine; gpu_sizes skips
# what is recorded, and a size whose vs_trl result is recorded is skipped.
#   bash benchmarks/gpu_sizes_device.sh OUT COMMIT [BUDGET_S]   (on the GPU machine, .gpu_kit and .gpu_kit_bnb carried:
#   benchmarks/gpu_kit.sh --bitsandbytes gathers both; without .gpu_kit_bnb the largest part tries float32 state only)
set -uo pipefail
OUT=$1 COMMIT=$2 BUDGET_S=${3:-480}
export BENCHMARK_COMMIT=$COMMIT
cd "$(dirname "$0")/.."
deadline=$(($(date +%s) + BUDGET_S))
STATE=/tmp/gpu_sizes_state
mkdir -p "$STATE"
for f in benchmarks/results/gpu_sizes.json benchmarks/results/vs_trl_gpu_*.json; do
  [ -f "$f" ] && [ ! -f "$STATE/$(basename "$f")" ] && cp "$f" "$STATE/"
done
stage() {  # run "$@" if more than 30 s of the budget is left, stopped (with its children) at the budget's end
  local left=$((deadline - $(date +%s)))
  if [ "$left" -le 30 ]; then echo "not started, budget spent: $*" | tee -a "$OUT/gpu_sizes.log"; return; fi
  timeout -k 10 "$left" "$@" 2>&1 | grep --line-buffered -v "Loading weights\|Writing model" | tee -a "$OUT/gpu_sizes.log"
}
sizes() { stage bash benchmarks/gpu_run.sh gpu_sizes --tokenizer .gpu_kit/tokenizer --results "$STATE/gpu_sizes.json" \
  --commit "$COMMIT" --workdir /tmp/gpu_sizes "$@"; }
sizes --parts limits,decode,profile
sizes --parts update
sizes --parts step
for size in 0.5b 1.5b; do
  [ -f "$STATE/vs_trl_gpu_$size.json" ] && continue
  stage bash benchmarks/gpu_run.sh gpu_sizes --save-models /tmp/models --sizes "$size" --tokenizer .gpu_kit/tokenizer
  stage bash benchmarks/gpu_run.sh vs_trl --device cuda --model "/tmp/models/$size" --prompts 8 --steps 3 --repeats 1 \
    --max-new-tokens 256 --results "vs_trl_gpu_$size"
  cp "benchmarks/results/vs_trl_gpu_$size.json" "$STATE/" 2>/dev/null
done
sizes --parts largest
cp "$STATE"/*.json "$OUT/" 2>/dev/null
bash benchmarks/gpu_run.sh gpu_sizes --plot --results "$OUT/gpu_sizes.json" > /dev/null 2>&1
ls -la "$OUT"
