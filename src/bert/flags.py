"""The flags several commands share, each defined once: its help text, default and choices live here.

A flag means the same thing in every command that takes it, so `--bert_config_file=tiny` or an
`--init_checkpoint` in any format works wherever a model is built. The groups are dataclasses whose
fields are flags; a command's Args class inherits the groups it takes whole, and takes a single flag of a
group with `same_as(Group, "name")` (the same field; only a default may be overridden, where a command
has a reason). `tests/unit/test_cli.py` walks `bert.cli.COMMANDS` and checks that every flag two
commands share has one help text and one default, except for the differences it lists with their reasons.

No torch here: `bert tokenize` and `bert create-pretraining-data` take flags from these groups too.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from bert.errors import InputError
from bert.utils import DECODE_ERRORS, check_finite_flags

PRECISIONS = ("fp32", "bf16", "fp16")
QUANTIZE_CHOICES = ("none", "int8")
SHAPE_NAMES = "tiny, mini, small, medium, base, large, L-4_H-256, ..."


def same_as(group: type, name: str, **overrides: Any) -> Any:
    """The field `name` of the flag group `group`, for a command that takes this one flag of the group.

    `overrides` (e.g. `default=384`) replace the field's own; the help text is always the group's.
    """
    f = next((f for f in dataclasses.fields(group) if f.name == name), None)
    if f is None:
        raise AttributeError(f"{group.__name__} has no flag {name}")
    kwargs: dict[str, Any] = {"metadata": f.metadata}
    if f.default is not dataclasses.MISSING:
        kwargs["default"] = f.default
    return field(**{**kwargs, **overrides})


@dataclass(kw_only=True)
class ModelArgs:
    """The model a command builds or starts from, and how its text is tokenized."""

    bert_config_file: str | None = field(
        default=None,
        metadata={
            "help": "The config json file corresponding to the pre-trained BERT model. This specifies the model "
            f"architecture. Or a released shape's name: {SHAPE_NAMES} (vocab_size from the vocabulary). "
            "Default: the config beside the checkpoint."
        },
    )
    init_checkpoint: str | None = field(
        default=None,
        metadata={
            "help": "Initial checkpoint (usually from a pre-trained BERT model), in any format: a TF checkpoint "
            "prefix (bert_model.ckpt), a native or transformers directory, or a .safetensors/.bin file."
        },
    )
    vocab_file: str | None = field(
        default=None,
        metadata={
            "help": "The vocabulary file that the BERT model was trained on. Default: the vocab.txt beside the "
            "checkpoint."
        },
    )
    do_lower_case: bool = field(
        default=True,
        metadata={
            "run_defining": "model",
            "help": "Whether to lower case the input text. Should be True for uncased models and False for cased "
            "models.",
        },
    )
    max_seq_length: int = field(
        default=128,
        metadata={
            "run_defining": "train",
            "help": "The maximum total input sequence length after WordPiece tokenization. Sequences longer than "
            "this will be truncated.",
        },
    )


_TPU = "Accepted for compatibility with the original scripts; TPUs are not supported."


@dataclass(kw_only=True)
class TpuCompatArgs:
    """The original scripts' TPU flags, shared by the training commands: accepted so that their command
    lines run unchanged, and ignored, except that --use_tpu must stay false."""

    iterations_per_loop: int = field(
        default=1000, metadata={"help": "How many steps to make in each estimator call. Accepted; no effect."}
    )
    use_tpu: bool = field(default=False, metadata={"help": "Whether to use TPU or GPU/CPU. Must stay false."})
    tpu_name: str | None = field(default=None, metadata={"help": _TPU})
    tpu_zone: str | None = field(default=None, metadata={"help": _TPU})
    gcp_project: str | None = field(default=None, metadata={"help": _TPU})
    master: str | None = field(default=None, metadata={"help": _TPU})
    num_tpu_cores: int = field(default=8, metadata={"help": _TPU})

    def check_no_tpu(self) -> None:
        if self.use_tpu:
            raise InputError("--use_tpu=true is not supported; drop it (CPU and GPU are chosen with --device)")


@dataclass(kw_only=True)
class PerformanceArgs:
    """How the training commands compute a step: flags shared by pretrain and every fine-tuning command."""

    gradient_accumulation_steps: int = field(
        default=1, metadata={"help": "Micro-batches per optimizer step; train_batch_size is split into them."}
    )
    precision: str = field(
        default="fp32",
        metadata={"help": "fp32, bf16 (autocast) or fp16 (autocast and loss scaling).", "choices": list(PRECISIONS)},
    )
    gradient_checkpointing: bool = field(
        default=False, metadata={"help": "Recompute activations in the backward pass: less memory, more compute."}
    )
    compile: bool = field(
        default=False, metadata={"help": "torch.compile the model (eager fallback if compilation fails)."}
    )


@dataclass(kw_only=True)
class GuardArgs:
    """What a training run checks, and the flag that relaxes each check: shared by pretrain and every
    fine-tuning command. Flags whose field metadata has "run_defining" are compared with the run that
    an output directory holds before it is resumed: "train" (the optimisation: batch size, learning rate,
    schedule, seed), "data" (a path to the training data, compared resolved) and "model" (what the model
    is: the task, its labels, the casing; compared also when evaluation or prediction alone reuses it)."""

    max_nonfinite_steps: int = field(
        default=0,
        metadata={
            "help": "Steps whose loss or gradient norm is not finite to skip (their update is not applied; counted "
            "in the logs) before the run stops. 0: stop at the first, keeping the last good checkpoint."
        },
    )
    ignore_checkpoint_digest: bool = field(
        default=False,
        metadata={"help": "Load checkpoints whose tensors do not match the digest saved with them (damaged files)."},
    )
    allow_changed_flags: bool = field(
        default=False,
        metadata={
            "help": "Resume --output_dir with run-defining flags (batch size, learning rate, schedule, task, data) "
            "other than its run's; the change is recorded in args_history.jsonl and the earlier results removed."
        },
    )

    def check_guard_flags(self) -> None:
        check_finite_flags(self)
        if self.max_nonfinite_steps < 0:
            raise InputError(f"--max_nonfinite_steps={self.max_nonfinite_steps} must not be negative")


@dataclass(kw_only=True)
class TrainingArgs(TpuCompatArgs, PerformanceArgs, GuardArgs):
    """The flags of run_pretraining.py and run_classifier.py alike: pretrain and every fine-tuning command."""

    output_dir: str = field(
        metadata={"help": "The output directory where the model checkpoints and results will be written."}
    )
    do_train: bool = field(default=False, metadata={"help": "Whether to run training."})
    do_eval: bool = field(default=False, metadata={"help": "Whether to run eval on the dev set."})
    train_batch_size: int = field(
        default=32, metadata={"run_defining": "train", "help": "Total batch size for training."}
    )
    eval_batch_size: int = field(default=8, metadata={"help": "Total batch size for eval."})
    learning_rate: float = field(
        default=5e-5, metadata={"run_defining": "train", "help": "The initial learning rate for Adam."}
    )
    save_checkpoints_steps: int = field(default=1000, metadata={"help": "How often to save the model checkpoint."})
    save_checkpoints_minutes: float = field(
        default=0.0,
        metadata={
            "help": "Also save a checkpoint once this many minutes have passed since the last one (0: off), so "
            "that a lost worker costs little; under torchrun the ranks save together."
        },
    )
    keep_checkpoint_max: int = field(
        default=5,
        metadata={
            "help": "Keep this many newest checkpoints (fine-tuning with --eval_every_steps also keeps the best "
            "one); 0 keeps all."
        },
    )
    log_every: int = field(default=100, metadata={"help": "Write training metrics every this many steps."})
    seed: int = field(
        default=12345,
        metadata={
            "run_defining": "train",
            "help": "The random seed: initialisation, data order, dropout (and pretrain's dynamic masks).",
        },
    )
    device: str | None = field(default=None, metadata={"help": "torch device; default cuda if available, else cpu."})


@dataclass(kw_only=True)
class InferenceArgs:
    """A model run on raw text: predict, embed and fill-mask (serve takes some of these flags)."""

    do_lower_case: bool | None = field(
        default=None, metadata={"help": "Lower-case the input; default: the model's tokenizer_config.json."}
    )
    batch_size: int = field(default=32, metadata={"help": "Sequences per forward pass."})
    device: str | None = same_as(TrainingArgs, "device")
    quantize: str = field(
        default="none",
        metadata={
            "help": "int8: quantize the Linear layers for CPU inference (bert.quantization; outputs move by about "
            "one percent).",
            "choices": list(QUANTIZE_CHOICES),
        },
    )

    def predictor_settings(self) -> dict[str, Any]:
        """The keywords of `bert.inference.Predictor.from_pretrained` these flags set (checked first)."""
        if self.batch_size < 1:
            raise InputError(f"--batch_size={self.batch_size} must be at least 1")
        return {
            "device": self.device,
            "batch_size": self.batch_size,
            "do_lower_case": self.do_lower_case,
            "quantize": self.quantize,
        }


@dataclass(kw_only=True)
class MaskingArgs:
    """How masked-LM instances are drawn: create-pretraining-data's flags, which pretrain checks its data
    against (and uses itself with --dynamic_masking)."""

    max_predictions_per_seq: int = field(
        default=20, metadata={"run_defining": "train", "help": "Maximum number of masked LM predictions per sequence."}
    )
    do_whole_word_mask: bool = field(
        default=False,
        metadata={
            "run_defining": "train",
            "help": "Whether to use whole word masking rather than per-WordPiece masking (pretrain: with "
            "--dynamic_masking).",
        },
    )


@dataclass(kw_only=True)
class ShardArgs:
    """One share of a job split over many machines or array tasks (create-pretraining-data, embed): each run
    takes --shard_index of --num_shards, writes its own output, and the outputs together are those of one
    unsharded run."""

    num_shards: int = field(
        default=1,
        metadata={
            "help": "Split the work over this many runs (machines, array tasks), each with its own --shard_index; "
            "their outputs together are those of one run."
        },
    )
    shard_index: int = field(default=0, metadata={"help": "Which of the --num_shards this run does (0-based)."})

    def check_shard_flags(self) -> None:
        if self.num_shards < 1:
            raise InputError(f"--num_shards={self.num_shards} must be at least 1")
        if not 0 <= self.shard_index < self.num_shards:
            raise InputError(
                f"--shard_index={self.shard_index} must be between 0 and --num_shards-1 = {self.num_shards - 1}"
            )


@dataclass(kw_only=True)
class CorpusArgs:
    """Reading many text files: prepare-corpus and create-pretraining-data."""

    decode_errors: str = field(
        default="strict",
        metadata={
            "help": "Undecodable bytes: strict (an error naming the file and line), ignore (drop them, as the "
            "original did silently) or replace (U+FFFD).",
            "choices": DECODE_ERRORS,
        },
    )
    num_workers: int = field(
        default=1,
        metadata={"help": "Worker processes (create-pretraining-data: more than 1 implies --streaming)."},
    )
