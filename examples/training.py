"""Train a small MLP on scikit-learn's digits and log it to mado (docs/design/interfaces.md#example-program;
docs/design/resume.md#steps-continue, #in-the-code; docs/design/checkpoints.md#a-checkpoint;
docs/design/runs.md#offline).

Real PyTorch training on a real data set that ships with scikit-learn (1,797
8x8 images of handwritten digits, no download), deterministic on CPU: the same
``--seed`` gives the same weights and the same metric values. Each epoch walks a
fresh permutation of the data (``Batches``, the data position), each batch gets
pixel noise from torch's global RNG, the learning rate warms up over 10 steps and
then decays (``LambdaLR``). Every step logs ``train.loss`` (cross-entropy of the
minibatch) and ``train.accuracy`` (fraction of the minibatch classified correctly)
through ``mado_tracking``.

    MMT_API_URL=http://127.0.0.1:8000 MMT_API_TOKEN=... MMT_PROJECT=demo \\
        python examples/training.py --steps 200 --name my-first-run

The loop runs over ``range(start_step, steps)`` and all training state lives
in ``model``, ``optimizer``, ``scheduler``, ``batches``, ``generator`` and the global
RNGs, which ``mado_tracking.torch`` saves every ``--checkpoint-every`` steps (then
``run.log_checkpoint(dir, step=step + 1, ...)``) and restores when the
program is started with the ``MMT_RESUME_*`` variables, or again under its run
id (``MMT_RUN_ID`` with ``MMT_RESUME=must``, on any machine, in any directory)
(``run.resume_checkpoint()``):
the resumed run continues at the checkpoint's step and ends with exactly the
weights of an uninterrupted run. ``--fail-at-step S`` stops with an error at
step S; ``--output PATH`` writes the final weights as JSON (byte-comparable);
``--offline`` needs no server and records into the directory of ``--output``::

    python examples/training.py --offline --steps 40 --checkpoint-every 10 --fail-at-step 27 \
        --output /tmp/x/weights.json          # fails, leaves /tmp/x/checkpoints/step-10, step-20
    echo '{"checkpointId": "local", "sourceRunId": "local", "step": 20}' > /tmp/x/resume.json
    MMT_RESUME_CHECKPOINT_DIR=/tmp/x/checkpoints/step-20 MMT_RESUME_STEP=20 \
    MMT_RESUME_CHECKPOINT_FILE=/tmp/x/resume.json \
        python examples/training.py --offline --steps 40 --checkpoint-every 10 --output /tmp/x/resumed.json

``--add-dataset-at-step S`` adds data mid-training (docs/design/runs.md#data-stages, #data-stages-sdk): from step S the
loader draws from the digits plus a noisy copy of them (a second, deterministic dataset version), and the program then
records that data stage with ``run.log_training_data_stage(S, ids, checkpoint_id=<latest checkpoint <= S>)``, ``ids``
being the full set given by ``--dataset-version-ids A,B`` (or ``MMT_DATASET_VERSION_IDS``). Offline, the loader switches
but the stage is not recorded (online only). Without the flag nothing changes.

Each checkpoint also holds ``data.json``: the dataset version ids it was trained on (``MMT_DATASET_VERSION_IDS``).
A Job that continues from it with another data mix (``MMT_START_KIND=continue`` and other ids) resets the data
position (the batch order starts afresh instead of skipping into the new data as if it had been seen) and says so.
SIGTERM or SIGUSR1 (a scheduler's notice, ``mado_tracking.preemption``) saves the state at the end of the current
step, waits until that checkpoint is complete and exits with 128 + the signal number: the Run ends ``preempted`` and
resumes from that step (``examples/slurm/``).
A checkpoint already at ``--steps`` leaves nothing to train, and the program says so: continue it with a code
version whose ``--steps`` is higher.

``--variant`` breaks the resume on purpose, the way training loops often do (docs/jobs.md, "What makes a training
loop resumable"): ``rebuild-scheduler`` builds the scheduler again after loading, ``reseed-rng`` seeds the RNGs again,
``restart-data`` starts the epoch's data from its beginning, ``ignore-checkpoint`` continues at the checkpoint's step
without loading it. The SDK names what was not restored before the first step; the parity verdict shows the step
where the curves part.
"""

import argparse
import gzip
import importlib.util
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

import mado_tracking
from mado_tracking import preemption
from mado_tracking.torch import load_checkpoint, save_checkpoint

HIDDEN = 64
MOMENTUM = 0.9
NOISE_SEED = 1234  # the noisy copy is the same in every process (a dataset version), whatever --seed is
NOISE_STD = 0.1
AUGMENT_STD = 0.05  # pixel noise on every batch, from torch's global RNG
WARMUP_STEPS = 10
LR_DECAY = 0.99  # per step after the warmup
VARIANTS = ("rebuild-scheduler", "reseed-rng", "restart-data", "ignore-checkpoint")
ENV_DATASET_VERSION_IDS = "MMT_DATASET_VERSION_IDS"
DATA_FILE = "data.json"  # in each checkpoint: {"dataset_version_ids": [...]} it was trained on


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--steps", type=int, default=200, help="total optimisation steps (default 200)")
    add("--lr", type=float, default=0.05, help="SGD learning rate (default 0.05)")
    add("--batch-size", type=int, default=64, help="examples per step (default 64)")
    add("--seed", type=int, default=0, help="seed of every random number generator (default 0)")
    add("--project", default=None, help="mado project slug (default: $MMT_PROJECT)")
    add("--name", default=None, help="name of the Run (default: none)")
    add(
        "--checkpoint-every",
        type=int,
        default=0,
        metavar="K",
        help="save a checkpoint every K steps (default 0: never)",
    )
    add("--fail-at-step", type=int, metavar="S", help="stop with an error when step S is reached (to try resuming)")
    add(
        "--output", metavar="PATH", help="write the final weights as JSON to PATH; offline, its directory holds the run"
    )
    add(
        "--offline",
        action="store_true",
        help="no server: record into the directory of --output (else $MMT_OFFLINE_DIR); "
        "upload later with `mado sync DIR`",
    )
    add(
        "--add-dataset-at-step",
        type=int,
        metavar="S",
        help="from step S, also train on a noisy copy of the digits and record the data stage",
    )
    add(
        "--dataset-version-ids",
        metavar="A,B",
        help=f"the full set of dataset version ids from step S on (default: ${ENV_DATASET_VERSION_IDS})",
    )
    add("--variant", choices=VARIANTS, help="when resuming, leave a part of the training state unrestored on purpose")
    args = parser.parse_args(argv)
    if args.steps < 0:
        parser.error("--steps must be >= 0")
    if args.batch_size < 1:
        parser.error("--batch-size must be >= 1")
    if args.checkpoint_every < 0:
        parser.error("--checkpoint-every must be >= 0")
    if args.add_dataset_at_step is not None:
        if args.add_dataset_at_step < 0:
            parser.error("--add-dataset-at-step must be >= 0")
        raw = args.dataset_version_ids or os.environ.get(ENV_DATASET_VERSION_IDS, "")
        try:
            args.stage_ids = [int(part) for part in raw.split(",") if part.strip()]
        except ValueError:
            parser.error(f"--dataset-version-ids must be comma-separated integers, got {raw!r}")
        if not args.stage_ids and not args.offline:
            parser.error(
                f"--add-dataset-at-step needs --dataset-version-ids A,B (or ${ENV_DATASET_VERSION_IDS}) "
                "to record the stage"
            )
    return args


class SimulatedFailure(RuntimeError):
    """Raised by ``--fail-at-step``."""


def seed_everything(seed: int) -> torch.Generator:
    """Seed Python, NumPy and torch, force deterministic kernels; return the generator that draws batches."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    return torch.Generator().manual_seed(seed)


def load_data() -> tuple[torch.Tensor, torch.Tensor]:
    """Digits as ``(x, y)``: x float32 ``[1797, 64]`` scaled to [0, 1], y int64 ``[1797]`` in 0..9, read from the file
    ``load_digits`` reads (64 pixels, then the label) without importing scikit-learn (2 CPU-seconds per start)."""
    package = importlib.util.find_spec("sklearn")  # None: scikit-learn, which ships the data, is not installed
    path = Path(package.submodule_search_locations[0]) / "datasets" / "data" / "digits.csv.gz"
    with gzip.open(path, "rt", encoding="utf-8") as rows:
        table = np.loadtxt(rows, delimiter=",")
    x = torch.from_numpy(table[:, :-1].astype(np.float32) / 16.0)
    y = torch.from_numpy(table[:, -1].astype(np.int64))
    return x, y


def noisy_copy(data: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """The second dataset version: the digits with Gaussian pixel noise (std 0.1, clipped to [0, 1]).

    Drawn from its own generator, so the training RNGs (and checkpoints) are untouched.
    """
    x, y = data
    noise = torch.randn(x.shape, generator=torch.Generator().manual_seed(NOISE_SEED)) * NOISE_STD
    return (x + noise).clamp(0.0, 1.0), y.clone()


def with_added_dataset(data: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """The loader after the switch: the digits followed by their noisy copy."""
    extra_x, extra_y = noisy_copy(data)
    return torch.cat([data[0], extra_x]), torch.cat([data[1], extra_y])


def build_model(in_features: int = 64, classes: int = 10) -> nn.Module:
    """A two-layer MLP: ``[batch, 64]`` pixels → ``[batch, 10]`` logits."""
    return nn.Sequential(nn.Linear(in_features, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, classes))


def make_optimizer(model: nn.Module, lr: float) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=lr, momentum=MOMENTUM)


def lr_factor(step: int) -> float:
    """The learning rate's factor after ``step`` scheduler steps: a linear warmup, then ``LR_DECAY`` per step."""
    return min(1.0, (step + 1) / WARMUP_STEPS) * LR_DECAY ** max(0, step + 1 - WARMUP_STEPS)


def make_scheduler(optimizer: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor)


class Batches:
    """The data position: minibatch indices walking each epoch's permutation of the data, drawn from the generator
    passed to ``next``; ``state_dict`` / ``load_state_dict`` save and restore where it is."""

    def __init__(self, size: int, batch_size: int):
        self.size, self.batch_size = size, batch_size
        self.epoch, self.index, self.order = 0, 0, None

    def next(self, generator: torch.Generator) -> torch.Tensor:
        """The next ``batch_size`` indices into the data (int64); a new epoch draws a new permutation first."""
        if self.order is None or self.index + self.batch_size > self.size:
            self.epoch += self.order is not None
            self.order, self.index = torch.randperm(self.size, generator=generator), 0
        batch = self.order[self.index : self.index + self.batch_size]
        self.index += self.batch_size
        return batch

    def resize(self, size: int) -> None:
        """The data changed to ``size`` examples: the next batch starts a new permutation of them."""
        self.size, self.order = size, None

    def state_dict(self) -> dict:
        return {"size": self.size, "epoch": self.epoch, "index": self.index, "order": self.order}

    def load_state_dict(self, state: dict) -> None:
        self.size, self.epoch, self.index, self.order = state["size"], state["epoch"], state["index"], state["order"]


def train_step(
    model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor
) -> tuple[float, float]:
    """One SGD step on the minibatch; returns its (loss, accuracy) before the update."""
    model.train()
    logits = model(x)
    loss = nn.functional.cross_entropy(logits, y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    accuracy = (logits.argmax(dim=1) == y).float().mean()
    return loss.item(), accuracy.item()


def train(
    run,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    data: tuple[torch.Tensor, torch.Tensor],
    generator: torch.Generator,
    *,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    batches: Batches,
    start_step: int,
    steps: int,
    batch_size: int,
    checkpoint_every: int = 0,
    fail_at_step: int | None = None,
    add_dataset_at_step: int | None = None,
    stage_ids: list[int] | None = None,
    stop: preemption.Preemption | None = None,
) -> dict:
    """Run steps ``start_step .. steps-1``, logging ``train.loss`` and ``train.accuracy`` at each step index.

    Every ``checkpoint_every`` steps the state is saved with ``step`` = steps
    completed; reaching ``fail_at_step`` raises ``SimulatedFailure``. From
    ``add_dataset_at_step`` on the batches come from ``with_added_dataset``;
    when that switch happens in this loop the stage is recorded with
    ``stage_ids`` (a run resumed past it starts on the switched data). Once
    ``stop`` saw a stop signal, the step's state is saved (the checkpoint
    records the signal) and the program exits as preempted.
    """
    if add_dataset_at_step is not None and start_step > add_dataset_at_step:
        data = with_added_dataset(data)  # the restored data position is already on it
    x, y = data
    loss = accuracy = float("nan")
    last_checkpoint_id = None
    with tempfile.TemporaryDirectory(prefix="mado-example-ckpt-") as scratch:
        for step in range(start_step, steps):
            if step == fail_at_step:
                raise SimulatedFailure(f"--fail-at-step {fail_at_step}: stopping at step {step}")
            if step == add_dataset_at_step:
                # switch the loader first, then record (docs/design/runs.md#data-stages-sdk)
                x, y = with_added_dataset(data)
                batches.resize(x.shape[0])
                record_stage(run, step, stage_ids or [], last_checkpoint_id)
            index = batches.next(generator)
            inputs = x[index] + AUGMENT_STD * torch.randn(len(index), x.shape[1])
            loss, accuracy = train_step(model, optimizer, inputs, y[index])
            scheduler.step()
            run.log_metrics({"train.loss": loss, "train.accuracy": accuracy}, step=step)
            stopping = stop is not None and stop.requested
            if stopping or (checkpoint_every and (step + 1) % checkpoint_every == 0):
                save_checkpoint(
                    scratch,
                    model=model,
                    optimizer=optimizer,
                    scheduler=scheduler,
                    data_position=batches,
                    step=step + 1,
                    generators={"batches": generator},
                )
                Path(scratch, DATA_FILE).write_text(
                    json.dumps(
                        {
                            "dataset_version_ids": trained_on(
                                stage_ids if add_dataset_at_step is not None and step >= add_dataset_at_step else None
                            )
                        }
                    )
                )
                saved = run.log_checkpoint(
                    scratch,
                    step=step + 1,
                    includes_optimizer=True,
                    framework="torch",
                    metadata=stop.metadata() if stopping else None,
                )
                last_checkpoint_id = getattr(saved, "id", None)
            if stopping:
                print(f"stop signal {stop.signal_name}: saved step {step + 1}, exiting as preempted", flush=True)
                stop.exit()
    return {"train.loss": loss, "train.accuracy": accuracy}


def trained_on(stage_ids: list[int] | None) -> list[int]:
    """The dataset version ids in force: the stage's once it switched, else ``MMT_DATASET_VERSION_IDS``."""
    if stage_ids:
        return sorted(stage_ids)
    return sorted(int(part) for part in os.environ.get(ENV_DATASET_VERSION_IDS, "").split(",") if part.strip())


def reset_on_changed_mix(
    checkpoint_dir, generator: torch.Generator, batches: Batches, *, seed: int, start_step: int
) -> bool:
    """After a continue with another data mix: restart the batch order; True when it did (and said so).

    The checkpoint's ``data.json`` names what it was trained on; ``MMT_START_KIND`` / ``MMT_DATASET_VERSION_IDS``
    what this Job trains on. A plain resume (or the same mix) keeps the restored position.
    """
    if os.environ.get("MMT_START_KIND") != "continue":
        return False
    try:
        before = sorted(json.loads(Path(checkpoint_dir, DATA_FILE).read_text())["dataset_version_ids"])
    except (OSError, ValueError, KeyError, TypeError):
        return False
    now = trained_on(None)
    if now == before:
        return False
    generator.manual_seed(seed + start_step)
    batches.resize(batches.size)
    print(
        f"data mix changed from dataset versions {before} to {now} at step {start_step}: "
        "data position reset (batches drawn afresh from the new mix)",
        flush=True,
    )
    return True


def record_stage(run, step: int, ids: list[int], checkpoint_id) -> None:
    """Record the data stage that starts at ``step`` (online only: an offline run says so and goes on)."""
    if getattr(run, "offline", False):
        print(
            f"offline: training on the added dataset from step {step}; data stage not recorded (online only)",
            flush=True,
        )
        return
    stage = run.log_training_data_stage(
        step, ids, checkpoint_id=checkpoint_id, metadata={"note": "added a noisy copy of the digits"}
    )
    print(f"data stage {stage['id']} from step {step}: dataset versions {stage['dataset_version_ids']}", flush=True)


def weights_json(model: nn.Module) -> str:
    """The weights as JSON text, ``{name: flat list of floats}`` in ``state_dict`` order (shortest exact repr)."""
    return json.dumps({name: tensor.detach().flatten().tolist() for name, tensor in model.state_dict().items()}) + "\n"


def write_weights(output: str, model: nn.Module) -> None:
    """``weights_json(model)`` into the file ``output`` (its directory created)."""
    Path(output).parent.mkdir(parents=True, exist_ok=True)
    Path(output).write_text(weights_json(model), encoding="utf-8")


def break_resume(variant: str, *, seed: int, optimizer, scheduler, batches: Batches, generator: torch.Generator):
    """What ``--variant`` does right after the checkpoint was loaded; returns ``(scheduler, generator)`` to train
    with (docs/jobs.md, "What makes a training loop resumable")."""
    if variant == "rebuild-scheduler":
        scheduler = make_scheduler(optimizer)
    elif variant == "reseed-rng":
        generator = seed_everything(seed)
    elif variant == "restart-data":
        batches.index = 0
    print(f"variant {variant}: the resume leaves part of the training state unrestored on purpose", flush=True)
    return scheduler, generator


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    generator = seed_everything(args.seed)
    data = load_data()
    model = build_model()
    optimizer = make_optimizer(model, args.lr)
    scheduler = make_scheduler(optimizer)
    batches = Batches(data[0].shape[0], args.batch_size)
    parameters = {
        "steps": args.steps,
        "lr": args.lr,
        "batch_size": args.batch_size,
        "seed": args.seed,
        "hidden": HIDDEN,
        "momentum": MOMENTUM,
        "optimizer": "sgd",
        "lr_schedule": f"warmup {WARMUP_STEPS}, decay {LR_DECAY}",
        "augment_std": AUGMENT_STD,
        "dataset": "sklearn.digits",
    }
    offline_dir = Path(args.output).parent if args.offline and args.output else None
    started = time.monotonic()
    try:
        with mado_tracking.start_run(
            project=args.project,
            name=args.name,
            kind="training",
            parameters=parameters,
            offline=True if args.offline else None,
            output=offline_dir,
        ) as run:
            label = "offline run" if run.id is None else f"run {run.id}"
            print(f"{label} ({run.external_id}): {run.url}", flush=True)
            start_step = 0
            checkpoint = run.resume_checkpoint()
            if checkpoint is not None:
                if args.variant != "ignore-checkpoint":
                    load_checkpoint(
                        checkpoint.path,
                        model=model,
                        optimizer=optimizer,
                        scheduler=scheduler,
                        data_position=batches,
                        generators={"batches": generator},
                    )
                start_step = checkpoint.step
                print(f"resuming from checkpoint {checkpoint.id} at step {start_step}", flush=True)
                reset_on_changed_mix(checkpoint.path, generator, batches, seed=args.seed, start_step=start_step)
                if args.variant:
                    scheduler, generator = break_resume(
                        args.variant,
                        seed=args.seed,
                        optimizer=optimizer,
                        scheduler=scheduler,
                        batches=batches,
                        generator=generator,
                    )
            if start_step >= args.steps:
                print(
                    f"nothing to train: the checkpoint is at step {start_step} and the run has {args.steps} steps; "
                    f"continue it with a code version whose --steps is higher",
                    flush=True,
                )
            final = train(
                run,
                model,
                optimizer,
                data,
                generator,
                scheduler=scheduler,
                batches=batches,
                start_step=start_step,
                steps=args.steps,
                batch_size=args.batch_size,
                checkpoint_every=args.checkpoint_every,
                fail_at_step=args.fail_at_step,
                stop=preemption.install(run),
                add_dataset_at_step=args.add_dataset_at_step,
                stage_ids=getattr(args, "stage_ids", None),
            )
    except SimulatedFailure as failure:
        print(f"failed: {failure}", file=sys.stderr, flush=True)
        return 1
    if args.output:
        write_weights(args.output, model)
    print(
        f"steps {start_step}..{args.steps} in {time.monotonic() - started:.1f} s: "
        f"train.loss {final['train.loss']:.4f}, train.accuracy {final['train.accuracy']:.3f}",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
