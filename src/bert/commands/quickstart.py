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
import logging
import shutil
import time
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from bert.commands.classify import ClassifyArgs, run_classify
from bert.commands.create_pretraining_data import CreatePretrainingDataArgs, run_create_pretraining_data
from bert.commands.pretrain import PretrainArgs, run_pretrain
from bert.errors import InputError
from bert.outputs import claim
from bert.utils import atomic_write

logger = logging.getLogger(__name__)

_DATA_FILES = ("corpus.txt", "train.tsv", "dev.tsv", "vocab.txt")


@dataclass
class QuickstartArgs:
    """Pre-train a tiny BERT on built-in text, fine-tune and evaluate it: the main job on built-in defaults."""

    output_dir: str = field(default="quickstart_output", metadata={"help": "Where every step writes its files."})
    pretrain_steps: int = field(default=400, metadata={"help": "Pre-training steps (batch 32, 64 tokens)."})
    num_train_epochs: float = field(default=3.0, metadata={"help": "Fine-tuning epochs over the 2,000 sentences."})
    seed: int = field(default=12345, metadata={"help": "Seed of the data, the initialisation and the order."})
    device: str | None = field(default=None, metadata={"help": "torch device; default cuda if available, else cpu."})


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
    return " ".join(f"--{k}={v}" for k, v in vars(args).items() if v is not None and k in _SHOWN)


_SHOWN = {
    "input_file",
    "output_file",
    "output_dir",
    "vocab_file",
    "bert_config_file",
    "init_checkpoint",
    "max_seq_length",
    "max_predictions_per_seq",
    "dupe_factor",
    "train_batch_size",
    "num_train_steps",
    "num_warmup_steps",
    "learning_rate",
    "do_train",
    "do_eval",
    "task_name",
    "data_dir",
    "has_header",
    "num_train_epochs",
    "output_format",
    "streaming",
}


def _print_results(title: str, results: dict) -> None:
    print(f"***** Eval results ({title}) *****")
    for key in sorted(results):
        print(f"  {key} = {results[key]}")


def run_quickstart(args: QuickstartArgs) -> dict:
    if args.pretrain_steps < 1:
        raise InputError(f"--pretrain_steps={args.pretrain_steps} must be at least 1")
    with claim("quickstart", dirs={"--output_dir": args.output_dir}):
        return _quickstart(args)


def _quickstart(args: QuickstartArgs) -> dict:
    out = Path(args.output_dir)
    start = time.perf_counter()
    data = _unpack_data(out / "data")
    seq = 64

    steps = []
    create = CreatePretrainingDataArgs(
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
    steps.append(("bert create-pretraining-data", create))
    stats = run_create_pretraining_data(create)

    pretrain = PretrainArgs(
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
    steps.append(("bert pretrain", pretrain))
    pre = run_pretrain(pretrain)

    results = {}
    for name, init, config in (
        ("pre-trained", str(out / "pretrain" / "model"), None),
        ("random init", None, str(out / "pretrain" / "model" / "config.json")),
    ):
        classify = ClassifyArgs(
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
            device=args.device,
        )
        steps.append((f"bert classify ({name})", classify))
        results[name] = run_classify(classify)["eval"]

    print()
    print(f"Pre-training data: {stats.get('instances', '?')} instances from the built-in corpus")
    _print_results(f"pre-training, {args.pretrain_steps} steps", pre["eval"])
    for name, res in results.items():
        _print_results(f"Austen or Dickens?, {name}", res)
    gain = results["pre-trained"]["eval_accuracy"] - results["random init"]["eval_accuracy"]
    print(f"\nPre-training changed dev accuracy by {gain:+.3f} ({time.perf_counter() - start:.0f} s in all).")
    print(f"\nEverything is under {out}/. The steps, to rerun or scale up by hand:")
    for title, step_args in steps:
        print(f"  {title.split(' (')[0]} {_flags(step_args)}")
    print(
        "\nNext: pre-train on your own text with `bert prepare-corpus` and the commands above, fine-tune on "
        "GLUE with `bert classify --task_name=MRPC ...`, or read README.md."
    )
    return {"pretrain": pre["eval"], **results}
