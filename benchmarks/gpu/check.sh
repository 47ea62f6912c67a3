#!/usr/bin/env bash
# The GPU check of relax_straggler, for a 1-GPU machine, in about 7 minutes:
#   1. builds relax_straggler._C with CUDA (the CUDA-event pool) in place,
#   2. runs the CUDA-event timer tests (tests/python/test_no_sync.py, test_stage_timer.py),
#   3. checks loss parity on the GPU (deterministic algorithms),
#   4. measures the overhead on one GPU with a GPT-sized step (GPT-2 small: 12 layers,
#      d_model 768, sequence 512, batch 4, fp32),
#      ours against the peers,
#   5. kernel_stats: 2 ranks on the GPU (DDP over Gloo) with --straggler-kernel-stats at
#      interval 10, rank 1 throttled by a competing matmul stream from step 30
#      (benchmarks/gpu/kernel_check.py): each rank's kernel / idle / NCCL ms per stage and
#      the confirmed verdict's cause, in kernel_stats.json and kernel_stats.jsonl,
#   6. kernel_overhead: the same 2-rank job without the competitor, interval 10, with and
#      without kernel stats against the analyzer off (benchmarks/overhead.py),
#   7. writes OUT_DIR/summary.md, a short result table, beside each step's log and JSON.
#
# Usage: benchmarks/gpu/check.sh [OUT_DIR]          (default runs/gpu)
# Environment: PYTHON (default python3, the one with CUDA torch), NPROC (ranks sharing the
# GPU over Gloo, default 1), ROUNDS (overhead rounds, default 4), CARRY (what
# benchmarks/gpu/prepare.sh staged, default build/gpu-carry: Eigen headers, NVRx wheels).
# Every step runs even if an earlier one failed; the exit code is the number of failed steps.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=$(mkdir -p "${1:-runs/gpu}" && cd "${1:-runs/gpu}" && pwd)
PY=${PYTHON:-python3}
NPROC=${NPROC:-1}
ROUNDS=${ROUNDS:-4}
CARRY=${CARRY:-build/gpu-carry}
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=4 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export MAX_JOBS=${MAX_JOBS:-16} TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
failed=0
: >"$OUT/steps.tsv"

step() {  # step NAME TIMEOUT_S COMMAND...: runs it, logs to OUT/NAME.log, records status and seconds
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  echo "== $name"
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  tail -n 15 "$OUT/$name.log"
  printf '%s\t%s\t%s\n' "$name" "$rc" "$((SECONDS - t0))" >>"$OUT/steps.tsv"
  [ "$rc" -eq 0 ] || failed=$((failed + 1))
}

if [ ! -f /usr/include/eigen3/Eigen/Dense ] && [ -f "$CARRY/eigen3/Eigen/Dense" ]; then
  export CPLUS_INCLUDE_PATH="$PWD/$CARRY/eigen3${CPLUS_INCLUDE_PATH:+:$CPLUS_INCLUDE_PATH}"
fi
if ls "$CARRY"/whl/*.whl >/dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/rs-site "$CARRY"/whl/*.whl \
    && export PYTHONPATH="$PYTHONPATH:/tmp/rs-site"
fi

step environment 60 bash -c "nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; \
  '$PY' -c 'import torch; print(\"torch\", torch.__version__, \"cuda\", torch.version.cuda, torch.cuda.get_device_name())'"
step build 240 "$PY" setup.py build_ext --inplace
step cuda_build 30 "$PY" -c "import torch; from relax_straggler._ext import ext; C = ext(); \
  assert C.with_cuda, 'built without CUDA'; t = C.StageTimer(1, 1, 0, 8, True); print('CUDA-event pool:', t.device)"
step tests 180 "$PY" -m pytest -q -rs -p no:cacheprovider tests/python/test_no_sync.py tests/python/test_stage_timer.py \
  tests/python/test_parity.py
step parity 120 "$PY" -m relax_straggler.cli.parity --device cuda --deterministic --steps 30 --intervals 1 10 \
  --layers 4 --d-model 256 --heads 4 --seq-len 128 --batch-size 8 --json "$OUT/parity.json"
step overhead 300 "$PY" -m torch.distributed.run --standalone --nproc-per-node "$NPROC" benchmarks/overhead.py \
  --device cuda --layers 12 --d-model 768 --heads 12 --seq-len 512 --batch-size 4 --rounds "$ROUNDS" --steps 100 \
  --warmup 5 --output "$OUT/overhead.json"
KERNEL_GPT=(--layers 4 --d-model 256 --heads 4 --seq-len 256 --batch-size 8)
step kernel_stats 90 "$PY" -m torch.distributed.run --standalone --nproc-per-node 2 benchmarks/gpu/kernel_check.py \
  --device cuda "${KERNEL_GPT[@]}" --steps 80 --contend-from 30 --output "$OUT/kernel_stats.json"
step kernel_overhead 150 "$PY" -m torch.distributed.run --standalone --nproc-per-node 2 benchmarks/overhead.py \
  --device cuda "${KERNEL_GPT[@]}" --variants bare off ours/10 ours-kernel-stats/10 --rounds 4 --steps 100 \
  --warmup 5 --output "$OUT/kernel_overhead.json"
"$PY" benchmarks/gpu/summarize.py "$OUT" | tee "$OUT/summary.md"
exit "$failed"
