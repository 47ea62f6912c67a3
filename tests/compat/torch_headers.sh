#!/usr/bin/env bash
# Compiles the collective layer and the stage timer against the C++ headers of older
# torch releases (syntax only), to check the RS_TORCH_AT_LEAST guards of TimedBackend
# and TimedWork. Downloads each release's wheel (no dependencies) into a cache folder
# and keeps only its include/ tree.
#
#   tests/compat/torch_headers.sh [VERSION ...]     (default: 2.4.0 ... 2.12.0)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cache=${TORCH_HEADERS_CACHE:-/tmp/relax_straggler-torch-headers}
versions=("$@")
[ ${#versions[@]} -gt 0 ] || versions=(2.4.0 2.5.0 2.6.0 2.7.0 2.8.0 2.9.0 2.10.0 2.11.0 2.12.0)
pip=${PIP:-$root/.venv/bin/pip}
status=0
for v in "${versions[@]}"; do
  inc=$cache/$v/torch/include
  if [ ! -d "$inc" ]; then
    mkdir -p "$cache/$v"
    "$pip" download -q --no-deps --only-binary=:all: --python-version 3.11 \
      --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
      "torch==$v" -d "$cache/$v"
    unzip -q -o "$cache/$v"/torch-*.whl 'torch/include/*' -d "$cache/$v" && rm -f "$cache/$v"/torch-*.whl
  fi
  std=c++17; case $v in 2.1[0-9].*) std=c++20;; esac  # torch moved to C++20 in 2.10
  for f in timed_backend.cpp timed_work.cpp stage_timer.cpp; do
    if g++ -std=$std -fsyntax-only -Wall -Wextra -Werror -I"$root/csrc" -I"$root/csrc/torch" \
         -isystem "$inc" -isystem "$inc/torch/csrc/api/include" "$root/csrc/torch/$f"; then
      echo "torch $v  $f  ok"
    else
      echo "torch $v  $f  FAILED"; status=1
    fi
  done
done
exit $status
