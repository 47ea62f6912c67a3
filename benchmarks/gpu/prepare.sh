#!/usr/bin/env bash
# Stages what benchmarks/gpu/check.sh needs on a GPU machine that cannot download
# anything, under build/gpu-carry/ (ignored by git; pass it along, e.g. as a carried path):
#   eigen3/Eigen   the Eigen headers csrc/core includes (header-only)
#   whl/           NVIDIA Resiliency Ext 0.4.1 and libcupti.so.12 for CPython 3.12, the
#                  Python of the GPU image (the peer is skipped if they do not load there)
# Usage: benchmarks/gpu/prepare.sh [PYTHON_VERSION]   (default 3.12)
set -euo pipefail
cd "$(dirname "$0")/../.."
PYVER=${1:-3.12}
CARRY=build/gpu-carry
rm -rf "$CARRY"
mkdir -p "$CARRY/eigen3" "$CARRY/whl"
cp -r /usr/include/eigen3/Eigen "$CARRY/eigen3/"
PIP=(.venv/bin/python -m pip download -q --no-deps --only-binary=:all: --python-version "$PYVER"
     --implementation cp --platform manylinux_2_31_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_25_x86_64
     --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
     --platform any -d "$CARRY/whl")
"${PIP[@]}" "nvidia-resiliency-ext==0.4.1" "nvidia-cuda-cupti-cu12==12.9.79" "defusedxml"
du -sh "$CARRY"
