#!/usr/bin/env bash
# GPU check of distributed Jobs (SPEC F36): on every visible GPU, with nccl,
#   1. examples/ddp_training.py under torchrun (offline: DCP checkpoints every 10 steps, no server needed);
#   2. benchmarks/gpu_checkpoint_rates.py: checkpoint save and restore rates (MB/s) on every rank's GPU.
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
    [ "$visible" -lt "$gpus" ] && gpus=$visible
fi
[ "$gpus" -gt 0 ] || no_gpu "nvidia-smi -L lists none${CUDA_VISIBLE_DEVICES+ visible through CUDA_VISIBLE_DEVICES}"

if [ -z "${PYTHON:-}" ]; then
    if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
size_mib=${GPU_CHECK_SIZE_MIB:-1024}
work=$(mktemp -d "${GPU_CHECK_WORKDIR:-${TMPDIR:-/tmp}}/mado-gpu-check.XXXXXX")
trap 'chmod -R u+w "$work" 2>/dev/null; rm -rf "$work"' EXIT

echo "gpu_check: $gpus GPU(s):"
nvidia-smi -L | head -n "$gpus"
export NCCL_DEBUG=${NCCL_DEBUG:-WARN} PYTHONUNBUFFERED=1

echo "== examples/ddp_training.py, torchrun --nproc-per-node $gpus, nccl"
SECONDS=0
"$PYTHON" -m torch.distributed.run --standalone --nproc-per-node "$gpus" examples/ddp_training.py \
    --offline --steps 40 --checkpoint-every 10 --output "$work/ddp/weights.json"
echo "ddp_training: finished in ${SECONDS} s; checkpoints:" \
    "$(ls "$work/ddp/checkpoints" 2>/dev/null | tr '\n' ' ')"

echo "== checkpoint save and restore rates, $size_mib MiB per GPU"
"$PYTHON" -m torch.distributed.run --standalone --nproc-per-node "$gpus" benchmarks/gpu_checkpoint_rates.py \
    --size-mib "$size_mib" --workdir "$work"
