"""The digits MLP of ``training.py`` under DistributedDataParallel, with sharded checkpoints
(docs/design/worker.md#distributed).

Run it with torchrun (gloo on CPU, nccl when CUDA is available), or as a Job
with ``nproc_per_node`` > 1 (the worker starts torchrun), or as one plain
process::

    MMT_API_URL=... MMT_API_TOKEN=... MMT_PROJECT=demo \\
        torchrun --standalone --nproc-per-node 2 examples/ddp_training.py --steps 40 --checkpoint-every 10

Every rank joins one Run (``start_run`` after ``init_process_group``). Each
step draws one global batch of ``--batch-size`` examples from a generator
seeded with ``(seed, step)`` and each rank trains on its slice, so a run is
deterministic and a resumed one draws exactly the batches an uninterrupted
one would. ``train.loss`` is the loss of the whole global batch (each rank's
slice mean, averaged over the ranks): it means the same on any number of
processes, so a run resumed on another number compares with its parent
within float summation order (docs/jobs.md, "Reading the verdict"). With
more than one process each rank also logs its own slice's loss as
``rank<k>/train.loss``. Every ``--checkpoint-every`` steps all ranks save
model and optimizer with ``run.log_checkpoint_distributed`` (one Checkpoint,
a shard per rank); a resumed run loads it with ``load_distributed``,
resharded when the number of processes changed. ``--fail-at-step S`` stops
every rank at step S; ``--output PATH`` (rank 0) writes the final weights as
JSON, byte-comparable.
"""

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.nn.parallel import DistributedDataParallel
from training import SimulatedFailure, build_model, load_data, make_optimizer, seed_everything, write_weights

import mado_tracking
from mado_tracking.torch import load_distributed

STEP_SEED = 1_000_003  # batch generator of step s: seed * STEP_SEED + s


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200, help="total optimisation steps (default 200)")
    parser.add_argument("--lr", type=float, default=0.05, help="SGD learning rate (default 0.05)")
    parser.add_argument(
        "--batch-size",
        type=int,
        default=64,
        help="examples per step over all ranks (default 64; a multiple of the world size)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the weights and the batches (default 0)")
    parser.add_argument("--project", default=None, help="mado project slug (default: $MMT_PROJECT)")
    parser.add_argument("--name", default=None, help="name of the Run (default: none)")
    parser.add_argument(
        "--checkpoint-every",
        type=int,
        default=0,
        metavar="K",
        help="save a sharded checkpoint every K steps (default 0: never)",
    )
    parser.add_argument(
        "--fail-at-step",
        type=int,
        default=None,
        metavar="S",
        help="stop every rank with an error when step S is reached (to try resuming)",
    )
    parser.add_argument("--output", default=None, metavar="PATH", help="rank 0 writes the final weights as JSON")
    args = parser.parse_args(argv)
    if args.steps < 0 or args.checkpoint_every < 0 or args.batch_size < 1:
        parser.error("--steps and --checkpoint-every must be >= 0, --batch-size >= 1")
    return args


def init_distributed() -> tuple[int, int, torch.device]:
    """``(rank, world_size, device)``: a process group under torchrun (nccl with CUDA, else gloo), else ``(0, 1)``."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return 0, 1, torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if torch.cuda.is_available():
        local_rank = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(local_rank)
        dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
        return dist.get_rank(), dist.get_world_size(), torch.device("cuda", local_rank)
    dist.init_process_group("gloo")
    return dist.get_rank(), dist.get_world_size(), torch.device("cpu")


def batch_indices(seed: int, step: int, batch_size: int, examples: int, rank: int, world_size: int) -> torch.Tensor:
    """This rank's slice of step ``step``'s global batch (the same on any world size that divides it)."""
    generator = torch.Generator().manual_seed(seed * STEP_SEED + step)
    indices = torch.randint(0, examples, (batch_size,), generator=generator)
    return indices.view(world_size, -1)[rank]


def global_mean(value: torch.Tensor, world_size: int) -> float:
    """``value`` (a scalar tensor, this rank's) averaged over the ranks, in float64; the value itself on one process.
    Every rank must call it at the same point (an all-reduce)."""
    if world_size == 1:
        return value.item()
    total = value.detach().double()
    dist.all_reduce(total)
    return (total / world_size).item()


def checkpoint_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """Model and optimizer states keyed by parameter name (no ``module.`` prefix): loadable on any world size."""
    model_state, optimizer_state = get_state_dict(model, optimizer)
    return {"model": model_state, "optim": optimizer_state}


def train(
    run, model, optimizer, data, *, rank: int, world_size: int, device, start_step: int, args: argparse.Namespace
) -> float:
    """Steps ``start_step .. steps-1``; returns the last loss of the global batch."""
    x, y = data
    loss_value = float("nan")
    for step in range(start_step, args.steps):
        if step == args.fail_at_step:
            raise SimulatedFailure(f"--fail-at-step {args.fail_at_step}: stopping at step {step}")
        index = batch_indices(args.seed, step, args.batch_size, x.shape[0], rank, world_size)
        inputs, targets = x[index].to(device), y[index].to(device)
        loss = torch.nn.functional.cross_entropy(model(inputs), targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()  # DDP averages the gradients over the ranks
        optimizer.step()
        loss_value = global_mean(loss, world_size)  # the same quantity on any world size
        run.log_metrics({"train.loss": loss_value}, step=step)  # stored from rank 0
        if world_size > 1:  # rank<k>/train.loss: this rank's slice, which depends on the world size
            run.log_metrics({"train.loss": loss.item()}, step=step, all_ranks=True)
        if args.checkpoint_every and (step + 1) % args.checkpoint_every == 0:
            run.log_checkpoint_distributed(checkpoint_state(model, optimizer), step=step + 1, includes_optimizer=True)
    return loss_value


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rank, world_size, device = init_distributed()
    if args.batch_size % world_size:
        print(f"--batch-size {args.batch_size} is not a multiple of the world size {world_size}", file=sys.stderr)
        return 2
    seed_everything(args.seed)
    data = load_data()
    plain = build_model().to(device)
    model = DistributedDataParallel(plain) if world_size > 1 else plain
    optimizer = make_optimizer(model, args.lr)
    parameters = {
        "steps": args.steps,
        "lr": args.lr,
        "batch_size": args.batch_size,
        "seed": args.seed,
        "dataset": "sklearn.digits",
        "world_size": world_size,
    }
    started = time.monotonic()
    try:
        with mado_tracking.start_run(
            project=args.project, name=args.name, parameters=parameters, allow_param_change=True
        ) as run:
            if rank == 0:
                print(f"run {run.id} ({run.external_id}) on {world_size} process(es): {run.url}", flush=True)
            start_step = 0
            checkpoint = run.resume_checkpoint()
            if checkpoint is not None:
                state = checkpoint_state(model, optimizer)
                start_step = load_distributed(state, checkpoint.path)  # resharded to this world size
                set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
                if rank == 0:
                    print(
                        f"resuming from checkpoint {checkpoint.id} at step {start_step} on {world_size} process(es)",
                        flush=True,
                    )
            loss = train(
                run,
                model,
                optimizer,
                data,
                rank=rank,
                world_size=world_size,
                device=device,
                start_step=start_step,
                args=args,
            )
    except SimulatedFailure as failure:
        print(f"rank {rank} failed: {failure}", file=sys.stderr, flush=True)
        return 1
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    if rank == 0:
        if args.output:
            write_weights(args.output, plain)
        print(
            f"steps {start_step}..{args.steps} on {world_size} process(es) in {time.monotonic() - started:.1f} s: "
            f"train.loss {loss:.4f}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
