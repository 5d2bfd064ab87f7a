"""Train a tiny BERT classifier with the Hugging Face Trainer and log it to mado with ``MadoCallback``
(docs/integrations.md; docs/design/resume.md#in-the-code, #steps-continue; docs/design/runs.md#preemption).

The model is built from a config (one layer, hidden size 32, a vocabulary of 100 tokens: nothing is downloaded)
and learns a rule over generated token ids (seeded): is the first token in the upper half of the vocabulary?
Deterministic on CPU: the same ``--seed`` gives the same weights, byte for byte.

    MMT_API_URL=http://127.0.0.1:8000 MMT_API_TOKEN=... MMT_PROJECT=demo \\
        python examples/hf_trainer.py --steps 40 --checkpoint-every 10

The two mado lines are ``callbacks=[MadoCallback(...)]`` and
``trainer.train(resume_from_checkpoint=resume_from_checkpoint(trainer))``: the Trainer's logs become metrics at
its global step (``train/loss``, ``train/learning_rate``, ``train/grad_norm``, ``eval/loss`` …), each
``checkpoint-N`` it saves becomes the Run's Checkpoint at step N, a resumed Job (or a same-run resume) continues
from the checkpoint it was given and ends with the weights an uninterrupted run has, and SIGTERM saves a
checkpoint before the program exits as preempted. ``--fail-at-step S`` raises at global step S;
``--output PATH`` writes the final weights (safetensors of the state dict, byte-comparable); ``--offline`` needs
no server and records into the directory of ``--output``.
"""

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a config-built model: nothing to fetch, never ask a hub
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402 - after the offline switches
from safetensors.torch import save_file  # noqa: E402
from transformers import (  # noqa: E402
    BertConfig,
    BertForSequenceClassification,
    Trainer,
    TrainerCallback,
    TrainingArguments,
    set_seed,
)

from mado_tracking.integrations.transformers import MadoCallback, resume_from_checkpoint  # noqa: E402

VOCAB = 100
LENGTH = 16
TRAIN_EXAMPLES = 256
EVAL_EXAMPLES = 64
DATA_SEED = 1234  # the data set is the same in every process, whatever --seed is


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=40, help="optimizer steps (default 40)")
    parser.add_argument("--checkpoint-every", type=int, default=10, metavar="K", help="save every K steps (0: never)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the model, dropout and data order (default 0)")
    parser.add_argument("--lr", type=float, default=5e-3, help="peak learning rate (default 0.005)")
    parser.add_argument("--project", default=None, help="mado project slug (default: $MMT_PROJECT)")
    parser.add_argument("--name", default=None, help="name of the Run")
    parser.add_argument("--fail-at-step", type=int, default=None, metavar="S", help="raise at global step S")
    parser.add_argument("--output", default=None, metavar="PATH", help="write the final weights (safetensors)")
    parser.add_argument(
        "--output-dir",
        default="hf-trainer-output",
        help="the Trainer's output_dir, shared by all processes under torchrun (default ./hf-trainer-output)",
    )
    parser.add_argument("--offline", action="store_true", help="no server: record into the directory of --output")
    parser.add_argument(
        "--gpu", action="store_true", help="train on the GPU (default: the CPU, byte-comparable across machines)"
    )
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error("--steps must be >= 1")
    if args.checkpoint_every < 0:
        parser.error("--checkpoint-every must be >= 0")
    return args


class SimulatedFailure(RuntimeError):
    """Raised by ``--fail-at-step``."""


class FailAtStep(TrainerCallback):
    """Raise ``SimulatedFailure`` once the Trainer completed global step ``step`` (before it logs or saves it)."""

    def __init__(self, step: int):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            raise SimulatedFailure(f"--fail-at-step {self.step}: stopping at global step {state.global_step}")


class TokenRule(torch.utils.data.Dataset):
    """``count`` sequences of ``LENGTH`` token ids in 1..VOCAB-1; label 1 when the first token is >= VOCAB / 2."""

    def __init__(self, count: int, seed: int):
        generator = torch.Generator().manual_seed(seed)
        self.input_ids = torch.randint(1, VOCAB, (count, LENGTH), generator=generator)
        self.labels = (self.input_ids[:, 0] >= VOCAB // 2).long()

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> dict:
        ids = self.input_ids[index]
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": self.labels[index]}


def build_model() -> BertForSequenceClassification:
    config = BertConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=LENGTH,
        num_labels=2,
    )
    return BertForSequenceClassification(config)


def training_arguments(args: argparse.Namespace, output_dir: str) -> TrainingArguments:
    every = args.checkpoint_every
    return TrainingArguments(
        output_dir=output_dir,
        max_steps=args.steps,
        per_device_train_batch_size=8,
        gradient_accumulation_steps=2,
        learning_rate=args.lr,
        lr_scheduler_type="linear",
        warmup_steps=5,
        logging_steps=1,
        save_strategy="steps" if every else "no",
        save_steps=every or 500,
        eval_strategy="steps" if every else "no",
        eval_steps=every or None,
        per_device_eval_batch_size=32,
        seed=args.seed,
        data_seed=args.seed,
        use_cpu=not args.gpu,
        report_to="none",
        disable_tqdm=True,  # one printed line per log instead of a progress bar
        dataloader_num_workers=0,
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    set_seed(args.seed)
    model = build_model()
    offline = {"offline": True, "output": Path(args.output).parent} if args.offline and args.output else {}
    if args.offline and not offline:
        offline = {"offline": True}
    mado = MadoCallback(project=args.project, name=args.name, **offline)
    callbacks = [mado] + ([FailAtStep(args.fail_at_step)] if args.fail_at_step is not None else [])
    started = time.monotonic()
    trainer = Trainer(
        model=model,
        args=training_arguments(args, args.output_dir),
        train_dataset=TokenRule(TRAIN_EXAMPLES, DATA_SEED),
        eval_dataset=TokenRule(EVAL_EXAMPLES, DATA_SEED + 1),
        callbacks=callbacks,
    )
    checkpoint = resume_from_checkpoint(trainer)  # starts the Run; None unless resuming
    print(f"run {mado.run.id} ({mado.run.external_id}): {mado.run.url}", flush=True)
    if checkpoint is not None:
        print(f"resuming from {checkpoint}", flush=True)
    try:
        with mado.run:  # leaving the block finishes the Run: failed on an exception, preempted on a stop signal
            result = trainer.train(resume_from_checkpoint=checkpoint)
    except SimulatedFailure as failure:
        print(f"failed: {failure}", file=sys.stderr, flush=True)
        return 1
    if args.output:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        save_file({key: value.contiguous() for key, value in model.state_dict().items()}, args.output)
    seconds = time.monotonic() - started
    print(f"global steps {result.global_step} in {seconds:.1f} s: mean loss {result.training_loss:.4f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
