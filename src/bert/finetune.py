"""The fine-tuning runner shared by `bert classify`, `bert ner` and `bert swag`.

A command describes its task with a `FinetuneTask` (which files, which model head, how features
become batches, how outputs become metrics and files); this module does the rest, the same way for
every task, following run_classifier.py's `main` (spec §6):

1. Validation before any work: the flags (at least one `do_*`, `--use_tpu=false`, positive sizes), the
   model files (config, vocab, checkpoint; `--max_seq_length` <= `max_position_embeddings`, vocab not
   larger than `vocab_size`, `--do_lower_case` against the checkpoint's name and saved tokenizer
   settings) and the data (every file the run needs is read and checked). A bad input raises
   `InputError` before `--output_dir` is written to.
2. Step arithmetic as the original: `num_train_steps = int(len(train_examples) / train_batch_size *
   num_train_epochs)` and `num_warmup_steps = int(num_train_steps * warmup_proportion)` (MRPC: 3668
   examples, batch 32, 3 epochs -> 343 steps). NER counts sentences, as run_squad counts examples.
3. The original optimizer and schedule (`bert.optimization.create_optimizer`), global-norm clipping at
   1.0, and `bert.training.Trainer` for the loop: gradient accumulation, bf16/fp16, DDP under
   `torchrun`, atomic checkpoints `output_dir/checkpoint-<step>` with exact resume, `metrics.jsonl` and
   TensorBoard events.
4. Batches. Each epoch is a permutation of the training features seeded by `(--seed, epoch)`; steps
   take consecutive batches of that stream, crossing epoch boundaries (the original repeats, shuffles
   and batches with `drop_remainder`; its 100-example shuffle buffer is replaced by a full shuffle).
   With `--group_by_length` (default) the stream is cut into mega-batches of 50 batches, each sorted by
   length, split into batches and the batches shuffled, so a batch holds sequences of similar length.
   Every batch is padded to its own longest sequence (dynamic padding), not to `--max_seq_length`;
   the model ignores padding, so results equal padding to `--max_seq_length`
   (`--pad_to_max_seq_length=true` does that, for comparison). Evaluation and prediction sort by
   length too and restore the input order.
5. Evaluation during training (`--eval_every_steps=N`): the dev set is scored every N steps and at the
   last step; the scores go to `metrics.jsonl` and `eval_history.json`, the checkpoint of the best score
   (`--metric_for_best_model`, a task default otherwise) is kept, and `--early_stopping_patience=K`
   stops training after K evaluations without improvement. The final evaluation and predictions then
   use the best checkpoint. Without it they use the last step's weights.
6. Outputs in `--output_dir`: `args.json`, `log.txt`, `metrics.jsonl`, the checkpoints, `model/` (the
   model the final evaluation and predictions used, in the native layout with `vocab.txt` and the
   tokenizer settings, loadable with `from_pretrained`; the label list is saved in its `config.json` as
   `id2label`), `eval_results.txt` (sorted `key = value`, the original's keys `eval_accuracy`,
   `eval_loss`, `global_step`, `loss` plus the task's metrics) with `eval_results.json`, and the task's
   prediction files.

Rerunning a command with the same `--output_dir` resumes from its newest checkpoint; a finished
training is not repeated (evaluation and prediction run again and give the same files).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bert import training
from bert.checkpoint import load_into, read_checkpoint
from bert.config import BertConfig
from bert.errors import InputError
from bert.formats.results import write_results
from bert.formats.tensorboard import EventWriter
from bert.modeling import num_parameters
from bert.optimization import create_optimizer
from bert.tasks.common import num_train_steps, num_warmup_steps
from bert.tokenization import FullTokenizer, load_vocab, validate_case_matches_checkpoint
from bert.training import METRICS_NAME, PerformanceArgs, TpuCompatArgs, autocast, list_checkpoints
from bert.utils import atomic_write, write_run_info

logger = logging.getLogger(__name__)

EVAL_HISTORY_NAME = "eval_history.json"
MODEL_DIR = "model"
FINETUNE_STATE_NAME = "finetune_state.json"  # in model/: the step its weights come from
# Batches per length-grouped mega-batch (the usual choice of length-grouped samplers).
GROUP_BATCHES = 50


# ------------------------------------------------------------------------------------------------ flags
@dataclass(kw_only=True)
class FinetuneArgs(TpuCompatArgs, PerformanceArgs):
    """Flags shared by the fine-tuning commands: run_classifier.py's, plus training options."""

    data_dir: str = field(
        metadata={"help": "The input data dir. Should contain the data files (train, dev, test) for the task."}
    )
    output_dir: str = field(
        metadata={"help": "The output directory where the model checkpoints and results will be written."}
    )
    bert_config_file: str | None = field(
        default=None,
        metadata={
            "help": "The config json file corresponding to the pre-trained BERT model. This specifies the model "
            "architecture. Default: the config beside --init_checkpoint."
        },
    )
    vocab_file: str | None = field(
        default=None,
        metadata={
            "help": "The vocabulary file that the BERT model was trained on. Default: the vocab.txt beside "
            "--init_checkpoint."
        },
    )
    init_checkpoint: str | None = field(
        default=None,
        metadata={"help": "Initial checkpoint (usually from a pre-trained BERT model): TF, native or transformers."},
    )
    do_lower_case: bool = field(
        default=True,
        metadata={
            "help": "Whether to lower case the input text. Should be True for uncased models and False for cased "
            "models."
        },
    )
    max_seq_length: int = field(
        default=128,
        metadata={
            "help": "The maximum total input sequence length after WordPiece tokenization. Sequences longer than "
            "this will be truncated."
        },
    )
    do_train: bool = field(default=False, metadata={"help": "Whether to run training."})
    do_eval: bool = field(default=False, metadata={"help": "Whether to run eval on the dev set."})
    do_predict: bool = field(
        default=False, metadata={"help": "Whether to run the model in inference mode on the test set."}
    )
    train_batch_size: int = field(default=32, metadata={"help": "Total batch size for training."})
    eval_batch_size: int = field(default=8, metadata={"help": "Total batch size for eval."})
    predict_batch_size: int = field(default=8, metadata={"help": "Total batch size for predict."})
    learning_rate: float = field(default=5e-5, metadata={"help": "The initial learning rate for Adam."})
    num_train_epochs: float = field(default=3.0, metadata={"help": "Total number of training epochs to perform."})
    warmup_proportion: float = field(
        default=0.1,
        metadata={
            "help": "Proportion of training to perform linear learning rate warmup for. "
            "E.g., 0.1 = 10 percent of training."
        },
    )
    save_checkpoints_steps: int = field(default=1000, metadata={"help": "How often to save the model checkpoint."})
    seed: int = field(default=12345, metadata={"help": "Seed of the head's initialisation, data order and dropout."})
    eval_every_steps: int = field(
        default=0,
        metadata={
            "help": "Evaluate on the dev set every this many steps and keep the best checkpoint; the final eval and "
            "predictions then use it. 0: evaluate only at the end."
        },
    )
    early_stopping_patience: int = field(
        default=0,
        metadata={
            "help": "Stop training after this many evaluations (--eval_every_steps) without improvement. 0: off."
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
        metadata={"help": "Batch sequences of similar length together (within shuffled groups of 50 batches)."},
    )
    pad_to_max_seq_length: bool = field(
        default=False,
        metadata={"help": "Pad every batch to max_seq_length as the original does (slower, same results)."},
    )
    keep_checkpoint_max: int = field(
        default=1,
        metadata={"help": "Keep this many newest checkpoints (besides the best one); 0 keeps all."},
    )
    log_every: int = field(default=50, metadata={"help": "Write training metrics every this many steps."})
    device: str | None = field(default=None, metadata={"help": "torch device; default cuda if available, else cpu."})


# ------------------------------------------------------------------------------------------------- tasks
class FinetuneTask:
    """What a fine-tuning command tells the runner about its task. Subclasses set the attributes and
    implement the methods; features are made unpadded (the runner pads each batch).

    Attributes:
        command: the subcommand's name (recorded in args.json).
        model_class: the `bert.modeling` head class.
        default_metric: the eval_results key that picks the best checkpoint by default.
        classifier_dropout: dropout before the head when the config sets none (the original's classifier
            hard-codes 0.1); None leaves the config's choice (hidden_dropout_prob).
    """

    command: str = ""
    model_class: type  # set by each task
    default_metric: str = "eval_accuracy"
    classifier_dropout: float | None = None

    def check_flags(self) -> None:
        """Task flags that can be checked before any file is read."""

    def setup(self, saved_labels: list[str] | None, do_train: bool) -> None:
        """Called once the model files are known: `saved_labels` is the `id2label` list of the checkpoint
        the run starts from (None when it has none)."""

    def read_examples(self, split: str) -> list:
        """The examples of `split` ("train", "dev" or "test"); raises InputError on bad data."""
        raise NotImplementedError

    def labels(self) -> list | None:
        """The label list saved with the model as id2label (None: nothing to save)."""
        return None

    def model_kwargs(self) -> dict[str, Any]:
        return {}

    def metric_names(self) -> list[str]:
        """The eval_results keys the evaluation produces, besides eval_loss, loss and global_step."""
        return ["eval_accuracy"]

    def convert(self, examples: Sequence, tokenizer, max_seq_length: int, pad: bool) -> list:
        raise NotImplementedError

    def feature_length(self, feature) -> int:
        """The number of real tokens (of the longest sequence of a multi-sequence feature)."""
        raise NotImplementedError

    def collate(self, features: Sequence, pad_to: int | None) -> dict[str, np.ndarray]:
        """A batch: `input_ids`, `attention_mask`, `token_type_ids`, `labels` as NumPy arrays."""
        raise NotImplementedError

    def loss_terms(self, logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per feature [B]: the sum of its loss terms and their number (the loss is sum / number)."""
        losses = torch.nn.functional.cross_entropy(logits.float(), labels.long(), reduction="none")
        return losses, torch.ones_like(losses)

    def count(self, labels: torch.Tensor) -> torch.Tensor:
        """The number of loss terms in a batch (what `loss_terms` counts), from the labels alone."""
        return torch.tensor(float(labels.shape[0]), device=labels.device)

    def feature_outputs(self, logits: torch.Tensor, batch: dict[str, torch.Tensor]) -> list[np.ndarray]:
        """What to keep of a batch's logits: one NumPy array per feature (its logits; NER keeps the
        predicted label ids of its real tokens)."""
        return list(logits.float().cpu().numpy())

    def metrics(self, examples: Sequence, features: Sequence, outputs: list[np.ndarray]) -> dict[str, Any]:
        """eval_* metrics of the dev set from the kept outputs (in feature order)."""
        raise NotImplementedError

    def write_eval_files(self, output_dir: Path, examples: Sequence, features: Sequence, outputs: list) -> None:
        """Extra evaluation files (NER: the dev predictions)."""

    def write_predictions(
        self, output_dir: Path, examples: Sequence, features: Sequence, outputs: list
    ) -> dict[str, Any]:
        """Write the test-set prediction files; returns what to report (file names, test metrics)."""
        raise NotImplementedError


def saved_label_list(config) -> list[str] | None:
    """The label list a fine-tuned model saved in its config (`id2label`), or None (also for transformers'
    placeholder names LABEL_0, LABEL_1, ...)."""
    id2label = config.extra.get("id2label") if config is not None else None
    if not isinstance(id2label, dict) or not id2label:
        return None
    try:
        labels = [str(id2label[str(i)]) for i in range(len(id2label))]
    except KeyError:
        return None
    if labels == [f"LABEL_{i}" for i in range(len(labels))]:
        return None
    return labels


# ---------------------------------------------------------------------------------------------- batches
class BatchPlan:
    """Which training features make up the batch of each step (see the module docstring, point 4).

    Args:
        lengths: each feature's length, for grouping.
        batch_size: features per step (the global batch).
        seed: seeds every epoch's permutation and every mega-batch's batch order.
        group_by_length: sort within mega-batches of `group_batches` batches.
    """

    def __init__(
        self,
        lengths: np.ndarray,
        batch_size: int,
        seed: int,
        group_by_length: bool = True,
        group_batches: int = GROUP_BATCHES,
    ):
        self.lengths = np.asarray(lengths)
        self.n = len(self.lengths)
        self.batch_size = batch_size
        self.seed = seed
        self.group_by_length = group_by_length
        self.group_batches = group_batches if group_by_length else 1
        self._epochs: dict[int, np.ndarray] = {}
        self._group: tuple[int, list[np.ndarray]] | None = None

    def _order(self, epoch: int) -> np.ndarray:
        if epoch not in self._epochs:
            if len(self._epochs) > 2:
                self._epochs.pop(min(self._epochs))
            self._epochs[epoch] = np.random.default_rng([self.seed, epoch]).permutation(self.n)
        return self._epochs[epoch]

    def _take(self, position: int, count: int) -> np.ndarray:
        """Feature indices at stream positions `position .. position + count - 1`."""
        epochs, within = np.divmod(np.arange(position, position + count, dtype=np.int64), self.n)
        out = np.empty(count, dtype=np.int64)
        for e in np.unique(epochs):
            m = epochs == e
            out[m] = self._order(int(e))[within[m]]
        return out

    def batch(self, step: int) -> np.ndarray:
        """The feature indices of 0-based step `step`'s batch (sorted by length when grouping)."""
        g, k = divmod(step, self.group_batches)
        if self._group is None or self._group[0] != g:
            size = self.group_batches * self.batch_size
            indices = self._take(g * size, size)
            if self.group_by_length:
                indices = indices[np.argsort(-self.lengths[indices], kind="stable")]
                batches = [indices[i : i + self.batch_size] for i in range(0, size, self.batch_size)]
                perm = np.random.default_rng([self.seed, 1 << 20, g]).permutation(len(batches))
                batches = [batches[i] for i in perm]
            else:
                batches = [indices]
            self._group = (g, batches)
        return self._group[1][k]

    def state(self, step: int) -> dict[str, Any]:
        return {
            "step": step,
            "num_features": self.n,
            "seed": self.seed,
            "batch_size": self.batch_size,
            "group_by_length": self.group_by_length,
        }


def to_tensors(arrays: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    return {k: torch.from_numpy(v) for k, v in arrays.items()}


def train_batches(
    plan: BatchPlan,
    task: FinetuneTask,
    features: Sequence,
    start_step: int,
    rank: int,
    world_size: int,
    accumulation: int,
    pad_to: int | None,
) -> Iterator[list[dict[str, torch.Tensor]]]:
    """Per step from `start_step`: this rank's micro-batches, each padded to its own longest feature
    (or to `pad_to`). The global batch is cut into `world_size * accumulation` equal parts, in order."""
    step = start_step
    while True:
        parts = np.array_split(plan.batch(step), world_size * accumulation)
        yield [
            to_tensors(task.collate([features[i] for i in part], pad_to))
            for part in parts[rank * accumulation : (rank + 1) * accumulation]
        ]
        step += 1


# ------------------------------------------------------------------------------------------- inference
@dataclass
class Predictions:
    """Model outputs for a list of features, in feature order."""

    outputs: list[np.ndarray]  # what `task.feature_outputs` kept
    loss_sum: np.ndarray  # [F] float64
    loss_count: np.ndarray  # [F] float64


@torch.no_grad()
def predict(
    model: torch.nn.Module,
    task: FinetuneTask,
    features: Sequence,
    batch_size: int,
    dist,
    precision: str = "fp32",
    group_by_length: bool = True,
    pad_to: int | None = None,
) -> Predictions:
    """Run `model` (unwrapped) over `features` in batches of `batch_size`, sorted by length when
    `group_by_length`, each padded to its longest feature or to `pad_to`. Under torchrun every rank
    runs every world_size-th batch and all ranks receive all outputs."""

    lengths = np.array([task.feature_length(f) for f in features])
    order = np.argsort(-lengths, kind="stable") if group_by_length else np.arange(len(features))
    batches = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    was_training = model.training
    model.eval()
    mine: list[tuple[np.ndarray, list[np.ndarray], np.ndarray, np.ndarray]] = []
    for idx in batches[dist.rank :: dist.world_size]:
        batch = {k: v.to(dist.device) for k, v in to_tensors(task.collate([features[i] for i in idx], pad_to)).items()}
        with autocast(dist.device, precision):
            out = model(
                input_ids=batch["input_ids"],
                attention_mask=batch["attention_mask"],
                token_type_ids=batch["token_type_ids"],
            )
        logits = out.logits.float()
        s, c = task.loss_terms(logits, batch["labels"])
        kept = task.feature_outputs(logits, batch)
        mine.append((idx, kept, s.double().cpu().numpy(), c.double().cpu().numpy()))
    model.train(was_training)
    outputs: list[np.ndarray | None] = [None] * len(features)
    loss_sum = np.zeros(len(features))
    loss_count = np.zeros(len(features))
    for part in dist.gather_object(mine):
        for idx, kept, s, c in part:
            for j, i in enumerate(idx):
                outputs[i] = kept[j]
            loss_sum[idx] = s
            loss_count[idx] = c
    return Predictions(outputs, loss_sum, loss_count)  # type: ignore[arg-type]


def loss_metrics(pred: Predictions, eval_batch_size: int) -> dict[str, float]:
    """`eval_loss`: the mean loss term over the dev set; `loss`: the Estimator's, the mean over consecutive
    batches of `eval_batch_size` features (in input order, as the original reads them) of each batch's loss."""
    total = max(pred.loss_count.sum(), 1.0)
    batch_losses = []
    for i in range(0, len(pred.loss_sum), eval_batch_size):
        s, c = pred.loss_sum[i : i + eval_batch_size].sum(), pred.loss_count[i : i + eval_batch_size].sum()
        if c > 0:
            batch_losses.append(s / c)
    return {
        "eval_loss": float(pred.loss_sum.sum() / total),
        "loss": float(np.mean(batch_losses)) if batch_losses else 0.0,
    }


# ------------------------------------------------------------------------------------------ the runner
def _check_flags(args: FinetuneArgs, task: FinetuneTask, world_size: int) -> None:
    if not (args.do_train or args.do_eval or args.do_predict):
        raise InputError(
            "At least one of `do_train`, `do_eval` or `do_predict` must be True: pass --do_train=true, "
            "--do_eval=true and/or --do_predict=true"
        )
    args.check_no_tpu()
    positive = ["max_seq_length", "save_checkpoints_steps", "log_every", "gradient_accumulation_steps"]
    positive += ["train_batch_size"] * args.do_train + ["eval_batch_size"] * args.do_eval
    positive += ["predict_batch_size"] * args.do_predict
    for name in positive:
        if getattr(args, name) < 1:
            raise InputError(f"--{name}={getattr(args, name)} must be at least 1")
    for name in ("eval_every_steps", "early_stopping_patience", "keep_checkpoint_max"):
        if getattr(args, name) < 0:
            raise InputError(f"--{name}={getattr(args, name)} must not be negative")
    if args.do_train:
        if not args.learning_rate > 0:
            raise InputError(f"--learning_rate={args.learning_rate} must be positive")
        if not args.num_train_epochs > 0:
            raise InputError(f"--num_train_epochs={args.num_train_epochs} must be positive")
        if not 0 <= args.warmup_proportion <= 1:
            raise InputError(f"--warmup_proportion={args.warmup_proportion} must be between 0 and 1")
        parts = world_size * args.gradient_accumulation_steps
        if args.train_batch_size % parts:
            raise InputError(
                f"--train_batch_size={args.train_batch_size} must be divisible by processes x "
                f"--gradient_accumulation_steps = {world_size} x {args.gradient_accumulation_steps} = {parts}"
            )
    if args.precision not in ("fp32", "bf16", "fp16"):
        raise InputError(f"--precision={args.precision} must be fp32, bf16 or fp16")
    if args.early_stopping_patience and not args.eval_every_steps:
        raise InputError("--early_stopping_patience needs evaluations during training: set --eval_every_steps=N")
    names = [*task.metric_names(), "eval_loss", "loss"]
    if args.metric_for_best_model is not None and args.metric_for_best_model not in names:
        raise InputError(
            f"--metric_for_best_model={args.metric_for_best_model} is not an evaluation result of "
            f"`bert {task.command}`; use one of {', '.join(names)}"
        )
    task.check_flags()


@dataclass
class ModelFiles:
    config: Any  # BertConfig
    vocab_file: str
    checkpoint: Any  # bert.checkpoint.Checkpoint | None: --init_checkpoint
    saved_labels: list[str] | None


def _resolve_model_files(args: FinetuneArgs, resume_dir: Path | None) -> ModelFiles:

    validate_case_matches_checkpoint(args.do_lower_case, args.init_checkpoint)
    ckpt = read_checkpoint(args.init_checkpoint) if args.init_checkpoint else None
    if args.bert_config_file:
        if not os.path.isfile(args.bert_config_file):
            raise InputError(f"--bert_config_file={args.bert_config_file}: no such file")
        config = BertConfig.from_json_file(args.bert_config_file)
    elif ckpt is not None and ckpt.config is not None:
        config = ckpt.config
    else:
        raise InputError(
            "no model config: pass --bert_config_file=PATH (or an --init_checkpoint with a config.json beside it)"
        )
    vocab_file = args.vocab_file or (ckpt.vocab_file if ckpt is not None else None)
    if not vocab_file:
        raise InputError("no vocabulary: pass --vocab_file=PATH (or an --init_checkpoint with a vocab.txt beside it)")
    if not os.path.isfile(vocab_file):
        raise InputError(f"--vocab_file={vocab_file}: no such file")
    vocab = load_vocab(vocab_file)
    config.validate_vocab(max(vocab.values()) + 1, vocab_file)
    if args.max_seq_length > config.max_position_embeddings:
        raise InputError(
            f"Cannot use sequence length {args.max_seq_length} because the BERT model was only trained up to "
            f"sequence length {config.max_position_embeddings}: lower --max_seq_length"
        )
    if ckpt is not None:
        saved = ckpt.tokenizer_settings.get("do_lower_case")
        if saved is not None and bool(saved) != args.do_lower_case:
            raise InputError(
                f"--do_lower_case={args.do_lower_case} does not match --init_checkpoint={args.init_checkpoint}, "
                f"whose tokenizer_config.json says do_lower_case={bool(saved)}; pass --do_lower_case={bool(saved)}"
            )
    # The labels of the model the run starts from (see `_run`, point 3), else of --init_checkpoint.
    exported = Path(args.output_dir) / MODEL_DIR
    saved_labels = saved_label_list(ckpt.config) if ckpt is not None else None
    for cfg_dir in (resume_dir,) if args.do_train else (exported, resume_dir):
        if cfg_dir is not None and (cfg_dir / "config.json").is_file():
            saved_labels = saved_label_list(BertConfig.from_json_file(cfg_dir / "config.json"))
            break
    return ModelFiles(config, vocab_file, ckpt, saved_labels)


class EvalHistory:
    """Evaluations during training (`eval_history.json`), the best one, and early stopping."""

    def __init__(self, path: Path, metric: str, patience: int):
        self.path = path
        self.metric = metric
        self.greater_is_better = "loss" not in metric
        self.patience = patience
        self.evaluations: list[dict[str, Any]] = []
        self.stopped_at: int | None = None

    def load(self, up_to_step: int) -> None:
        """Read the file, keeping the evaluations of steps <= `up_to_step` (the checkpoint resumed)."""
        if not self.path.is_file():
            return
        data = json.loads(self.path.read_text(encoding="utf-8"))
        if data.get("metric") != self.metric:
            logger.warning("%s ranked by %s, now by %s", self.path, data.get("metric"), self.metric)
        self.evaluations = [e for e in data.get("evaluations", []) if e["step"] <= up_to_step]
        stopped = data.get("stopped_at")
        self.stopped_at = stopped if stopped is not None and stopped <= up_to_step else None

    def save(self) -> None:

        best = self.best()
        data = {
            "metric": self.metric,
            "greater_is_better": self.greater_is_better,
            "best_step": best["step"] if best else None,
            "best_value": best["metrics"][self.metric] if best else None,
            "stopped_at": self.stopped_at,
            "evaluations": self.evaluations,
        }
        with atomic_write(self.path) as f:
            json.dump(data, f, indent=2)
            f.write("\n")

    def evaluated(self, step: int) -> bool:
        return any(e["step"] == step for e in self.evaluations)

    def best(self) -> dict[str, Any] | None:
        best = None
        for e in self.evaluations:
            v = e["metrics"][self.metric]
            if best is None or (
                v > best["metrics"][self.metric] if self.greater_is_better else v < best["metrics"][self.metric]
            ):
                best = e
        return best

    def add(self, step: int, metrics: dict[str, float]) -> bool:
        """Record an evaluation; True when training should stop (early stopping)."""
        self.evaluations.append({"step": step, "metrics": metrics})
        best = self.best()
        since_best = sum(e["step"] > best["step"] for e in self.evaluations) if best else 0
        if self.patience and since_best >= self.patience:
            self.stopped_at = step
            logger.info(
                "early stopping at step %d: %s has not improved for %d evaluations (best %.6g at step %d)",
                step,
                self.metric,
                since_best,
                best["metrics"][self.metric],
                best["step"],
            )
            return True
        return False


def _prune_checkpoints(output_dir: Path, keep: int, protect: int | None) -> None:
    """Keep the `keep` newest checkpoints (all when 0) and the one of step `protect`."""

    if keep <= 0:
        return
    ckpts = list_checkpoints(output_dir)
    for step, path in ckpts[:-keep]:
        if step != protect:
            shutil.rmtree(path, ignore_errors=True)


def _exported_step(model_dir: Path) -> int:
    path = model_dir / FINETUNE_STATE_NAME
    if path.is_file():
        return int(json.loads(path.read_text(encoding="utf-8")).get("global_step", 0))
    return 0


def _log_eval(output_dir: Path, step: int, metrics: dict[str, float]) -> None:
    """An evaluation during training: a line of metrics.jsonl and TensorBoard scalars under eval/."""

    scalars = {k: v for k, v in metrics.items() if k != "loss"}
    with open(output_dir / METRICS_NAME, "a", encoding="utf-8") as f:
        f.write(json.dumps({"step": step, **scalars}) + "\n")
    with EventWriter(output_dir / "eval") as w:
        w.add_scalars(step, scalars)


def run_finetune(args: FinetuneArgs, task: FinetuneTask) -> dict[str, Any]:
    """Train, evaluate and/or predict as the flags say; returns
    `{"output_dir", "global_step", "num_train_steps", "train", "eval", "predict"}`."""

    dist = training.init_distributed(args.device)
    try:
        with contextlib.ExitStack() as stack:
            return _run(args, task, dist, stack)
    finally:
        training.shutdown_distributed()


def _run(args: FinetuneArgs, task: FinetuneTask, dist, stack: contextlib.ExitStack) -> dict[str, Any]:

    # 1. Flags, model files and data, all checked before anything is written.
    _check_flags(args, task, dist.world_size)
    output_dir = Path(args.output_dir)
    resume_dir = training.latest_checkpoint(output_dir)
    files = _resolve_model_files(args, resume_dir)
    config = files.config
    if resume_dir is not None:
        training.check_checkpoint_config(resume_dir, config)
    if task.classifier_dropout is not None and config.classifier_dropout is None:
        config.classifier_dropout = task.classifier_dropout
    task.setup(files.saved_labels, args.do_train)
    evaluate_during_training = args.do_train and args.eval_every_steps > 0
    train_examples = task.read_examples("train") if args.do_train else None
    dev_examples = task.read_examples("dev") if args.do_eval or evaluate_during_training else None
    test_examples = task.read_examples("test") if args.do_predict else None
    labels = task.labels()
    if args.do_train and resume_dir is not None and files.saved_labels not in (None, labels):
        raise InputError(
            f"{resume_dir} was trained with the labels {files.saved_labels}, the data now has {labels}; resume "
            "with the same labels (--labels), or use a new --output_dir"
        )
    if labels is not None:
        config.extra["id2label"] = {str(i): str(label) for i, label in enumerate(labels)}
        config.extra["label2id"] = {str(label): i for i, label in enumerate(labels)}
    total_steps = warmup_steps = 0
    if args.do_train:
        total_steps = num_train_steps(len(train_examples), args.train_batch_size, args.num_train_epochs)
        warmup_steps = num_warmup_steps(total_steps, args.warmup_proportion)
        if total_steps < 1:
            raise InputError(
                f"{len(train_examples)} training examples / --train_batch_size={args.train_batch_size} x "
                f"--num_train_epochs={args.num_train_epochs} gives 0 training steps; use a smaller batch or "
                "more epochs"
            )

    # 2. Logging, tokenizer, features.
    stack.enter_context(training.log_to_file(output_dir / "log.txt", dist.is_main))
    if dist.is_main:
        write_run_info(output_dir, task.command, args)
    tokenizer = FullTokenizer(files.vocab_file, do_lower_case=args.do_lower_case)
    pad_to = args.max_seq_length if args.pad_to_max_seq_length else None

    def features_of(examples):
        return task.convert(examples, tokenizer, args.max_seq_length, pad=args.pad_to_max_seq_length)

    # 3. The model: training resumes from the newest checkpoint, else starts from --init_checkpoint;
    # evaluation alone uses the model a finished training chose (model/), else the newest checkpoint.
    training.set_seed(args.seed)
    model = task.model_class(config, **task.model_kwargs())
    state = None
    global_step = 0
    exported = output_dir / MODEL_DIR
    if not args.do_train and (exported / "config.json").is_file():
        logger.info("evaluating the model in %s", exported)
        load_into(model, read_checkpoint(exported))
        global_step = _exported_step(exported)
    elif resume_dir is not None:
        logger.info("resuming from %s%s", resume_dir, " (--init_checkpoint is ignored)" if files.checkpoint else "")
        load_into(model, read_checkpoint(resume_dir))
        global_step = int(resume_dir.name[len(training.CHECKPOINT_PREFIX) :])
        if args.do_train:
            state = training.load_training_state(resume_dir)
    elif files.checkpoint is not None:
        load_into(model, files.checkpoint)
    else:
        logger.warning("no --init_checkpoint: the model starts from random weights")
    files.checkpoint = None  # the weights are in the model now
    logger.info("%s: %d parameters", type(model).__name__, num_parameters(model))
    if args.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    if args.compile:
        training.compile_model(model)
    wrapped = training.wrap_model(model, dist)
    metric = args.metric_for_best_model or task.default_metric
    history = EvalHistory(output_dir / EVAL_HISTORY_NAME, metric, args.early_stopping_patience)
    if evaluate_during_training:
        history.load(global_step)
    dev_features = features_of(dev_examples) if dev_examples is not None else None

    def evaluate(step: int) -> dict[str, Any]:
        logger.info("***** Running evaluation *****")
        logger.info("  Num examples = %d (%d actual, 0 padding)", len(dev_examples), len(dev_examples))
        logger.info("  Batch size = %d", args.eval_batch_size)
        pred = predict(
            model, task, dev_features, args.eval_batch_size, dist, args.precision, args.group_by_length, pad_to
        )
        results = {**task.metrics(dev_examples, dev_features, pred.outputs), **loss_metrics(pred, args.eval_batch_size)}
        results["global_step"] = step
        return {"results": results, "pred": pred}

    result: dict[str, Any] = {"output_dir": str(output_dir), "num_train_steps": total_steps}

    # 4. Training.
    if args.do_train:
        train_features = features_of(train_examples)
        optimizer, scheduler = create_optimizer(model, args.learning_rate, total_steps, warmup_steps)
        trainer = training.Trainer(
            model,
            wrapped,
            optimizer,
            scheduler,
            dist,
            output_dir,
            precision=args.precision,
            max_grad_norm=1.0,
            save_checkpoints_steps=args.save_checkpoints_steps,
            keep_checkpoint_max=0 if evaluate_during_training else args.keep_checkpoint_max,
            log_every=args.log_every,
            vocab_file=files.vocab_file,
            do_lower_case=args.do_lower_case,
            examples_per_step=args.train_batch_size,
            desc=task.command,
        )
        torch.manual_seed(args.seed + dist.rank)  # dropout differs across ranks, as their examples do
        if state is not None:
            trainer.restore(state)
            data = state.get("data", {})
            if data.get("num_features") != len(train_features) or data.get("batch_size") != args.train_batch_size:
                logger.warning(
                    "the training data or batch size differ from the checkpoint's (%s features, batch %s): the "
                    "run continues, but not as an uninterrupted one would",
                    data.get("num_features"),
                    data.get("batch_size"),
                )
        lengths = np.array([task.feature_length(f) for f in train_features])
        plan = BatchPlan(lengths, args.train_batch_size, args.seed, args.group_by_length)
        logger.info("***** Running training *****")
        logger.info("  Num examples = %d", len(train_examples))
        logger.info("  Batch size = %d", args.train_batch_size)
        logger.info("  Num steps = %d", total_steps)
        logger.info("  Warmup steps = %d", warmup_steps)

        def loss_fn(m, batch, totals):
            out = m(
                input_ids=batch["input_ids"],
                attention_mask=batch["attention_mask"],
                token_type_ids=batch["token_type_ids"],
            )
            s, _ = task.loss_terms(out.logits, batch["labels"])
            loss = s.sum() / totals["count"].clamp(min=1.0)
            return loss, {"loss": loss.detach()}

        def totals_fn(batch):
            return {"count": task.count(batch["labels"])}

        checkpoint_info = {"command": task.command, "num_train_steps": total_steps, "seed": args.seed}
        if trainer.global_step >= total_steps:
            logger.info("training already finished at step %d (%s)", trainer.global_step, resume_dir)
        while True:
            step = trainer.global_step
            due = step > 0 and (step % max(args.eval_every_steps, 1) == 0 or step == total_steps)
            if evaluate_during_training and due and not history.evaluated(step):
                metrics = {k: float(v) for k, v in evaluate(step)["results"].items() if k != "global_step"}
                stop = history.add(step, metrics)
                if dist.is_main:
                    history.save()
                    _log_eval(output_dir, step, metrics)
                    best = history.best()
                    logger.info(
                        "step %d: %s = %.6g (best %.6g at step %d)",
                        step,
                        metric,
                        metrics[metric],
                        best["metrics"][metric],
                        best["step"],
                    )
                    _prune_checkpoints(output_dir, args.keep_checkpoint_max, best["step"])
                dist.barrier()
                if stop:
                    break
            if step >= total_steps or history.stopped_at is not None:
                break
            chunk_end = total_steps
            if evaluate_during_training:
                chunk_end = min(total_steps, (step // args.eval_every_steps + 1) * args.eval_every_steps)
            batches = training.prefetch(
                train_batches(
                    plan,
                    task,
                    train_features,
                    step,
                    dist.rank,
                    dist.world_size,
                    args.gradient_accumulation_steps,
                    pad_to,
                ),
                pin=dist.device.type == "cuda",
            )
            try:
                result["train"] = trainer.train(
                    batches, loss_fn, chunk_end, plan.state, totals_fn=totals_fn, checkpoint_info=checkpoint_info
                )
            finally:
                batches.close()
        global_step = trainer.global_step
        # 5. The final model: the best checkpoint when the dev set was scored during training, else the last.
        best = history.best() if evaluate_during_training else None
        if best is not None and best["step"] != global_step:
            best_dir = output_dir / f"{training.CHECKPOINT_PREFIX}{best['step']}"
            logger.info("using the best checkpoint %s (%s = %.6g)", best_dir, metric, best["metrics"][metric])
            load_into(model, read_checkpoint(best_dir))
            global_step = best["step"]
        if dist.is_main:
            training.export_model(model, exported, files.vocab_file, args.do_lower_case)
            with open(exported / FINETUNE_STATE_NAME, "w", encoding="utf-8") as f:
                json.dump({"command": task.command, "global_step": global_step}, f)
                f.write("\n")
            logger.info("saved the model of step %d to %s", global_step, exported)
        dist.barrier()
    result["global_step"] = global_step

    # 6. Evaluation and prediction.
    if args.do_eval:
        ev = evaluate(global_step)
        if dist.is_main:
            write_results(output_dir, ev["results"])
            task.write_eval_files(output_dir, dev_examples, dev_features, ev["pred"].outputs)
        result["eval"] = ev["results"]
    if args.do_predict:
        test_features = features_of(test_examples)
        logger.info("***** Running prediction*****")
        logger.info("  Num examples = %d (%d actual, 0 padding)", len(test_examples), len(test_examples))
        logger.info("  Batch size = %d", args.predict_batch_size)
        pred = predict(
            model, task, test_features, args.predict_batch_size, dist, args.precision, args.group_by_length, pad_to
        )
        if dist.is_main:
            result["predict"] = task.write_predictions(output_dir, test_examples, test_features, pred.outputs)
        dist.barrier()
    return result
