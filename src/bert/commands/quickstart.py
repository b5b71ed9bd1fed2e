"""`bert quickstart`: the whole pipeline on built-in data, in a few minutes on a CPU.

1. create-pretraining-data on a built-in corpus (two public-domain novels from Project Gutenberg,
   already one sentence per line: Austen's "Pride and Prejudice" and Dickens's "Hard Times");
2. pretrain a BERT-Tiny-shaped model (2 layers, hidden 128) with masked LM and next sentence;
3. fine-tune it on a built-in classification set, "who wrote this sentence, Austen or Dickens?", with
   sentences from two *other* novels ("Sense and Sensibility", "Bleak House"), and evaluate;
4. fine-tune the same shape from random initialisation, so the value of pre-training shows.

Every step is the real command with its real flags (they are printed), so each can be rerun or scaled
up by hand. The data's provenance is in `bert/data/quickstart/README.md`; `tools/make_quickstart_data.py`
rebuilds it.
"""

from __future__ import annotations

import gzip
import shutil
import sys
import time
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from bert.commands.classify import ClassifyArgs, run_classify
from bert.commands.create_pretraining_data import CreatePretrainingDataArgs, run_create_pretraining_data
from bert.commands.pretrain import PretrainArgs, run_pretrain
from bert.errors import InputError
from bert.flags import FinetuneArgs, TrainingArgs, same_as
from bert.outputs import claim
from bert.plotting import CURVES_NAME, try_plot
from bert.utils import atomic_write, log_to_file, steps_without_result_blocks

_DATA_FILES = ("corpus.txt", "train.tsv", "dev.tsv", "vocab.txt")


@dataclass
class QuickstartArgs:
    """Pre-train a tiny BERT on built-in text, fine-tune and evaluate it: the main job on built-in defaults."""

    # The one command that runs with no flags at all.
    output_dir: str = same_as(TrainingArgs, "output_dir", default="quickstart_output")
    pretrain_steps: int = field(default=400, metadata={"help": "Pre-training steps (batch 32, 64 tokens)."})
    num_train_epochs: float = same_as(FinetuneArgs, "num_train_epochs")
    seed: int = same_as(TrainingArgs, "seed")
    device: str | None = same_as(TrainingArgs, "device")


def _unpack_data(data_dir: Path) -> dict[str, Path]:
    data_dir.mkdir(parents=True, exist_ok=True)
    package = resources.files("bert") / "data" / "quickstart"
    paths = {}
    for name in _DATA_FILES:
        out = data_dir / name
        if not out.exists():
            with (package / f"{name}.gz").open("rb") as raw, gzip.open(raw) as src, atomic_write(out, "wb") as dst:
                shutil.copyfileobj(src, dst)
        paths[name] = out
    return paths


def _flags(args: object) -> str:
    """The command line that runs the same step by hand."""
    values = vars(args)
    return " ".join(f"--{k}={values[k]}" for k in _SHOWN if values.get(k) is not None)


# The flags of the printed command lines, in this order (the others keep their defaults).
_SHOWN = (
    "task_name",
    "input_file",
    "data_dir",
    "output_file",
    "output_dir",
    "vocab_file",
    "bert_config_file",
    "init_checkpoint",
    "has_header",
    "output_format",
    "streaming",
    "do_train",
    "do_eval",
    "max_seq_length",
    "max_predictions_per_seq",
    "dupe_factor",
    "train_batch_size",
    "learning_rate",
    "num_train_steps",
    "num_warmup_steps",
    "num_train_epochs",
    "log_every",
)


def _examples(tsv: Path) -> int:
    with open(tsv, encoding="utf-8") as f:
        return sum(1 for line in f if line.strip()) - 1  # the header


def _seconds_per_step(vocab_file: Path, seq: int, device: str | None) -> float:
    """A quick measurement of this machine: the seconds of one training step (forward, backward, update) of
    the quickstart's model on a batch of 32 x `seq` tokens, the mean of 2 after a warm-up step."""
    # Imported here, not at the top, so that bert.cli reports a flag error before torch loads.
    import torch

    from bert.config import named_config
    from bert.distributed import resolve_device
    from bert.modeling import BertForPreTraining

    vocab_size = sum(1 for _ in open(vocab_file, encoding="utf-8"))
    dev = resolve_device(device)
    model = BertForPreTraining(named_config("tiny", vocab_size)).to(dev).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    generator = torch.Generator().manual_seed(0)
    batch = {
        "input_ids": torch.randint(0, vocab_size, (32, seq), generator=generator),  # [B, T]
        "masked_lm_positions": torch.randint(0, seq, (32, 10), generator=generator),  # [B, P]
        "masked_lm_ids": torch.randint(0, vocab_size, (32, 10), generator=generator),  # [B, P]
        "next_sentence_labels": torch.randint(0, 2, (32,), generator=generator),  # [B]
    }
    batch = {k: v.to(dev) for k, v in batch.items()}
    times = []
    for _ in range(3):
        start = time.perf_counter()
        model(**batch).total_loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        times.append(time.perf_counter() - start)
    return sum(times[1:]) / 2


# A command the quickstart ran, as the summary prints it: its name and its flags.
Step = tuple[str, "CreatePretrainingDataArgs | PretrainArgs | ClassifyArgs"]


def _announce(args: QuickstartArgs, data: dict[str, Path], seq: int) -> None:
    """What the run will do and about how long it takes on this machine (measured now, not a constant)."""
    train = _examples(data["train.tsv"])
    finetune_steps = int(train / 32 * args.num_train_epochs)
    step = _seconds_per_step(data["vocab.txt"], seq, args.device)
    # Fine-tuning batches are shorter sentences than pre-training's 64 tokens; evaluation and data creation
    # add about a fifth (measured on the defaults).
    seconds = 1.2 * step * (args.pretrain_steps + 2 * finetune_steps)
    took = f"{seconds / 60:.0f} min" if seconds >= 90 else f"{seconds:.0f} s"
    print(
        f"bert quickstart: pre-trains a BERT-Tiny for {args.pretrain_steps} steps on two novels, then fine-tunes it "
        f"and a randomly initialised twin ({finetune_steps} steps each, {args.num_train_epochs:g} epochs of {train} "
        f"sentences) to tell Austen from Dickens, and evaluates both.\nAbout {took} on this machine now "
        f"({step:.2f} s per training step, just measured); --pretrain_steps and --num_train_epochs shorten it.",
        file=sys.stderr,
    )


def _print_summary(
    out: Path, data: dict[str, Path], results: dict, stages: list[tuple[str, float]], steps: list[Step]
) -> None:
    """The result block: dev metrics of both fine-tuned models, the time of each stage, where things are."""
    names = list(results)
    keys = sorted({k for r in results.values() for k in r} - {"global_step", "loss"})
    print(f"\nAusten or Dickens? ({_examples(data['dev.tsv'])} dev sentences)")
    print(f"  {'':<16}" + "".join(f"{n:>14}" for n in names))
    for key in keys:
        print(f"  {key:<16}" + "".join(f"{results[n].get(key, float('nan')):>14.3f}" for n in names))
    gain = results["pre-trained"]["eval_accuracy"] - results["random init"]["eval_accuracy"]
    print(f"Pre-training changed dev accuracy by {gain:+.3f}.")
    width = max(len(title) for title, _ in stages) + 2
    print(f"\n  {'stage':<{width}}{'time':>7}")
    for title, seconds in stages:
        print(f"  {title:<{width}}{seconds:>5.0f} s")
    print(f"  {'in all':<{width}}{sum(s for _, s in stages):>5.0f} s")
    print(f"\nWritten under {out}/: log.txt (everything the steps logged), curves.png (training curves, pre-trained")
    print("vs random init), pretrain/ and classify*/ (models in model/, eval_results.txt, curves.png, log.txt).")
    print("The steps, to rerun or scale up by hand:")
    for title, step_args in steps:
        print(f"  {title} {_flags(step_args)}")
    print("Next: README.md shows the same commands on GLUE, SQuAD and your own text; `bert plot` compares runs.")


def run_quickstart(args: QuickstartArgs) -> dict:
    """Run the four steps (module docstring) with everything they log in `--output_dir/log.txt`; prints
    a table of the results and returns {"pretrain", "pre-trained", "random init": eval results,
    "seconds": {stage: seconds}}."""
    if args.pretrain_steps < 1:
        raise InputError(f"--pretrain_steps={args.pretrain_steps} must be at least 1")
    with claim("quickstart", dirs={"--output_dir": args.output_dir}):
        return _quickstart(args)


def _quickstart(args: QuickstartArgs) -> dict:
    out = Path(args.output_dir)
    with log_to_file(out / "log.txt"), steps_without_result_blocks():
        return _run(args, out)


def _run(args: QuickstartArgs, out: Path) -> dict:
    data = _unpack_data(out / "data")
    seq = 64
    _announce(args, data, seq)
    stages: list[tuple[str, float]] = []  # (title, seconds)
    steps: list[Step] = []
    create = _create_args(args, out, data, seq)
    steps.append(("bert create-pretraining-data", create))
    start = time.perf_counter()
    stats = run_create_pretraining_data(create)
    stages.append((f"create-pretraining-data: {stats['instances']:,} instances", time.perf_counter() - start))

    pretrain = _pretrain_args(args, out, create, seq)
    steps.append(("bert pretrain", pretrain))
    start = time.perf_counter()
    pre = run_pretrain(pretrain)["eval"]
    title = f"pretrain: {args.pretrain_steps} steps, masked LM accuracy {pre['masked_lm_accuracy']:.3f}"
    stages.append((title, time.perf_counter() - start))

    results = {}
    runs = []
    for name, init, config in (
        ("pre-trained", str(out / "pretrain" / "model"), None),
        ("random init", None, str(out / "pretrain" / "model" / "config.json")),
    ):
        classify = _classify_args(args, out, data, seq, init, config)
        steps.append(("bert classify", classify))
        start = time.perf_counter()
        results[name] = run_classify(classify)["eval"]
        stages.append((f"classify: {name}", time.perf_counter() - start))
        runs.append(classify.output_dir)
    try_plot(runs, out / CURVES_NAME, labels=list(results))
    _print_summary(out, data, results, stages, steps)
    return {"pretrain": pre, **results, "seconds": dict(stages)}


def _create_args(args: QuickstartArgs, out: Path, data: dict[str, Path], seq: int) -> CreatePretrainingDataArgs:
    return CreatePretrainingDataArgs(
        input_file=str(data["corpus.txt"]),
        output_file=str(out / "pretraining_data"),
        vocab_file=str(data["vocab.txt"]),
        max_seq_length=seq,
        max_predictions_per_seq=10,
        dupe_factor=3,
        random_seed=args.seed,
        output_format="native",
        streaming=True,
    )


def _pretrain_args(args: QuickstartArgs, out: Path, create: CreatePretrainingDataArgs, seq: int) -> PretrainArgs:
    return PretrainArgs(
        input_file=create.output_file,
        output_dir=str(out / "pretrain"),
        bert_config_file="tiny",
        vocab_file=create.vocab_file,
        do_train=True,
        do_eval=True,
        max_seq_length=seq,
        max_predictions_per_seq=10,
        train_batch_size=32,
        eval_batch_size=32,
        num_train_steps=args.pretrain_steps,
        num_warmup_steps=max(1, args.pretrain_steps // 10),
        learning_rate=3e-4,
        save_checkpoints_steps=args.pretrain_steps,
        max_eval_steps=20,
        seed=args.seed,
        log_every=max(1, args.pretrain_steps // 20),
        device=args.device,
    )


def _classify_args(
    args: QuickstartArgs, out: Path, data: dict[str, Path], seq: int, init: str | None, config: str | None
) -> ClassifyArgs:
    """The fine-tuning run from the pre-trained model (`init`), or from random weights of its `config`."""
    return ClassifyArgs(
        task_name="generic",
        data_dir=str(out / "data"),
        output_dir=str(out / ("classify" if init else "classify_random_init")),
        init_checkpoint=init,
        bert_config_file=config,
        vocab_file=str(data["vocab.txt"]),
        has_header=True,
        do_train=True,
        do_eval=True,
        max_seq_length=seq,
        train_batch_size=32,
        eval_batch_size=64,
        learning_rate=1e-4,
        num_train_epochs=args.num_train_epochs,
        seed=args.seed,
        log_every=5,
        device=args.device,
    )
