"""The fine-tuning runner shared by `bert classify`, `bert ner` and `bert swag`.

A command describes its task with a `FinetuneTask` (which files, which model head, how features
become batches, how outputs become metrics and files); this module does the rest, the same way for
every task, following run_classifier.py's `main`:

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
6. Outputs in `--output_dir`: `args.json`, `log.txt`, `metrics.jsonl` (and `curves.png`, drawn from it
   and the final evaluation, with the `plot` extra), the checkpoints, `model/` (the
   model the final evaluation and predictions used, in the native layout with `vocab.txt` and the
   tokenizer settings, loadable with `from_pretrained`; the label list is saved in its `config.json` as
   `id2label`), `eval_results.txt` (sorted `key = value`, the original's keys `eval_accuracy`,
   `eval_loss`, `global_step`, `loss` plus the task's metrics) with `eval_results.json`, and the task's
   prediction files.

7. Distillation (`--teacher`, classify, NER and SQuAD, `bert.distillation`): the teacher's outputs on the training
   and `--transfer_file` examples are computed once (cached) and each batch carries its features' rows; the
   loss is `distillation.distillation_loss` under the head's `loss_normalizers`, and the transfer examples
   count in the step arithmetic.

Rerunning a command with the same `--output_dir` resumes from its newest checkpoint; a finished
training is not repeated (evaluation and prediction run again and give the same files).

Comma lists of `--learning_rate`, `--train_batch_size` or `--num_train_epochs` make a grid of such runs, one
per combination, the best on the dev set exported to `--output_dir` (`bert.grid`).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bert import checkpointing, distillation, evaluations, grid, run_dir, training
from bert.batching import BatchPlan
from bert.config import BertConfig
from bert.distributed import DistContext, autocast, distributed
from bert.errors import InputError
from bert.evaluations import EVAL_HISTORY_NAME, EvalHistory
from bert.flags import (
    DistillArgs,
    FinetuneArgs,
    check_batch_division,
    check_flag_values,
    teacher_cache_dir,
)
from bert.formats.results import write_results
from bert.modeling import MODEL_CLASSES, FineTuningHead, num_parameters
from bert.run_dir import MODEL_DIR
from bert.starting_model import StartingModel, resolve_starting_model
from bert.tasks.common import FinetuneTask, num_train_steps, num_warmup_steps
from bert.tokenization import FullTokenizer
from bert.training import to_device
from bert.utils import atomic_write, format_scores, head, print_result, progress

logger = logging.getLogger(__name__)

FINETUNE_STATE_NAME = "finetune_state.json"  # in model/: the step its weights come from


# ------------------------------------------------------------------------------------------------- tasks


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


def _example_rows(features: Sequence) -> list[int]:
    """Each feature's example: its `example_index` (a window of a long document), else its position (one
    feature per example)."""
    return [i if getattr(f, "example_index", None) is None else int(f.example_index) for i, f in enumerate(features)]


# ---------------------------------------------------------------------------------------------- batches
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
    extra: Callable[[np.ndarray], dict[str, np.ndarray]] | None = None,
) -> Iterator[list[dict[str, torch.Tensor]]]:
    """Per step from `start_step`: this rank's micro-batches, each padded to its own longest feature
    (or to `pad_to`). The global batch is cut into `world_size * accumulation` equal parts, in order.
    `extra(indices)`: more arrays of those features for the loss (a teacher's outputs)."""
    step = start_step
    while True:
        parts = np.array_split(plan.batch(step), world_size * accumulation)
        yield [
            to_tensors({**task.collate([features[i] for i in part], pad_to), **(extra(part) if extra else {})})
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
    desc: str = "predict",
) -> Predictions:
    """Run `model` (unwrapped) over `features` in batches of `batch_size`, sorted by length when
    `group_by_length`, each padded to its longest feature or to `pad_to`. Under torchrun every rank
    runs every world_size-th batch and all ranks receive all outputs. The loss terms are the head's.
    `desc` labels the progress bar."""
    lengths = np.array([task.feature_length(f) for f in features])
    order = np.argsort(-lengths, kind="stable") if group_by_length else np.arange(len(features))
    batches = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    was_training = model.training
    model.eval()
    mine: list[tuple[np.ndarray, list[np.ndarray], np.ndarray, np.ndarray]] = []
    mine_batches = batches[dist.rank :: dist.world_size]
    for idx in progress(mine_batches, desc=desc, unit="batch", disable=not dist.is_main):
        arrays = task.collate([features[i] for i in idx], pad_to)
        with autocast(dist.device, precision):
            out = model(**to_device(to_tensors(arrays), dist.device))
        kept = task.feature_outputs(out.logits.float().cpu().numpy(), arrays)
        mine.append((idx, kept, out.example_loss.double().cpu().numpy(), out.example_count.double().cpu().numpy()))
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
    check_flag_values(args)
    if args.do_train:
        check_batch_division(args.train_batch_size, world_size, args.gradient_accumulation_steps)
    evaluations.check_early_stopping(args)
    names = [*task.metric_names(), "eval_loss", "loss"]
    evaluations.check_best_metric(args.metric_for_best_model, names, f"`bert {task.command}`")
    task.check_flags()
    if isinstance(args, DistillArgs) and args.teacher is not None:
        _check_teacher_use(args)


def _check_teacher_use(args: DistillArgs) -> None:
    """What --teacher is for: its outputs, learned on the training data (--distill_alpha > 0) or a transfer set,
    else its layers alone (--init_from_teacher_layers), when the flags of its outputs would do nothing."""
    if not getattr(args, "do_train", False):
        raise InputError(f"--teacher={args.teacher} labels the training data: add --do_train, or drop --teacher")
    if args.distill_alpha == 0 and not args.transfer_file:
        if args.init_from_teacher_layers is None:
            raise InputError(
                f"--distill_alpha=0 without --transfer_file leaves --teacher={args.teacher} nothing to do: raise "
                "--distill_alpha, add --transfer_file, or drop --teacher"
            )
        args.check_outputs_learned("--distill_alpha=0 and no --transfer_file: the teacher gives its layers")


@dataclass
class ModelFiles:
    start: StartingModel
    saved_labels: list[str] | None
    saved_config: dict[str, Any]  # the extra config.json keys of the model saved_labels come from


def _resolve_model_files(args: FinetuneArgs) -> ModelFiles:
    start = resolve_starting_model(args, do_lower_case=args.do_lower_case)
    # The labels of the model the run starts from (see `_run`, point 3), else of --init_checkpoint.
    exported = Path(args.output_dir) / MODEL_DIR
    saved = start.init.config if start.init is not None else None
    for cfg_dir in (start.resume_dir,) if args.do_train else (exported, start.resume_dir):
        if cfg_dir is not None and (cfg_dir / "config.json").is_file():
            saved = BertConfig.from_json_file(cfg_dir / "config.json")
            break
    saved_config = dict(saved.extra) if saved is not None else {}
    return ModelFiles(start, saved_label_list(saved), saved_config)


def run_finetune(args: FinetuneArgs, task: FinetuneTask) -> dict[str, Any]:
    """Train, evaluate and/or predict as the flags say; returns
    `{"output_dir", "global_step", "num_train_steps", "train", "eval", "predict"}`. Comma lists of the grid
    flags run a grid of such runs instead (`bert.grid.run_grid`, which returns its own summary)."""
    inputs = {"--data_dir": args.data_dir, "--init_checkpoint": args.init_checkpoint}
    inputs.update(
        {"--teacher": getattr(args, "teacher", None), "--transfer_file": getattr(args, "transfer_file", None)}
    )
    inputs.update({"--vocab_file": args.vocab_file, "--bert_config_file": args.bert_config_file})
    cells = grid.expand(args, task.dev_flag)
    if cells is not None:
        for cell in cells:  # every run's flags checked before the first starts
            _check_flags(cell.args, task, world_size=1)
        metric = args.metric_for_best_model or task.default_metric
        return grid.run_grid(args, cells, task.command, metric, inputs, run_dir.RESULT_NAMES, MODEL_DIR)
    with distributed(args.device) as dist:
        with run_dir.claim_output_dir(args.output_dir, task.command, dist, inputs):
            run = _FinetuneRun(args, task, dist)
            with run_dir.run_directory(args.output_dir, task.command, args, dist):
                result = run.run()
    if dist.is_main:
        _print_result(task.command, result, Path(args.output_dir))
    return result


def _print_result(command: str, result: dict[str, Any], output_dir: Path) -> None:
    """The run's result block: the scores, the files and where they are, and the command that uses the model."""
    lines = [f"global step {result['global_step']} of {result['num_train_steps']}"]
    if "eval" in result:
        lines.append(f"eval: {format_scores(result['eval'])}")
    predicted = result.get("predict") or {}
    if isinstance(predicted.get("eval"), dict):
        lines.append(f"predictions scored: {format_scores(predicted['eval'])}")
    files = [v for v in predicted.values() if isinstance(v, str)]
    if files:
        lines.append(f"predictions: {', '.join(files)}")
    lines.append(run_dir.written_line(output_dir))
    if (output_dir / MODEL_DIR).is_dir():
        lines.append(f"next: bert predict --model={output_dir / MODEL_DIR} --input_file=TEXTS.txt")
    print_result(command, *lines)


class _FinetuneRun:
    """One run of `run_finetune`, in the module docstring's order: everything is checked when it is built
    (before the output directory is written to), then `run` loads the model, trains, exports, evaluates
    and predicts."""

    def __init__(self, args: FinetuneArgs, task: FinetuneTask, dist: DistContext):
        self.args, self.task, self.dist = args, task, dist
        # 1. Flags, model files and data, all checked before anything is written.
        _check_flags(args, task, dist.world_size)
        self.output_dir = Path(args.output_dir)
        self.exported = self.output_dir / MODEL_DIR
        self.files = _resolve_model_files(args)
        self.resume_dir = self.files.start.resume_dir
        config = self.files.start.config
        if task.classifier_dropout is not None and config.classifier_dropout is None:
            config.classifier_dropout = task.classifier_dropout
        task.setup(self.files.saved_labels, args.do_train)
        if not args.do_train:
            task.use_saved_config(self.files.saved_config)
        self.evaluate_during_training = args.do_train and args.eval_every_steps > 0
        # The splits the run uses (empty when no --do_* asks for one).
        self.train_examples = head(task.read_examples("train"), args.max_train_examples) if args.do_train else []
        evaluates = args.do_eval or self.evaluate_during_training
        self.dev_examples = head(task.read_examples("dev"), args.max_eval_examples) if evaluates else []
        self.test_examples = head(task.read_examples("test"), args.max_eval_examples) if args.do_predict else []
        labels = task.labels()
        if args.do_train and self.resume_dir is not None and self.files.saved_labels not in (None, labels):
            raise InputError(
                f"{self.resume_dir} was trained with the labels {self.files.saved_labels}, the data now has {labels}; "
                "resume with the same labels (--labels), or use a new --output_dir"
            )
        if labels is not None:
            config.extra["id2label"] = {str(i): str(label) for i, label in enumerate(labels)}
            config.extra["label2id"] = {str(label): i for i, label in enumerate(labels)}
        config.extra.update(task.inference_config(), max_seq_length=args.max_seq_length)
        self.teacher, self.transfer_examples = self.distillation_setup(labels)
        self.total_steps = self.warmup_steps = 0
        if args.do_train:
            n = len(self.train_examples) + len(self.transfer_examples)
            self.total_steps = num_train_steps(n, args.train_batch_size, args.num_train_epochs)
            self.warmup_steps = num_warmup_steps(self.total_steps, args.warmup_proportion)
            if self.total_steps < 1:
                raise InputError(
                    f"{n} training examples / --train_batch_size={args.train_batch_size} x "
                    f"--num_train_epochs={args.num_train_epochs} gives 0 training steps; use a smaller batch or "
                    "more epochs"
                )
        self.metric = args.metric_for_best_model or task.default_metric
        self.history = EvalHistory(self.output_dir / EVAL_HISTORY_NAME, self.metric, args.early_stopping_patience)
        self.pad_to = args.max_seq_length if args.pad_to_max_seq_length else None

    def distillation_setup(self, labels: list | None) -> tuple[distillation.Teacher | None, list]:
        """The teacher of a distillation run (`bert.distillation`, checked against the student's task) and the
        transfer examples; (None, []) without --teacher."""
        args, task = self.args, self.task
        if not isinstance(args, DistillArgs) or args.teacher is None:
            return None, []
        if args.distill_alpha == 0 and not args.transfer_file:
            return None, []  # the teacher gives its layers only (`_check_teacher_use`)
        teacher_labels = saved_label_list(distillation.teacher_config(args.teacher))
        teacher: distillation.Teacher
        if task.head == "BertForSequenceClassification":
            problem_type = task.inference_config()["problem_type"]
            teacher = distillation.ClassificationTeacher(
                args.teacher, problem_type, labels, teacher_labels, args.teacher_dtype, args.teacher_quantize
            )
        elif task.head == "BertForTokenClassification":
            vocab_file = self.files.start.vocab_file
            assert labels is not None and vocab_file is not None  # NER has labels; fine-tuning needs a vocab
            teacher = distillation.TokenTeacher(
                args.teacher,
                labels,
                teacher_labels,
                vocab_file,
                args.do_lower_case,
                args.max_seq_length,
                args.teacher_dtype,
                args.teacher_quantize,
            )
        elif task.head == "BertForQuestionAnswering":
            vocab_file = self.files.start.vocab_file
            assert vocab_file is not None  # fine-tuning needs a vocab
            teacher = distillation.SpanTeacher(
                args.teacher,
                vocab_file,
                args.do_lower_case,
                args.max_seq_length,
                args.teacher_dtype,
                args.teacher_quantize,
            )
        else:
            raise InputError(f"`bert {task.command}` does not distil: drop --teacher")
        if args.transfer_file and not os.path.isfile(args.transfer_file):
            raise InputError(f"--transfer_file={args.transfer_file}: no such file")
        transfer = head(task.read_unlabelled(args.transfer_file), args.max_train_examples) if args.transfer_file else []
        return teacher, transfer

    def distillation_inputs(self, features: list) -> tuple[list, Callable[[np.ndarray], dict[str, np.ndarray]]]:
        """The training features with the transfer set's after them, and the arrays each batch adds for the
        distillation loss: the teacher's outputs of each feature's example (cached) and whether it has a label."""
        args, task, teacher = self.args, self.task, self.teacher
        assert isinstance(args, DistillArgs) and teacher is not None
        n_train = len(self.train_examples)
        transfer_features = self.features_of(self.transfer_examples) if self.transfer_examples else []
        all_features = features + transfer_features
        example_rows = np.array(_example_rows(features) + [n_train + r for r in _example_rows(transfer_features)])
        outputs, rows = teacher.outputs(
            self.train_examples + self.transfer_examples,
            all_features,
            example_rows,
            lambda part: task.collate(part, None),
            teacher_cache_dir(args.teacher_cache_dir, self.output_dir),
            self.dist,
            args.eval_batch_size,
            desc=f"{task.command} teacher",
        )
        labelled = np.concatenate([np.ones(len(features)), np.zeros(len(transfer_features))]).astype(np.float32)
        columns = np.array(teacher.columns)
        logger.info(
            "  Transfer examples = %d (%d features, the teacher's labels only)",
            len(self.transfer_examples),
            len(transfer_features),
        )

        def extra(indices: np.ndarray) -> dict[str, np.ndarray]:
            return {
                distillation.TEACHER_KEY: np.asarray(outputs[rows[indices]][..., columns], dtype=np.float32),
                distillation.LABELLED_KEY: labelled[indices],
            }

        return all_features, extra

    def run(self) -> dict[str, Any]:
        args = self.args
        # 2. Tokenizer and features.
        self.tokenizer = FullTokenizer(self.vocab_file, do_lower_case=args.do_lower_case)
        self.dev_features = self.features_of(self.dev_examples) if self.dev_examples else []
        # 3. The model, 4. training and 5. the exported model.
        self.model, self.global_step, state = self.load_model()
        result: dict[str, Any] = {"output_dir": str(self.output_dir), "num_train_steps": self.total_steps}
        if args.do_train:
            last = self.train(state)
            if last is not None:
                result["train"] = last
        result["global_step"] = self.global_step
        # 6. Evaluation and prediction.
        if args.do_eval:
            ev = self.evaluate(self.global_step)
            if self.dist.is_main:
                write_results(self.output_dir, ev["results"])
                self.task.write_eval_files(self.output_dir, self.dev_examples, self.dev_features, ev["pred"].outputs)
                self.save_tuned_config()
            result["eval"] = ev["results"]
        if args.do_predict:
            result["predict"] = self.predict_test_set()
        run_dir.finish_run(self.output_dir, self.exported, self.task.command, args, result.get("eval"), self.dist)
        return result

    def save_tuned_config(self) -> None:
        """Settings the task tuned on the dev set (`task.tuned_config`) go into model/config.json when that
        is the model just evaluated (trained by this run, or the exported model evaluated alone)."""
        tuned = self.task.tuned_config()
        path = self.exported / "config.json"
        if not tuned or not path.is_file():
            return
        config = json.loads(path.read_text(encoding="utf-8"))
        config.update(tuned)
        with atomic_write(path) as f:
            f.write(json.dumps(config, indent=2, sort_keys=True) + "\n")
        logger.info("saved %s tuned on the dev set to %s", ", ".join(tuned), path)

    def features_of(self, examples: Sequence) -> list:
        args = self.args
        return self.task.convert(examples, self.tokenizer, args.max_seq_length, pad=args.pad_to_max_seq_length)

    @property
    def vocab_file(self) -> str:
        vocab_file = self.files.start.vocab_file
        assert vocab_file is not None  # resolve_starting_model refuses a fine-tuning run without a vocabulary
        return vocab_file

    def load_model(self) -> tuple[FineTuningHead, int, dict | None]:
        """The model, the step its weights come from, and the training state to resume (or None): see
        `StartingModel.load_weights`."""
        args, start = self.args, self.files.start
        checkpointing.set_seed(args.seed)
        head = MODEL_CLASSES[self.task.head]
        assert issubclass(head, FineTuningHead)  # a task's head is a fine-tuning head
        model, global_step, state = start.build(
            head, args, self.exported, FINETUNE_STATE_NAME, **self.task.model_kwargs()
        )
        logger.info("%s: %d parameters", type(model).__name__, num_parameters(model))
        self.wrapped = training.prepare_model(model, args, self.dist)
        if self.evaluate_during_training:
            self.history.load(global_step)
        return model, global_step, state

    def run_model(
        self, examples: Sequence, features: Sequence, batch_size: int, banner: str, stage: str
    ) -> Predictions:
        """The model's outputs on `features` (of `examples`), logged as run_classifier.py logs evaluation and
        prediction (`banner`, its own words), the progress bar labelled `stage`."""
        args = self.args
        logger.info(banner)
        logger.info("  Num examples = %d (%d actual, 0 padding)", len(examples), len(examples))
        logger.info("  Batch size = %d", batch_size)
        return predict(
            self.model,
            self.task,
            features,
            batch_size,
            self.dist,
            args.precision,
            args.group_by_length,
            self.pad_to,
            desc=f"{self.task.command} {stage}",
        )

    def evaluate(self, step: int) -> dict[str, Any]:
        """The dev set's metrics at `step` ({"results", "pred"})."""
        args, examples, features = self.args, self.dev_examples, self.dev_features
        pred = self.run_model(examples, features, args.eval_batch_size, "***** Running evaluation *****", "eval")
        results = {**self.task.metrics(examples, features, pred.outputs), **loss_metrics(pred, args.eval_batch_size)}
        results["global_step"] = step
        return {"results": results, "pred": pred}

    def predict_test_set(self) -> dict[str, Any] | None:
        args, examples = self.args, self.test_examples
        features = self.features_of(examples)
        pred = self.run_model(examples, features, args.predict_batch_size, "***** Running prediction*****", "predict")
        written = None
        if self.dist.is_main:
            written = self.task.write_predictions(self.output_dir, examples, features, pred.outputs)
        self.dist.barrier()
        return written

    def train(self, state: dict | None) -> dict[str, float] | None:
        """Steps up to `num_train_steps` (with evaluations and early stopping when asked), then the export
        of the final model: the best checkpoint when the dev set was scored during training, else the last.
        Returns the last logged training metrics, None when no step was left to run."""
        args, task, dist = self.args, self.task, self.dist
        features = self.features_of(self.train_examples)
        extra = None
        loss_fn: training.LossFn = training.head_loss
        if self.teacher is not None:
            assert isinstance(args, DistillArgs)
            features, extra = self.distillation_inputs(features)
            loss_fn = distillation.distillation_loss(self.teacher.kind, args.distill_alpha, args.temperature)
        trainer = training.make_trainer(
            self.model,
            self.wrapped,
            args,
            dist,
            num_train_steps=self.total_steps,
            num_warmup_steps=self.warmup_steps,
            vocab_file=self.vocab_file,
            do_lower_case=args.do_lower_case,
            desc=f"{task.command} train",
            keep_checkpoint_max=0 if self.evaluate_during_training else None,
        )
        torch.manual_seed(args.seed + dist.rank)  # dropout differs across ranks, as their examples do
        if state is not None:
            self.restore(trainer, state, len(features))
        lengths = [task.feature_length(f) for f in features]
        plan = BatchPlan(lengths, args.train_batch_size, args.seed, group_by_length=args.group_by_length)
        logger.info("***** Running training *****")
        logger.info("  Num examples = %d", len(self.train_examples) + len(self.transfer_examples))
        logger.info("  Batch size = %d", args.train_batch_size)
        logger.info("  Num steps = %d", self.total_steps)
        logger.info("  Warmup steps = %d", self.warmup_steps)
        if trainer.global_step >= self.total_steps:
            logger.info("training already finished at step %d (%s)", trainer.global_step, self.resume_dir)
        accumulation = args.gradient_accumulation_steps

        def batches(step: int) -> Iterator[list[dict[str, torch.Tensor]]]:
            return train_batches(
                plan, task, features, step, dist.rank, dist.world_size, accumulation, self.pad_to, extra
            )

        last = evaluations.train_with_evaluations(
            trainer,
            batches,
            loss_fn,
            self.total_steps,
            plan.state,
            history=self.history if self.evaluate_during_training else None,
            evaluate=self.evaluation_scores,
            eval_every_steps=args.eval_every_steps,
            keep_checkpoint_max=args.keep_checkpoint_max,
            totals_fn=type(self.model).loss_normalizers,
            checkpoint_info={"command": task.command, "num_train_steps": self.total_steps, "seed": args.seed},
        )
        self.export(trainer)
        return last

    def export(self, trainer: training.Trainer) -> None:
        """Export the final model to model/: the best checkpoint's when the dev set was scored during training,
        else the last step's."""
        self.global_step = trainer.global_step
        if self.evaluate_during_training:
            verify = not self.args.ignore_checkpoint_digest
            self.global_step = self.history.restore_best(self.model, self.output_dir, self.global_step, verify)
        state_file = {FINETUNE_STATE_NAME: {"command": self.task.command, "global_step": self.global_step}}
        trainer.export_model(self.exported, extra_files=state_file)
        logger.info("saved the model of step %d to %s", self.global_step, self.exported)

    def restore(self, trainer: training.Trainer, state: dict, num_features: int) -> None:
        """Resume `trainer` from a checkpoint's `state`, warning when the data or batch size differ from its."""
        trainer.restore(state)
        data = state.get("data", {})
        if data.get("num_features") != num_features or data.get("batch_size") != self.args.train_batch_size:
            logger.warning(
                "the training data or batch size differ from the checkpoint's (%s features, batch %s): the "
                "run continues, but not as an uninterrupted one would",
                data.get("num_features"),
                data.get("batch_size"),
            )

    def evaluation_scores(self, step: int) -> dict[str, float]:
        """The dev set's metrics at `step`, as evaluations during training record them."""
        return {k: float(v) for k, v in self.evaluate(step)["results"].items() if k != "global_step"}
