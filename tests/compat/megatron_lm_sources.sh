#!/usr/bin/env bash
# Checks the Megatron-LM integration against the sources of each supported Megatron-LM
# release: the internals relax_straggler.integrations.megatron_compat relies on, and the
# patch of patches/megatron-lm applying there and placing its hooks right; and that the
# last release before them is refused by name. Fetches each ref's megatron/ tree
# (shallow, no history) into a cache folder.
#
#   tests/compat/megatron_lm_sources.sh [REF ...]   (default: the refs docs/INTEGRATIONS.md lists, and core_v0.15.3)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cache=${MEGATRON_LM_SOURCES_CACHE:-/tmp/relax_straggler-megatron-lm}
url=${MEGATRON_LM_URL:-https://github.com/NVIDIA/Megatron-LM.git}
refs=("$@")
[ ${#refs[@]} -gt 0 ] || refs=(core_v0.15.3 core_v0.16.1 core_v0.17.1 core_v0.18.2 core_v0.19.0 main)
trees=()
for ref in "${refs[@]}"; do
  dir=$cache/$ref
  if [ ! -d "$dir/megatron" ]; then
    rm -rf "$dir" && mkdir -p "$dir"
    git -C "$dir" init -q && git -C "$dir" fetch -q --depth 1 "$url" "$ref"
    git -C "$dir" archive FETCH_HEAD megatron | tar -x -C "$dir"
  fi
  trees+=("$dir")
done
RELAX_STRAGGLER_MEGATRON_LM_TREES=$(IFS=:; echo "${trees[*]}") \
  exec "${PYTHON:-$root/.venv/bin/python}" -m pytest "$root/tests/python/test_patch_megatron_compat.py" -q -k upstream
