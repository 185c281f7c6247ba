#!/usr/bin/env bash
# Issue 14's measurements on a lent two-H200 machine (device tool), calls of <= 10 minutes:
#   bash benchmarks/device/two_gpu.sh tp-zb    # TP speed (tp_speed.py) and pipeline schedules (zero_bubble_h200.py)
#   bash benchmarks/device/two_gpu.sh losses   # every 2-GPU plan of the sweep and its 1-GPU reference from one init
#   bash benchmarks/device/two_gpu.sh null     # the 1-GPU runs equal to those references in exact arithmetic
#   bash benchmarks/device/two_gpu.sh default  # the trainer's default run (default_run.py), both models
#   bash benchmarks/device/two_gpu.sh timeline # where the 1.3B's compiled steps spend their time (profile_timeline.py)
#   bash benchmarks/device/two_gpu.sh tp       # tp2 + SP compiled with inductor's overlap passes against dp2
#   bash benchmarks/device/two_gpu.sh losses7b # the 7B's two plans and its one-GPU reference and null, one init
#   bash benchmarks/device/two_gpu.sh null7b   # two more one-GPU 7B nulls (compiled), side by side
# Several modes run in one call in the order given.
# Results land in $OUT; `python benchmarks/two_gpu.py` and `python benchmarks/trainer_sweep.py losses` report them.
source "$(dirname "$0")/env.sh"
[ $# -gt 0 ] || { echo "usage: $0 tp-zb|tp|losses|losses7b|null7b|null|default|timeline ..." >&2; exit 2; }
for mode in "$@"; do
case "$mode" in
  tp-zb)
    timeout 280 torchrun --nproc-per-node 2 benchmarks/tp_speed.py --out "$OUT/tp_speed.json" 2>&1 | quiet | tail -12
    timeout 290 torchrun --nproc-per-node 2 benchmarks/zero_bubble_h200.py --out "$OUT/zero_bubble.jsonl" 2>&1 \
      | quiet | grep '^{' ;;
  losses)
    python benchmarks/trainer_sweep.py measure --gpus 1 --only 1g-llama-b16,1g-gpt-b16,1g-moe-b16 \
      --out "$OUT/loss_single.jsonl" 2>&1 | quiet | grep '^{' | cut -c1-160
    timeout 500 torchrun --nproc-per-node 2 benchmarks/trainer_sweep.py measure --gpus 2 --out "$OUT/loss_dist.jsonl" \
      --skip 2g-llama7b-eager,2g-llama7b-compiled 2>&1 | quiet | grep '^{' | cut -c1-160 ;;
  tp)
    timeout 330 torchrun --nproc-per-node 2 benchmarks/tp_speed.py --budget-s 280 --out "$OUT/tp_overlap.json" \
      --only dp2-zero2-compiled,tp2-sp-compiled,tp2-sp-compiled-reorder,tp2-sp-compiled-overlap 2>&1 | quiet | grep '^{' ;;
  losses7b)  # the one-GPU pair side by side (one per GPU), then each two-GPU plan in its own process
    for i in 0 1; do
      c=$([ $i = 0 ] && echo 1g-llama7b-b8 || echo 1g-llama7b-b8-mb2x4)
      CUDA_VISIBLE_DEVICES=$i timeout 240 python benchmarks/trainer_sweep.py measure --gpus 1 --only $c \
        --out "$OUT/loss7b_single_$i.jsonl" 2>&1 | quiet | grep '^{' | cut -c1-200 &
    done
    wait
    for c in 2g-llama7b-eager 2g-llama7b-compiled; do
      timeout 200 torchrun --nproc-per-node 2 benchmarks/trainer_sweep.py measure --gpus 2 --only $c \
        --out "$OUT/loss7b_dist.jsonl" 2>&1 | quiet | grep '^{' | cut -c1-200
    done ;;
  null7b)
    for i in 0 1; do
      c=$([ $i = 0 ] && echo 1g-llama7b-b8-compiled || echo 1g-llama7b-b8-mb2x4-compiled)
      CUDA_VISIBLE_DEVICES=$i timeout 240 python benchmarks/trainer_sweep.py measure --gpus 1 --only $c \
        --out "$OUT/null7b_$i.jsonl" 2>&1 | quiet | grep '^{' | cut -c1-200 &
    done
    wait ;;
  null)  # losses only (no timing): the two halves run side by side, one per GPU
    null=(1g-llama-b16-mb8x2,1g-llama-b16-compiled,1g-gpt-b16-mb8x2,1g-moe-b16-mb8x2
          1g-llama-b16-mb4x4,1g-llama-b16-full,1g-gpt-b16-compiled,1g-moe-b16-compiled)
    for i in 0 1; do
      CUDA_VISIBLE_DEVICES=$i timeout 400 python benchmarks/trainer_sweep.py measure --gpus 1 --only "${null[$i]}" \
        --out "$OUT/loss_single_null_$i.jsonl" 2>&1 | quiet | grep '^{' | cut -c1-160 &
    done
    wait ;;
  default)
    timeout 300 torchrun --nproc-per-node 2 benchmarks/default_run.py --out "$OUT/default_run.jsonl" 2>&1 | quiet \
      | grep '^{' ;;
  timeline)
    timeout 120 python benchmarks/profile_timeline.py --only 1g-llama-auto --out "$OUT/timeline.jsonl" 2>&1 | quiet \
      | grep '^{'
    timeout 200 torchrun --nproc-per-node 2 benchmarks/profile_timeline.py --only 2g-llama-auto,2g-llama-tp2sp-compiled \
      --out "$OUT/timeline.jsonl" 2>&1 | quiet | grep '^{' ;;
  *) echo "usage: $0 tp-zb|tp|losses|losses7b|null7b|null|default|timeline ..." >&2; exit 2 ;;
esac
done
