#!/usr/bin/env bash
# Issue 14's measurements on a lent two-H200 machine (device tool), two calls of <= 10 minutes:
#   bash benchmarks/device/two_gpu.sh tp-zb    # TP speed (tp_speed.py) and pipeline schedules (zero_bubble_h200.py)
#   bash benchmarks/device/two_gpu.sh losses   # every 2-GPU plan of the sweep and its 1-GPU reference from one init
# Results land in $OUT; `python benchmarks/two_gpu.py` and `python benchmarks/trainer_sweep.py losses` report them.
source "$(dirname "$0")/env.sh"
case "${1:-}" in
  tp-zb)
    timeout 280 torchrun --nproc-per-node 2 benchmarks/tp_speed.py --out "$OUT/tp_speed.json" 2>&1 | quiet | tail -12
    timeout 290 torchrun --nproc-per-node 2 benchmarks/zero_bubble_h200.py --out "$OUT/zero_bubble.jsonl" 2>&1 \
      | quiet | grep '^{' ;;
  losses)
    python benchmarks/trainer_sweep.py measure --gpus 1 --only 1g-llama-b16,1g-gpt-b16,1g-moe-b16 \
      --out "$OUT/loss_single.jsonl" 2>&1 | quiet | grep '^{' | cut -c1-160
    timeout 500 torchrun --nproc-per-node 2 benchmarks/trainer_sweep.py measure --gpus 2 --out "$OUT/loss_dist.jsonl" \
      --skip 2g-llama7b-eager,2g-llama7b-compiled 2>&1 | quiet | grep '^{' | cut -c1-160 ;;
  *) echo "usage: $0 tp-zb|losses" >&2; exit 2 ;;
esac
