"""The flags several commands share, each defined once: its help text, default and choices live here.

A flag means the same thing in every command that takes it, so `--bert_config_file=tiny` or an
`--init_checkpoint` in any format works wherever a model is built. The groups are dataclasses whose
fields are flags; a command's Args class inherits the groups it takes whole, and takes a single flag of a
group with `same_as(Group, "name")` (the same field; only a default may be overridden, where a command
has a reason). `tests/unit/test_cli.py` walks `bert.cli.COMMANDS` and checks that every flag two
commands share has one help text and one default, except for the differences it lists with their reasons.

Each flag's constraints are written once, in its field's metadata, and `check_flag_values` enforces them for
every command (`bert.cli.main` calls it before a command runs; the training runners call it too, for callers
that build their Args in Python): "choices" (the allowed values; the parser offers them too), "min" and "max"
(inclusive bounds of a number), "positive" (a number above 0). Every float flag must also be finite. A flag
holding a list of values (a grid flag, below) is checked value by value. "model" marks a flag naming a model,
which also takes a Hugging Face Hub id (`bert.hub.resolve_model_flags`, called by `bert.cli.main`).

"grid" (a short name, e.g. "lr") marks the fine-tuning flags that take a comma list of values, each list
making a grid of runs, one per combination (`bert.grid`, which names a cell's directory with the short names).

No torch here: `bert tokenize` and `bert create-pretraining-data` take flags from these groups too.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from bert.errors import InputError
from bert.utils import DECODE_ERRORS

PRECISIONS = ("fp32", "bf16", "fp16")
QUANTIZE_CHOICES = ("none", "int8")
# The engines that run a model for `bert.inference.Predictor` (its `backend`, the inference commands' --backend):
# the torch model, or the ONNX file `bert export` wrote, run by ONNX Runtime on the CPU (`bert.onnx_backend`).
BACKENDS = ("torch", "onnx")
# Sequences per forward pass of a `Predictor` when neither the caller nor a call says (--batch_size): 16 on the CPU
# with the torch backend, where a call's batches, each sorted by length, then pad less and, being more, run side by
# side (`PredictorCore._run`): all-MiniLM-L6-v2 on two cores ran calls of 64 texts of mixed lengths 1.12x-1.46x
# faster than in batches of 32 (float32, bfloat16, int8), and `bert serve` answered more requests at 64 clients
# (bench/RESULTS.md, 2026-11-29); a large sorted input gains nothing. Elsewhere 32: a GPU wants the wider batch,
# and ONNX Runtime splits each batch over its own threads (neither measured against 16).
BATCH_SIZE, CPU_BATCH_SIZE = 32, 16
# And there, by default, a batch holds at most this many tokens (its longest sequence's length times its rows): long
# inputs run in smaller batches, which pad less and run side by side; sentences keep 16 a batch. all-MiniLM-L6-v2 on
# two cores against 16 a batch: calls of 16 and 64 passages of 200-254 tokens 1.26x and 1.06x, one call of 256 the
# same, rerankings of 16 pairs of up to 256 tokens 1.12x, sentences 1.00x-1.02x; 512 gave reranking 1.38x but
# sentences 0.94x-0.96x (bench/RESULTS.md, 2026-11-29). Batches run side by side are evened out under it
# (`bert.inference.core.batch_bounds`: rerankings 1.18x more, 2026-11-30), which 512 had done by chance.
CPU_BATCH_TOKENS = 1024


@dataclass(frozen=True)
class ServeLimits:
    """`bert serve`'s limits, declared once for its flags (`ServeArgs`) and the server's settings
    (`bert.serving.ServeSettings`), whose package needs the serve extra the flags must not."""

    max_batch_tokens: int = 16384
    max_wait_ms: float = 0.0
    max_queue_size: int = 1024
    max_client_batch_size: int = 32
    max_request_bytes: int = 2_000_000


SERVE_LIMITS = ServeLimits()
# The number type the Transformer blocks run in at inference (the inference commands' --dtype, Text Embeddings
# Inference's flag of that name): bfloat16 doubles the GEMM rate on CPUs with AVX512-BF16 or AMX; float16 is for
# CUDA (the CPU has no fast float16 kernels).
INFERENCE_DTYPES = ("float32", "bfloat16", "float16")
# bert embed --precision, bert.retrieval.quantize_embeddings: sentence-transformers' number formats.
# adamw_bert: the original's AdamWeightDecayOptimizer (no bias correction); adamw: torch.optim.AdamW's update
# (bias correction, eps 1e-8), which transformers' and sentence-transformers' trainers use; lamb: large batches.
OPTIMIZERS = ("adamw_bert", "adamw", "lamb")
EMBEDDING_PRECISIONS = ("float32", "int8", "uint8", "binary", "ubinary")
EXPORT_FORMATS = {"onnx": "model.onnx", "torchscript": "model.pt"}  # format -> file name inside a directory
SHAPE_NAMES = "tiny, mini, small, medium, base, large, L-4_H-256, ..."


def check_flag_values(args: object) -> None:
    """Every flag of a dataclass of flags within what its field's metadata allows (see the module docstring).

    A flag left at None ("the model's own", "unset") is not checked.
    """
    if not dataclasses.is_dataclass(args):
        return
    for f in dataclasses.fields(args):
        value = getattr(args, f.name, None)
        if isinstance(value, list) and f.metadata.get("grid"):
            listed = ",".join(map(str, value))
            for v in value:
                _check_value(f, v, f"--{f.name}={listed}: the value {v}")
        else:
            _check_value(f, value, f"--{f.name}={value}")


def _check_value(f: dataclasses.Field, value: Any, flag: str) -> None:
    """One value of flag `f` within its metadata's bounds; `flag` names it in the error."""
    if value is not None and not isinstance(value, bool):
        if isinstance(value, float) and not math.isfinite(value):
            raise InputError(f"{flag} must be a finite number")
        choices = f.metadata.get("choices")
        if choices is not None and value not in choices:
            raise InputError(f"{flag} is not one of {', '.join(map(str, choices))}")
        low, high = f.metadata.get("min"), f.metadata.get("max")
        if low is not None and high is not None and not low <= value <= high:
            raise InputError(f"{flag} must be between {low} and {high}")
        if low is not None and value < low:
            raise InputError(f"{flag} must not be negative" if low == 0 else f"{flag} must be at least {low}")
        if f.metadata.get("positive") and not value > 0:
            raise InputError(f"{flag} must be positive")


def check_backend(backend: str, device: object = None, quantize: str = "none", dashes: str = "") -> None:
    """The settings a backend can honour: ONNX Runtime runs the exported file on the CPU as it was written.
    `dashes` is "--" where the settings are flags."""
    if backend not in BACKENDS:
        raise InputError(f"{dashes}backend={backend!r} must be one of {', '.join(BACKENDS)}")
    if backend != "onnx":
        return
    if quantize != "none":
        raise InputError(
            f"{dashes}backend=onnx runs the exported file as it was written: drop {dashes}quantize={quantize} and "
            "quantize the file instead (`bert export --quantize=int8`)"
        )
    if device is not None and str(device) != "cpu":
        raise InputError(
            f"{dashes}backend=onnx runs on the CPU (ONNX Runtime's CPU provider): drop {dashes}device={device}"
        )


def check_dtype(
    dtype: str, backend: str = "torch", quantize: str = "none", device: object = None, dashes: str = ""
) -> None:
    """The settings a reduced --dtype can be combined with: the torch backend's float weights, and for float16 a
    CUDA device (`device` None: not chosen yet, checked again once it is)."""
    if dtype not in INFERENCE_DTYPES:
        raise InputError(f"{dashes}dtype={dtype!r} must be one of {', '.join(INFERENCE_DTYPES)}")
    if dtype == "float32":
        return
    if dtype == "float16" and device is not None and str(device).split(":")[0] == "cpu":
        raise InputError(
            f"{dashes}dtype=float16 runs on CUDA only: the CPU has no fast float16 kernels; use "
            f"{dashes}dtype=bfloat16 there"
        )
    if backend != "torch":
        raise InputError(
            f"{dashes}dtype={dtype} casts the torch model's weights; {dashes}backend={backend} runs the exported "
            f"file as it was written: drop one of them"
        )
    if quantize != "none":
        raise InputError(
            f"{dashes}quantize={quantize} and {dashes}dtype={dtype} are two ways to a faster model: choose one"
        )


def check_batch_division(train_batch_size: int, world_size: int, gradient_accumulation_steps: int) -> None:
    """The global batch of an optimizer step is split over the processes, then into micro-batches
    (run_pretraining.py and run_classifier.py know one process and no accumulation)."""
    parts = world_size * gradient_accumulation_steps
    if train_batch_size % parts:
        raise InputError(
            f"--train_batch_size={train_batch_size} must be divisible by processes x "
            f"--gradient_accumulation_steps = {world_size} x {gradient_accumulation_steps} = {parts}"
        )


def same_as(group: type, name: str, grid: str | None = None, **overrides: Any) -> Any:
    """The field `name` of the flag group `group`, for a command that takes this one flag of the group.

    `overrides` (e.g. `default=384`) replace the field's own; the help text is always the group's. `grid`
    (a short name) makes it a grid flag (see the module docstring).
    """
    f = next((f for f in dataclasses.fields(group) if f.name == name), None)
    if f is None:
        raise AttributeError(f"{group.__name__} has no flag {name}")
    kwargs: dict[str, Any] = {"metadata": {**f.metadata, "grid": grid} if grid else f.metadata}
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
            "model": True,
            "help": "Initial checkpoint (usually from a pre-trained BERT model), in any format: a TF checkpoint "
            "prefix (bert_model.ckpt), a native or transformers directory, or a .safetensors/.bin file.",
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
            "min": 1,
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
        default=1, metadata={"min": 1, "help": "Micro-batches per optimizer step; train_batch_size is split into them."}
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
class OptimizerArgs:
    """The optimizer of a training command: the original's by default, a bias-corrected AdamW on request."""

    optimizer: str = field(
        default="adamw_bert",
        metadata={
            "run_defining": "train",
            "help": "adamw_bert (the original AdamWeightDecayOptimizer, no bias correction), adamw (torch's AdamW: "
            "bias correction, eps 1e-8, as transformers' and sentence-transformers' trainers) or lamb (large batches).",
            "choices": list(OPTIMIZERS),
        },
    )
    weight_decay: float = field(
        default=0.01,
        metadata={
            "run_defining": "train",
            "min": 0,
            "help": "Decoupled weight decay rate; LayerNorm weights and biases are never decayed (the original's "
            "exclusions).",
        },
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
            "min": 0,
            "help": "Steps whose loss or gradient norm is not finite to skip (their update is not applied; counted "
            "in the logs) before the run stops. 0: stop at the first, keeping the last good checkpoint.",
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


@dataclass(kw_only=True)
class TrainingArgs(TpuCompatArgs, PerformanceArgs, OptimizerArgs, GuardArgs):
    """The flags of run_pretraining.py and run_classifier.py alike: pretrain and every fine-tuning command."""

    output_dir: str = field(
        metadata={"help": "The output directory where the model checkpoints and results will be written."}
    )
    do_train: bool = field(default=False, metadata={"help": "Whether to run training."})
    do_eval: bool = field(default=False, metadata={"help": "Whether to run eval on the dev set."})
    train_batch_size: int = field(
        default=32, metadata={"run_defining": "train", "min": 1, "help": "Total batch size for training."}
    )
    eval_batch_size: int = field(default=8, metadata={"min": 1, "help": "Total batch size for eval."})
    learning_rate: float = field(
        default=5e-5,
        metadata={"run_defining": "train", "positive": True, "help": "The initial learning rate for Adam."},
    )
    save_checkpoints_steps: int = field(
        default=1000, metadata={"min": 1, "help": "How often to save the model checkpoint."}
    )
    save_checkpoints_minutes: float = field(
        default=0.0,
        metadata={
            "min": 0,
            "help": "Also save a checkpoint once this many minutes have passed since the last one (0: off), so "
            "that a lost worker costs little; under torchrun the ranks save together.",
        },
    )
    keep_checkpoint_max: int = field(
        default=5,
        metadata={
            "min": 0,
            "help": "Keep this many newest checkpoints (fine-tuning with --eval_every_steps also keeps the best "
            "one); 0 keeps all.",
        },
    )
    log_every: int = field(default=100, metadata={"min": 1, "help": "Write training metrics every this many steps."})
    seed: int = field(
        default=12345,
        metadata={
            "run_defining": "train",
            "help": "The random seed: initialisation, data order, dropout (and pretrain's dynamic masks).",
        },
    )
    device: str | None = field(default=None, metadata={"help": "torch device; default cuda if available, else cpu."})


@dataclass(kw_only=True)
class FinetuneArgs(ModelArgs, TrainingArgs):
    """Flags shared by the fine-tuning commands: run_classifier.py's, plus training options."""

    data_dir: str = field(
        metadata={
            "run_defining": "data",
            "help": "The input data dir. Should contain the data files (train, dev, test) for the task.",
        }
    )
    do_predict: bool = field(
        default=False, metadata={"help": "Whether to run the model in inference mode on the test set."}
    )
    predict_batch_size: int = field(default=8, metadata={"min": 1, "help": "Total batch size for predict."})
    num_train_epochs: float = field(
        default=3.0,
        metadata={
            "run_defining": "train",
            "positive": True,
            "grid": "ep",
            "help": "Total number of training epochs to perform.",
        },
    )
    warmup_proportion: float = field(
        default=0.1,
        metadata={
            "run_defining": "train",
            "min": 0,
            "max": 1,
            "help": "Proportion of training to perform linear learning rate warmup for. "
            "E.g., 0.1 = 10 percent of training.",
        },
    )
    # A recipe's short form (the README's "Shortened" lines): the same command on the head of its data.
    max_train_examples: int = field(
        default=0,
        metadata={
            "run_defining": "data",
            "min": 0,
            "help": "Train on the first N training examples only, and the first N of --transfer_file (0: all).",
        },
    )
    max_eval_examples: int = field(
        default=0,
        metadata={
            "min": 0,
            "help": "Evaluate and predict on the first N examples only (0: all); in retrieval evaluation the first N "
            "queries, searched among every document of the split.",
        },
    )
    eval_every_steps: int = field(
        default=0,
        metadata={
            "min": 0,
            "help": "Evaluate on the dev set every this many steps and keep the best checkpoint; the final eval and "
            "predictions then use it. 0: evaluate only at the end.",
        },
    )
    early_stopping_patience: int = field(
        default=0,
        metadata={
            "min": 0,
            "help": "Stop training after this many evaluations (--eval_every_steps) without improvement. 0: off.",
        },
    )
    metric_for_best_model: str | None = field(
        default=None,
        metadata={
            "help": "The eval_results key that picks the best checkpoint (e.g. eval_accuracy, eval_f1; a key "
            "containing 'loss' is minimised). Default: the task's main metric."
        },
    )
    group_by_length: bool = field(
        default=True,
        metadata={
            "run_defining": "train",
            "help": "Batch sequences of similar length together (within shuffled groups of 50 batches).",
        },
    )
    pad_to_max_seq_length: bool = field(
        default=False,
        metadata={"help": "Pad every batch to max_seq_length as the original does (slower, same results)."},
    )
    # Fine-tuning checkpoints are only resumption points (the model is exported to model/), and runs are
    # hundreds of steps long, not hundreds of thousands.
    keep_checkpoint_max: int = same_as(TrainingArgs, "keep_checkpoint_max", default=1)
    log_every: int = same_as(TrainingArgs, "log_every", default=50)
    # The fine-tuning grid (bert.grid): these two and --num_train_epochs take comma lists. A list is held in
    # the field until `run_finetune` (or the sentence commands' `run_command`) expands the grid into runs of one
    # value each.
    train_batch_size: int = same_as(TrainingArgs, "train_batch_size", grid="bs")
    learning_rate: float = same_as(TrainingArgs, "learning_rate", grid="lr")
    grid_jobs: int = field(
        default=1,
        metadata={
            "min": 1,
            "help": "With comma lists of --learning_rate, --train_batch_size or --num_train_epochs (a grid of runs, "
            "one per combination): run this many at once, each a process with its share of the CPU threads.",
        },
    )


LAYERS_FLAG = "--init_from_teacher_layers"


def parse_layer_list(value: str, flag: str = LAYERS_FLAG) -> list[int]:
    """`"0,2,4"` -> [0, 2, 4] (order and repeats are checked against the teacher, `bert.distillation`)."""
    try:
        return [int(x) for x in value.split(",")]
    except ValueError:
        raise InputError(
            f"{flag}={value!r}: give the teacher's layer indices separated by commas, e.g. 0,2,4"
        ) from None


@dataclass(kw_only=True)
class TeacherArgs:
    """A larger model a training run learns from (`bert.distillation`): every training command that starts
    from a model (`bert.starting_model`) can start from some of its layers; the commands that distil take
    `DistillArgs`, the others these two flags alone."""

    # Whether the command learns from the teacher's outputs, not only its layers: DistillArgs' commands, and
    # pretrain, which distils on-line with its own flags.
    distils: ClassVar[bool] = False

    teacher: str | None = field(
        default=None,
        metadata={
            "model": True,
            "run_defining": "data",
            "help": "A larger model to learn from (a model directory or checkpoint; for classify, ner and squad "
            "a fine-tuned one, such as OUTPUT/model of `bert classify`): its outputs are soft labels where the "
            "command distils (see --distill_alpha), and --init_from_teacher_layers starts the student from its "
            "layers.",
        },
    )
    init_from_teacher_layers: str | None = field(
        default=None,
        metadata={
            "run_defining": "train",
            "help": "Start the student from these layers of --teacher (comma separated, e.g. 0,2,4: DistilBERT's "
            "every other layer): the teacher's config with that many layers, its embeddings, pooler and heads, "
            "and block i from the teacher's block layers[i]. Instead of --init_checkpoint.",
        },
    )

    def teacher_layers(self) -> list[int] | None:
        """--init_from_teacher_layers as indices (None when unset)."""
        if self.init_from_teacher_layers is None:
            return None
        return parse_layer_list(self.init_from_teacher_layers)

    def check_teacher_flags(self, init_checkpoint: str | None = None) -> None:
        """What metadata cannot say: a teacher's layers need the teacher and replace --init_checkpoint."""
        if self.init_from_teacher_layers is None:
            return
        if self.teacher is None:
            raise InputError(
                f"{LAYERS_FLAG}={self.init_from_teacher_layers} needs --teacher=MODEL, the model to take them from"
            )
        if init_checkpoint:
            raise InputError(
                f"{LAYERS_FLAG} and --init_checkpoint={init_checkpoint} both choose the starting weights: drop one"
            )
        self.teacher_layers()


TEACHER_CACHE = "teacher_cache"  # in --output_dir unless --teacher_cache_dir says otherwise


def teacher_cache_dir(given: str | None, output_dir: str | os.PathLike[str]) -> Path:
    """Where a run caches its teacher's outputs: `--teacher_cache_dir`, else OUTPUT_DIR/teacher_cache (a grid
    gives its cells one, `bert.grid.expand`)."""
    return Path(given) if given else Path(output_dir) / TEACHER_CACHE


@dataclass(kw_only=True)
class DistillArgs(TeacherArgs):
    """Knowledge distillation (`bert.distillation`): the training commands that learn from a teacher's outputs."""

    distils: ClassVar[bool] = True

    transfer_file: str | None = field(
        default=None,
        metadata={
            "run_defining": "data",
            "help": "Unlabelled examples in the command's own input format, the test set's where it has one (GLUE: "
            "test.tsv's layout; ner: CoNLL lines, the word first, tags ignored; squad: SQuAD JSON, answers ignored), "
            "labelled by --teacher and trained on with the distillation loss alone; training steps count them.",
        },
    )
    temperature: float = field(
        default=1.0,
        metadata={
            "run_defining": "train",
            "positive": True,
            "help": "Softmax temperature T of the distillation loss, KL(softmax(teacher/T) || softmax(student/T)) * "
            "T^2 (soft targets); above 1 shows the student more of the teacher's ranking of the wrong labels.",
        },
    )
    distill_alpha: float = field(
        default=0.5,
        metadata={
            "run_defining": "train",
            "min": 0,
            "max": 1,
            "help": "Weight of the distillation term on labelled examples: loss = alpha * KD + (1 - alpha) * label "
            "loss (0.5: both equally, at T=1 on the same scale; 1: the teacher's soft labels alone, as the small "
            "BERT models' distillation). Transfer examples have no label: KD only.",
        },
    )
    teacher_cache_dir: str | None = field(
        default=None,
        metadata={
            "help": "Where the teacher's outputs are cached (computed once, reused every epoch and on resume). "
            "Default: OUTPUT_DIR/teacher_cache (a grid's: one for all its cells)."
        },
    )
    teacher_dtype: str = field(
        default="float32",
        metadata={
            "run_defining": "train",
            "choices": list(INFERENCE_DTYPES),
            "help": "Run the --teacher's Transformer blocks in this dtype (bfloat16: faster on a CPU with bfloat16 "
            "instructions and on GPUs; float16: CUDA only). A cached teacher's outputs are kept apart per setting.",
        },
    )
    teacher_quantize: str = field(
        default="none",
        metadata={
            "run_defining": "train",
            "choices": list(QUANTIZE_CHOICES),
            "help": "int8: run the --teacher quantized to dynamic int8 (CPU; as `bert predict --quantize=int8`), "
            "faster for the labelling of a large transfer set at a small cost in its outputs' precision.",
        },
    )

    # The flags of the teacher's outputs: set where no output is learned, they would do nothing.
    output_flags: ClassVar[tuple[str, ...]] = (
        "transfer_file",
        "temperature",
        "teacher_cache_dir",
        "teacher_dtype",
        "teacher_quantize",
    )

    def check_outputs_learned(self, instead: str) -> None:
        """For a run that learns none of the teacher's outputs (`instead` says what it does): the flags that shape
        them are errors."""
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        given = [f"--{n}={getattr(self, n)}" for n in self.output_flags if getattr(self, n) != defaults[n]]
        if given:
            raise InputError(f"{', '.join(given)}: no teacher output is learned here ({instead}); remove it")

    def check_distill_flags(self, init_checkpoint: str | None = None) -> None:
        """Flags that need --teacher, and --init_from_teacher_layers (see `TeacherArgs`)."""
        if self.teacher is None:
            # This command's fields, whose defaults may differ from the group's (`same_as(..., default=...)`).
            teacher_flags = {f.name for f in dataclasses.fields(TeacherArgs)}
            names = {f.name for f in dataclasses.fields(DistillArgs)} - teacher_flags
            own = [f for f in dataclasses.fields(self) if f.name in names]
            given = [f"--{f.name}={getattr(self, f.name)}" for f in own if getattr(self, f.name) != f.default]
            if given:
                verb = "needs" if len(given) == 1 else "need"
                raise InputError(f"{', '.join(given)} {verb} --teacher=MODEL, the model to distil from")
        check_dtype(self.teacher_dtype, quantize=self.teacher_quantize, dashes="--teacher_")
        self.check_teacher_flags(init_checkpoint)


@dataclass(kw_only=True)
class InferenceArgs:
    """A model run on raw text: predict, embed and fill-mask (serve takes some of these flags)."""

    do_lower_case: bool | None = field(
        default=None, metadata={"help": "Lower-case the input; default: the model's tokenizer_config.json."}
    )
    batch_size: int | None = field(
        default=None,
        metadata={
            "min": 1,
            "help": f"Sequences per forward pass; default: {CPU_BATCH_SIZE} and at most {CPU_BATCH_TOKENS} tokens on "
            f"the CPU (torch backend), else {BATCH_SIZE}.",
        },
    )
    device: str | None = same_as(TrainingArgs, "device")
    quantize: str = field(
        default="none",
        metadata={
            "help": "int8: quantize the Linear layers for CPU inference (bert.quantization; outputs move by about "
            "one percent).",
            "choices": list(QUANTIZE_CHOICES),
        },
    )
    dtype: str = field(
        default="float32",
        metadata={
            "help": "Number type of the Transformer blocks: float32; bfloat16 (on CPUs with AVX512-BF16 or AMX about "
            "1.6x faster, each embedding within a cosine of about 0.9999 of float32's); float16 (CUDA only). "
            "Outputs stay float32.",
            "choices": list(INFERENCE_DTYPES),
        },
    )
    backend: str = field(
        default="torch",
        metadata={
            "help": "torch (the model's weights) or onnx (the file `bert export --format=onnx` wrote, run by ONNX "
            "Runtime on the CPU: --model is its directory or the .onnx file; quantize at export, not here).",
            "choices": list(BACKENDS),
        },
    )

    max_seq_length: int | None = field(
        default=None,
        metadata={
            "min": 1,
            "help": "Longest input in tokens, with [CLS] and [SEP]; longer inputs are cut (or windowed, see "
            "--long_document). Default: the model's own (config.json's fine-tuning length, or "
            "sentence_bert_config.json's), else 128 for classification and NER, 384 for question answering, "
            "max_position_embeddings for embeddings and fill-mask.",
        },
    )
    doc_stride: int | None = field(
        default=None,
        metadata={
            "min": 1,
            "help": "Tokens between the starts of consecutive windows over a long text (question answering, "
            "--long_document=windows); default: the model's config.json, else 128.",
        },
    )

    def predictor_settings(self) -> dict[str, Any]:
        """The keywords of `bert.inference.Predictor.from_pretrained` these flags set (checked first)."""
        check_flag_values(self)
        check_backend(self.backend, self.device, self.quantize, "--")
        check_dtype(self.dtype, self.backend, self.quantize, self.device, "--")
        return {
            "device": self.device,
            "batch_size": self.batch_size,
            "do_lower_case": self.do_lower_case,
            "quantize": self.quantize,
            "dtype": self.dtype,
            "backend": self.backend,
        }


@dataclass(kw_only=True)
class MaskingArgs:
    """How masked-LM instances are drawn: create-pretraining-data's flags, which pretrain checks its data
    against (and uses itself with --dynamic_masking)."""

    max_predictions_per_seq: int = field(
        default=20,
        metadata={"run_defining": "train", "min": 1, "help": "Maximum number of masked LM predictions per sequence."},
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
            "min": 1,
            "help": "Split the work over this many runs (machines, array tasks), each with its own --shard_index; "
            "their outputs together are those of one run.",
        },
    )
    shard_index: int = field(
        default=0, metadata={"min": 0, "help": "Which of the --num_shards this run does (0-based)."}
    )

    def check_shard_flags(self) -> None:
        """What metadata cannot say: the index is one of the shards."""
        if self.shard_index >= self.num_shards:
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
        metadata={"min": 1, "help": "Worker processes (create-pretraining-data: more than 1 implies --streaming)."},
    )
