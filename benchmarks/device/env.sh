# Sourced by the device scripts here: NVLink multicast off, the checkout importable, $OUT made, the planner's
# wheels (ortools, protobuf, immutabledict for cp312, carried in .whl/) installed, and `quiet` to drop
# torch's warning lines from the output.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # NVLink multicast off
export PYTHONPATH="$PWD:${PYTHONPATH:-}"
OUT=${OUT:-out}; mkdir -p "$OUT"
python -c "import ortools" 2>/dev/null || python -m pip install -q --no-deps .whl/*.whl 2>&1 | grep -v WARNING
quiet() { grep -v "^W1\|OMP_NUM\|^\[rank.\]:\[W\|_internal.py\|UserWarning\|warn_once\|If it is a" | cut -c1-400; }
