#!/usr/bin/env bash
# Installs NVIDIA Resiliency Ext's straggler Detector into a virtual environment for the
# overhead benchmark, without letting pip touch torch:
#   - nvidia-resiliency-ext 0.4.1 (the newest wheel for CPython 3.11) with --no-deps,
#   - its runtime needs by hand, except pynvml (a deprecated shim whose import warning
#     torch then prints in every process; nvidia-ml-py provides the same module),
#   - nvidia-cuda-cupti-cu12, whose libcupti.so.12 lets its CUPTI extension load on a
#     machine without the CUDA toolkit (benchmarks/peers/nvrx.py preloads it).
# Usage: benchmarks/peers/install_nvrx.sh [PYTHON]   (default .venv/bin/python)
set -euo pipefail
PY=${1:-.venv/bin/python}
"$PY" -m pip install -q --no-deps "nvidia-resiliency-ext==0.4.1" "nvidia-cuda-cupti-cu12==12.9.79" \
  "defusedxml" "nvidia-ml-py>=12.570.86" "psutil>=6" "packaging" "pyyaml"
"$PY" -c "import torch, nvidia_resiliency_ext.straggler; print('nvidia-resiliency-ext ready, torch', torch.__version__)"
