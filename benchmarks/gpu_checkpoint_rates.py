"""Sharded checkpoint save and restore rates on every rank's GPU (SPEC F36); run by ``benchmarks/gpu_check.sh``.

Started by ``torchrun --nproc-per-node N``: each rank holds ``--size-mib``
MiB of float32 parameters on its own GPU (``checkpoint_io.big_model``) and
the ranks, in the same run:

1. ``torch.distributed.checkpoint.save`` the N shards into one directory
   (GPU → disk; all ranks at once, timed from the barrier before to the
   barrier after);
2. rank 0 writes that directory as the checkpoint tar the SDK uploads
   (``mado_tracking.tarstream.CheckpointTar``), then restores the stored tar
   the way the worker and the Kubernetes init container do:
   ``extract_checkpoint_stream`` (the one strict reader: every file against
   the manifest, the tar's size and SHA-256, extraction in the same pass);
   ``checkpoint_io.sha256_single_pass`` over the same files is the reference
   rate;
3. ``torch.distributed.checkpoint.load`` the restored directory back onto the
   GPUs (disk → GPU) and compare every tensor with what was saved.

Prints MB/s (10^6 bytes per second of the total checkpoint size) for each.
``--cpu`` runs the same on CPU with gloo (no GPU needed).
"""

import argparse
import hashlib
import os
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from mado_tracking.extractdir import remove_tree

sys.path.insert(0, str(Path(__file__).resolve().parent))
from checkpoint_io import MIB, big_model, sha256_single_pass  # noqa: E402


def timed(action) -> float:
    """Seconds ``action()`` took on the slowest rank (barriers before and after)."""
    dist.barrier()
    started = time.perf_counter()
    action()
    dist.barrier()
    return time.perf_counter() - started


def store_as_tar(source: Path, tar_path: Path) -> dict:
    """Write ``source`` as the checkpoint tar the SDK uploads (``CheckpointTar``); its manifest, size and SHA-256."""
    from mado_tracking.tarstream import CheckpointTar

    tar = CheckpointTar(source, tar_hash=True)  # the tar's SHA-256: what the server computes and records
    with open(tar_path, "wb") as out:
        for chunk in tar:
            out.write(chunk)
    return {"manifest": tar.manifest, "tar_size": len(tar), "tar_sha256": tar.sha256}


def restore_like_the_worker(tar_path: Path, stored: dict, target: Path) -> None:
    """Verify + extract the stored tar in one pass into ``target``, as the worker and the init container do
    (SPEC F12–F14): every file against the manifest, the tar's size and SHA-256; 1 MiB reads."""
    from mado_tracking.extract import extract_checkpoint_stream

    def chunks():
        with open(tar_path, "rb") as stream:
            while chunk := stream.read(MIB):
                yield chunk

    extract_checkpoint_stream(chunks(), target, checkpoint_id="gpu-check", **stored)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=int, default=1024, help="MiB of parameters per rank (default 1024)")
    parser.add_argument("--workdir", default=None, help="where the checkpoint goes (default: $TMPDIR)")
    parser.add_argument("--cpu", action="store_true", help="CPU tensors and gloo instead of CUDA and nccl")
    args = parser.parse_args()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cpu") if args.cpu else torch.device("cuda", local_rank)
    if not args.cpu:
        torch.cuda.set_device(device)
    dist.init_process_group("gloo" if args.cpu else "nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    run_id = os.environ.get("TORCHELASTIC_RUN_ID", "run")
    work = Path(args.workdir or tempfile.gettempdir()) / f"mado-gpu-check-{run_id}"
    saved_dir, restored = work / "saved", work / "restored"
    if rank == 0:
        remove_tree(work)
        work.mkdir(parents=True)
    torch.manual_seed(rank)
    # Keys differ per rank, so every rank writes its own shard (DCP saves a replicated key once).
    state = {f"rank{rank}.{name}": tensor.detach().to(device)
             for name, tensor in big_model(args.size_mib).state_dict().items()}
    total = sum(t.numel() * t.element_size() for t in state.values()) * world
    try:
        save_s = timed(lambda: dcp.save(state, checkpoint_id=str(saved_dir)))
        if rank == 0:
            hash_s = _seconds(lambda: sha256_single_pass(saved_dir))
            stored = store_as_tar(saved_dir, work / "checkpoint.tar")
            restore_s = _seconds(lambda: restore_like_the_worker(work / "checkpoint.tar", stored, restored))
        dist.barrier()
        loaded = {key: torch.empty_like(tensor) for key, tensor in state.items()}
        load_s = timed(lambda: dcp.load(loaded, checkpoint_id=str(restored)))
        same = all(torch.equal(loaded[key], state[key]) for key in state)
        flags = torch.tensor([0 if same else 1], device=device)
        dist.all_reduce(flags)
        if rank == 0:
            rate = lambda seconds: total / seconds / 1e6  # noqa: E731
            kind = "CPU (gloo)" if args.cpu else f"GPU ({torch.cuda.get_device_name(device)}, nccl)"
            print(f"gpu_check: {world} ranks on {kind}, {args.size_mib} MiB per rank, {total / MIB:,.0f} MiB in all")
            print(f"checkpoint save (torch.distributed.checkpoint.save, every rank to disk): {rate(save_s):,.0f} MB/s "
                  f"({save_s:.2f} s)")
            print(f"reference: hashlib SHA-256 single pass over the saved files: {rate(hash_s):,.0f} MB/s "
                  f"({hash_s:.2f} s)")
            print(f"checkpoint restore (the stored tar verified, every file and its SHA-256, and extracted in one "
                  f"pass): {rate(restore_s):,.0f} MB/s ({restore_s:.2f} s)")
            identical = "yes" if flags.item() == 0 else "NO"
            print(f"checkpoint load (torch.distributed.checkpoint.load of the restored directory onto every rank): "
                  f"{rate(load_s):,.0f} MB/s ({load_s:.2f} s); tensors identical: {identical}")
        if flags.item() != 0:
            raise SystemExit("gpu_check: the loaded tensors differ from the saved ones")
    finally:
        dist.barrier()
        if rank == 0:
            remove_tree(work)  # the extracted checkpoint is read-only
        dist.destroy_process_group()


def _seconds(action) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


if __name__ == "__main__":
    main()
