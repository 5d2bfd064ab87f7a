"""Train a tiny classifier with Hugging Face Accelerate and log it to mado (docs/integrations.md, "Accelerate";
docs/design/resume.md#steps-continue, #in-the-code; docs/design/runs.md#preemption).

An MLP with dropout learns 4 classes of generated points (96 examples, batches of 8, gradient accumulation 2: an
epoch is 6 optimizer steps), with AdamW and a linearly decaying learning rate, deterministic on CPU: the same
``--seed`` gives the same weights. Every optimizer step logs ``train.loss`` and ``train.lr`` at its index.

    MMT_API_URL=http://127.0.0.1:8000 MMT_API_TOKEN=... MMT_PROJECT=demo \\
        python examples/accelerate_training.py --steps 40 --checkpoint-every 10

Every ``--checkpoint-every`` steps ``mado_tracking.integrations.accelerate.save_state`` logs
``accelerator.save_state`` (model, optimizer, scheduler, RNGs, the step counter of ``accumulate``, the data
position) as the Run's checkpoint at the steps completed. Started as a resumed Run (``run.resume_checkpoint()``),
``load_state`` restores it and the loop goes on from its step, mid-epoch included (the seedable sampler gives
each epoch an order of its own): the final weights are those of an uninterrupted run. ``--fail-at-step S`` stops
with an error at step S; ``--output PATH`` writes the final weights as safetensors (byte-comparable); SIGTERM or
SIGUSR1 saves at the end of the step, waits until that checkpoint is complete and exits as preempted.
``--offline`` needs no server and records into the directory of ``--output``. Several processes work too
(``accelerate launch --multi_gpu --num_processes 2 accelerate_training.py ...``, or ``torchrun --standalone
--nproc-per-node 2``; CPU only here): each trains on batches of its own and the main process uploads.
"""

import argparse
import sys
import time
from pathlib import Path

import torch
from accelerate import Accelerator, DataLoaderConfiguration
from accelerate.utils import set_seed
from safetensors.torch import save_file
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import mado_tracking
from mado_tracking.integrations import accelerate as mado_accelerate

FEATURES, HIDDEN, CLASSES, EXAMPLES = 8, 32, 4, 96
DROPOUT = 0.2
DATA_SEED = 2024  # the generated data set is the same whatever --seed is


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=40, help="optimizer steps in all (default 40)")
    parser.add_argument("--lr", type=float, default=0.01, help="AdamW learning rate at step 0 (default 0.01)")
    parser.add_argument("--batch-size", type=int, default=8, help="examples per batch and process (default 8)")
    parser.add_argument("--accumulation", type=int, default=2, help="batches per optimizer step (default 2)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the weights, dropout and order (default 0)")
    parser.add_argument("--project", default=None, help="mado project slug (default: $MMT_PROJECT)")
    parser.add_argument("--name", default=None, help="name of the Run (default: none)")
    parser.add_argument("--checkpoint-every", type=int, default=0, metavar="K", help="save every K steps (0: never)")
    parser.add_argument("--fail-at-step", type=int, default=None, metavar="S", help="stop with an error at step S")
    parser.add_argument("--output", default=None, metavar="PATH", help="write the final weights (safetensors)")
    parser.add_argument(
        "--offline", action="store_true", help="no server: record into the directory of --output ($MMT_OFFLINE_DIR)"
    )
    args = parser.parse_args(argv)
    if args.steps < 0 or args.checkpoint_every < 0:
        parser.error("--steps and --checkpoint-every must be >= 0")
    if args.batch_size < 1 or args.accumulation < 1:
        parser.error("--batch-size and --accumulation must be >= 1")
    return args


class SimulatedFailure(RuntimeError):
    """Raised by ``--fail-at-step``."""


def make_dataset() -> TensorDataset:
    """``EXAMPLES`` points ``[FEATURES]`` labelled by the nearest of ``CLASSES`` random centres (float32, int64)."""
    generator = torch.Generator().manual_seed(DATA_SEED)
    centres = torch.randn(CLASSES, FEATURES, generator=generator) * 2
    x = torch.randn(EXAMPLES, FEATURES, generator=generator) * 1.5
    y = torch.cdist(x, centres).argmin(dim=1)
    return TensorDataset(x, y)


def build_model() -> nn.Module:
    """``[batch, FEATURES]`` → ``[batch, CLASSES]`` logits, with dropout (training draws from the torch RNG)."""
    return nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.ReLU(), nn.Dropout(DROPOUT), nn.Linear(HIDDEN, CLASSES))


def write_weights(output: str, model: nn.Module) -> None:
    """The unwrapped model's ``state_dict`` as safetensors into ``output`` (its directory created)."""
    Path(output).parent.mkdir(parents=True, exist_ok=True)
    save_file({name: tensor.detach().contiguous() for name, tensor in model.state_dict().items()}, output)


def train(args, accelerator, run, model, optimizer, loader, scheduler, step: int) -> float:
    """Optimizer steps ``step .. args.steps - 1``; returns the last logged loss."""
    loss_value, losses = float("nan"), []
    for x, y in mado_accelerate.batches(accelerator, loader):
        if step >= args.steps:
            break
        if step == args.fail_at_step:
            raise SimulatedFailure(f"--fail-at-step {args.fail_at_step}: stopping at step {step}")
        with accelerator.accumulate(model):
            loss = nn.functional.cross_entropy(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
        losses.append(loss.item())
        if not accelerator.sync_gradients:
            continue
        loss_value, losses = sum(losses) / len(losses), []
        run.log_metrics({"train.loss": loss_value, "train.lr": scheduler.get_last_lr()[0]}, step=step)
        step += 1
        if args.checkpoint_every and step % args.checkpoint_every == 0:
            mado_accelerate.save_state(accelerator, run, step)
        if mado_accelerate.should_stop(accelerator):
            mado_accelerate.save_and_exit(accelerator, run, step)
    return loss_value


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    set_seed(args.seed)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    accelerator = Accelerator(
        cpu=True,
        gradient_accumulation_steps=args.accumulation,
        dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True),
    )
    model = build_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    scheduler = torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=1.0, end_factor=0.1, total_iters=args.steps)
    loader = DataLoader(make_dataset(), batch_size=args.batch_size, shuffle=True)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    parameters = {
        "steps": args.steps,
        "lr": args.lr,
        "batch_size": args.batch_size,
        "accumulation": args.accumulation,
        "seed": args.seed,
        "processes": accelerator.num_processes,
        "framework": "accelerate",
    }
    offline_dir = Path(args.output).parent if args.offline and args.output else None
    if offline_dir is not None and not accelerator.is_main_process:
        offline_dir = offline_dir / f"process-{accelerator.process_index}"  # an offline run per process
    started = time.monotonic()
    try:
        with mado_tracking.start_run(
            project=args.project,
            name=args.name,
            parameters=parameters,
            offline=True if args.offline else None,
            output=offline_dir,
        ) as run:
            start = mado_accelerate.load_state(accelerator, run)
            mado_accelerate.install_preemption(run)
            if accelerator.is_main_process:
                print(f"run {run.id} ({run.external_id}): {run.url}", flush=True)
            if start and accelerator.is_main_process:
                position = mado_accelerate.data_position(accelerator, loader)
                print(f"resuming at step {start}, epoch {position.epoch}, batch {position.batches}", flush=True)
            loss = train(args, accelerator, run, model, optimizer, loader, scheduler, start)
    except SimulatedFailure as failure:
        print(f"failed: {failure}", file=sys.stderr, flush=True)
        return 1
    if args.output and accelerator.is_main_process:
        write_weights(args.output, accelerator.unwrap_model(model))
    if accelerator.is_main_process:
        print(f"steps {start}..{args.steps} in {time.monotonic() - started:.1f} s: train.loss {loss:.4f}", flush=True)
    accelerator.end_training()  # every process leaves the process group before the interpreter tears it down
    return 0


if __name__ == "__main__":
    sys.exit(main())
