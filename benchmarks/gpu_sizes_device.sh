#!/usr/bin/env bash
# One call of a GPU machine for the sizes study: benchmarks/gpu_sizes.py (every part), then
# benchmarks/vs_trl.py at 0.5B and 1.5B on the same card (8 prompts x 8 samples x 256 new tokens,
# 3 steps, the first a warm-up). Resumes: gpu_sizes skips the records already in
# benchmarks/results/gpu_sizes.json (copied to OUT first), and a size whose vs_trl result is
# already in benchmarks/results is skipped.
#   bash benchmarks/gpu_sizes_device.sh OUT COMMIT     (on the GPU machine, .gpu_kit carried)
set -uo pipefail
OUT=$1 COMMIT=$2
export BENCHMARK_COMMIT=$COMMIT
cd "$(dirname "$0")/.."
[ -f benchmarks/results/gpu_sizes.json ] && cp benchmarks/results/gpu_sizes.json "$OUT/gpu_sizes.json"
bash benchmarks/gpu_run.sh gpu_sizes --tokenizer .gpu_kit/tokenizer --results "$OUT/gpu_sizes.json" \
  --commit "$COMMIT" --workdir /tmp/gpu_sizes 2>&1 | grep -v "Loading weights\|Writing model" | tee -a "$OUT/gpu_sizes.log"
for size in 0.5b 1.5b; do
  [ -f "benchmarks/results/vs_trl_gpu_$size.json" ] && continue
  bash benchmarks/gpu_run.sh gpu_sizes --save-models /tmp/models --sizes "$size" --tokenizer .gpu_kit/tokenizer
  bash benchmarks/gpu_run.sh vs_trl --device cuda --model "/tmp/models/$size" --prompts 8 --steps 3 --repeats 1 \
    --max-new-tokens 256 --results "vs_trl_gpu_$size" 2>&1 | tail -40 >> "$OUT/vs_trl.log"
  cp "benchmarks/results/vs_trl_gpu_$size.json" "$OUT/" 2>/dev/null
done
ls -la "$OUT"
