#!/usr/bin/env bash
# GPU check of distributed Jobs (docs/design/worker.md#distributed): on every visible GPU (nvidia-smi -L), with nccl, benchmarks/gpu_check.py
#   1. runs examples/ddp_training.py under torchrun against a server it starts (sharded checkpoints every 10 steps);
#   2. prints the sharded checkpoint save and restore rates (MB/s, benchmarks/gpu_checkpoint_rates.py);
#   3. prints the node's cores and disk and the checkpoint verification rate with 1, 2, 4, … hash threads up to its
#      cores (benchmarks/checkpoint_io.py --verification-only; docs/design/checkpoints.md#hash-threads).
# Prints figures, asserts nothing beyond "it ran". Exits 3 with a message when no GPU is visible.
#
#   benchmarks/gpu_check.sh                      # 1024 MiB of parameters per GPU
#   GPU_CHECK_SIZE_MIB=256 benchmarks/gpu_check.sh
# Variables: PYTHON (default .venv/bin/python, else python3), GPU_CHECK_SIZE_MIB, GPU_CHECK_WORKDIR (default $TMPDIR).
set -euo pipefail

cd "$(dirname "$0")/.."
NO_GPU=3

no_gpu() {
    echo "gpu_check: no GPU visible ($1): nothing to check. Run this on a machine with NVIDIA GPUs and their driver." >&2
    exit "$NO_GPU"
}

command -v nvidia-smi >/dev/null 2>&1 || no_gpu "nvidia-smi not found"
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU [0-9]' || true)
if [ -n "${CUDA_VISIBLE_DEVICES+set}" ]; then  # the processes see only these
    visible=$(printf '%s' "$CUDA_VISIBLE_DEVICES" | tr ',' '\n' | grep -c '[^[:space:]]' || true)
    if [ "$visible" -lt "$gpus" ]; then gpus=$visible; fi
fi
[ "$gpus" -gt 0 ] || no_gpu "nvidia-smi -L lists none${CUDA_VISIBLE_DEVICES+ visible through CUDA_VISIBLE_DEVICES}"

if [ -z "${PYTHON:-}" ]; then
    if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
echo "gpu_check: $gpus visible GPU(s)${CUDA_VISIBLE_DEVICES:+ (CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES)} of:"
nvidia-smi -L
export NCCL_DEBUG=${NCCL_DEBUG:-WARN} PYTHONUNBUFFERED=1
set -- --nproc-per-node "$gpus" --size-mib "${GPU_CHECK_SIZE_MIB:-1024}"
if [ -n "${GPU_CHECK_WORKDIR:-}" ]; then set -- "$@" --workdir "$GPU_CHECK_WORKDIR"; fi
"$PYTHON" benchmarks/gpu_check.py "$@"

cores=$("$PYTHON" -c 'import os; print(len(os.sched_getaffinity(0)))')
threads=""
for count in 1 2 4 8 16 32 64 128; do
    if [ "$count" -le "$cores" ]; then threads="$threads $count"; fi
done
if [ "$cores" -gt 128 ] || ! printf '%s\n' $threads | grep -qx "$cores"; then threads="$threads $cores"; fi
echo "gpu_check: $cores cores for this process ($(nproc --all) in all); disk of the work directory:"
df -h "${GPU_CHECK_WORKDIR:-${TMPDIR:-/tmp}}"
set -- --verification-only --size-mib "${GPU_CHECK_SIZE_MIB:-1024}" --files 16 --threads $threads
if [ -n "${GPU_CHECK_WORKDIR:-}" ]; then set -- "$@" --workdir "$GPU_CHECK_WORKDIR"; fi
"$PYTHON" benchmarks/checkpoint_io.py "$@"
