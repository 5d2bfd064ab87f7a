"""Sharded checkpoint save and restore rates on every rank's GPU (docs/design/worker.md#distributed); run by
``benchmarks/gpu_check.sh``.

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
   GPUs (disk → GPU) and compare every tensor with what was saved;
4. with ``MMT_API_URL`` / ``MMT_API_TOKEN`` / ``MMT_PROJECT`` set (the driver's
   server), the product's path: ``run.log_checkpoint_distributed`` from every
   rank (save, upload, the server's verification), rank 0's restore as
   ``mado checkpoint restore`` does it (download + verify + extract), and the
   load back of that directory, compared again.

Prints MB/s (10^6 bytes per second of the total checkpoint size) for each.
``--cpu`` runs the same on CPU with gloo (no GPU needed).
"""

import argparse
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
    (docs/design/worker.md#fetch, #verify, #extract): every file against the manifest, the tar's size and SHA-256; 1 MiB
    reads."""
    from mado_tracking.extract import extract_checkpoint_stream

    def chunks():
        with open(tar_path, "rb") as stream:
            while chunk := stream.read(MIB):
                yield chunk

    extract_checkpoint_stream(chunks(), target, checkpoint_id="gpu-check", **stored)


def load_back(state: dict, directory: Path, device) -> tuple[float, bool]:
    """``dcp.load`` of ``directory`` into fresh tensors on every rank: seconds, and whether all ranks got ``state``."""
    loaded = {key: torch.empty_like(tensor) for key, tensor in state.items()}
    seconds = timed(lambda: dcp.load(loaded, checkpoint_id=str(directory)))
    differ = torch.tensor([0 if all(torch.equal(loaded[key], state[key]) for key in state) else 1], device=device)
    dist.all_reduce(differ)
    return seconds, differ.item() == 0


def through_mado(state: dict, work: Path, rank: int) -> dict[str, float]:
    """The product's path, against the server of ``MMT_API_URL``: every rank joins one Run and saves with
    ``run.log_checkpoint_distributed`` (DCP save + tar + upload + the server's verification), then rank 0
    restores it as ``mado checkpoint restore`` does (download + verify + extract in one pass)."""
    import mado_tracking
    from mado_tracking import config
    from mado_tracking.client import ApiClient
    from mado_tracking.extract import restore_checkpoint

    saved = []
    with mado_tracking.start_run(name="gpu-check-rates") as run:
        save_s = timed(lambda: saved.append(run.log_checkpoint_distributed(state, step=1)))
    figures = {"mado save": save_s}
    if rank == 0:
        (work / "from-mado").mkdir()
        client = ApiClient(config.resolve(require_project=False))
        figures["mado restore"] = _seconds(lambda: restore_checkpoint(client, saved[0].id, work / "from-mado"))
        client.close()
    dist.barrier()
    return figures


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
    if rank == 0:
        remove_tree(work)
        work.mkdir(parents=True)
    torch.manual_seed(rank)
    # Keys differ per rank, so every rank writes its own shard (DCP saves a replicated key once).
    state = {
        f"rank{rank}.{name}": tensor.detach().to(device)
        for name, tensor in big_model(args.size_mib).state_dict().items()
    }
    total = sum(t.numel() * t.element_size() for t in state.values()) * world
    try:
        figures = {"save": timed(lambda: dcp.save(state, checkpoint_id=str(work / "saved")))}
        if rank == 0:
            figures["hash"] = _seconds(lambda: sha256_single_pass(work / "saved"))
            stored = store_as_tar(work / "saved", work / "checkpoint.tar")
            figures["restore"] = _seconds(
                lambda: restore_like_the_worker(work / "checkpoint.tar", stored, work / "restored")
            )
        figures["load"], identical = load_back(state, work / "restored", device)
        if os.environ.get("MMT_API_URL"):
            figures.update(through_mado(state, work, rank))
            figures["mado load"], from_mado = load_back(state, work / "from-mado" / "checkpoint", device)
            identical = identical and from_mado
        if rank == 0:
            kind = "CPU (gloo)" if args.cpu else f"GPU ({torch.cuda.get_device_name(device)}, nccl)"
            print(f"gpu_check: {world} ranks on {kind}, {args.size_mib} MiB per rank, {total / MIB:,.0f} MiB in all")
            for key, label in LABELS.items():
                if key in figures:
                    print(f"{label}: {total / figures[key] / 1e6:,.0f} MB/s ({figures[key]:.2f} s)")
            print(f"tensors loaded back identical to those saved: {'yes' if identical else 'NO'}")
        if not identical:
            raise SystemExit("gpu_check: the loaded tensors differ from the saved ones")
    finally:
        dist.barrier()
        if rank == 0:
            remove_tree(work)  # the extracted checkpoints are read-only
        dist.destroy_process_group()


LABELS = {
    "save": "checkpoint save (torch.distributed.checkpoint.save, every rank to local disk)",
    "hash": "reference: hashlib SHA-256 single pass over the saved files",
    "restore": "checkpoint restore (the stored tar verified, every file and its SHA-256, and extracted in one pass)",
    "load": "checkpoint load (torch.distributed.checkpoint.load of the restored directory onto every rank)",
    "mado save": "mado save (run.log_checkpoint_distributed: every rank's shards, upload, the server's check)",
    "mado restore": "mado restore (download + verify + extract in one pass, as mado checkpoint restore)",
    "mado load": "mado load (torch.distributed.checkpoint.load of that restored directory onto every rank)",
}


def _seconds(action) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


if __name__ == "__main__":
    main()
