#!/usr/bin/env bash
# The GPU data path, checked on the machine it runs on: each of the paper's four
# models (efficientnet_b0, resnet50, alexnet, gpt2_s) trains a few steps over the
# real DBLP transport on loopback (a server thread and 2 worker threads), on
# synthetic data of the real input shapes; CUDA when torch sees a GPU, else the
# CPU with a small batch. Prints device, parameters, step time and exchange time
# per model, and whether the worker staged the gradient through pinned memory
# (the CUDA path of dblp/transport/staging.py). Exit status 1 if any model failed.
#
# Usage:  bash scripts/gpu_check.sh [python -m dblp.train.gpucheck flags]
#   e.g.  bash scripts/gpu_check.sh --models resnet50 --steps 10 --batch 128
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-}
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
fi
exec env PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" "$PY" -m dblp.train.gpucheck "$@"
