#!/usr/bin/env bash
# The trainer sweep of record on a lent two-H200 machine (device tool), in two calls of <= 10 minutes:
#   bash benchmarks/device/trainer_sweep.sh probes-single   # host probes (1 and 2 GPUs) + the 1-GPU sweep
#   bash benchmarks/device/trainer_sweep.sh dist            # the 2-GPU sweep (1.3B, 350M GPT, MoE, 7B)
# Results land in $OUT; `python benchmarks/trainer_sweep.py fit/report` turn them into the docs on any CPU.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # NVLink multicast off
export PYTHONPATH="$PWD:${PYTHONPATH:-}"
OUT=${OUT:-out}; mkdir -p "$OUT"
python -c "import ortools" 2>/dev/null || pip install -q --no-deps .whl/*.whl >/dev/null 2>&1
AP="python -m autoparallel.cli"
case "${1:-}" in
  probes-single)
    $AP calibrate --trainer --raw "$OUT/probes.jsonl" 2>&1 | tail -20
    torchrun --nproc-per-node 2 -m autoparallel.cli calibrate --trainer --raw "$OUT/probes.jsonl" 2>&1 | grep -v "^W1\|OMP_NUM" | tail -20
    python benchmarks/trainer_sweep.py measure --gpus 1 --out "$OUT/single.jsonl" 2>&1 | cut -c1-300 | tail -40 ;;
  dist)
    torchrun --nproc-per-node 2 benchmarks/trainer_sweep.py measure --gpus 2 --out "$OUT/dist.jsonl" 2>&1 \
      | grep -v "^W1\|OMP_NUM" | cut -c1-300 | tail -40 ;;
  *) echo "usage: $0 probes-single|dist" >&2; exit 2 ;;
esac
