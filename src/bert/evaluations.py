"""Evaluations during training (`--eval_every_steps`): the dev set scored between chunks of steps.

`train_with_evaluations` runs a `Trainer` up to each evaluation step, scores the dev set there and at the
last step, and records each score (`EvalHistory`: `eval_history.json`, `metrics.jsonl` and TensorBoard
under eval/); the checkpoints beyond the newest few are removed except the best one, which the final
evaluation and the export use (`EvalHistory.restore_best`), and `--early_stopping_patience` ends training
after that many evaluations without improvement. Fine-tuning and the sentence commands use it alike.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

import torch

from bert.checkpoint import load_into, read_checkpoint
from bert.checkpointing import CHECKPOINT_PREFIX, prune_checkpoints
from bert.errors import InputError
from bert.formats.tensorboard import EventWriter
from bert.metrics import greater_is_better
from bert.plotting import METRICS_NAME
from bert.training import LossFn, TotalsFn, Trainer, prefetch
from bert.utils import atomic_write

logger = logging.getLogger(__name__)

EVAL_HISTORY_NAME = "eval_history.json"


def check_early_stopping(args: EvaluationFlags) -> None:
    """`--early_stopping_patience` counts evaluations during training, so it needs `--eval_every_steps`."""
    if args.early_stopping_patience and not args.eval_every_steps:
        raise InputError("--early_stopping_patience needs evaluations during training: set --eval_every_steps=N")


def check_best_metric(metric: str | None, names: list[str], results_of: str) -> None:
    """`--metric_for_best_model` (None: the task's default) must be one of `names`, the keys the evaluation of
    `results_of` (e.g. "`bert classify`") returns."""
    if metric is not None and metric not in names:
        raise InputError(
            f"--metric_for_best_model={metric} is not an evaluation result of {results_of}; use one of "
            f"{', '.join(names)}"
        )


class EvaluationFlags(Protocol):
    """The flags of evaluations during training (`FinetuneArgs`' and the sentence commands')."""

    eval_every_steps: int
    early_stopping_patience: int


class EvalHistory:
    """Evaluations during training (`eval_history.json`), the best one, and early stopping."""

    def __init__(self, path: Path, metric: str, patience: int):
        self.path = path
        self.metric = metric
        self.greater_is_better = greater_is_better(metric)
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

    def restore_best(self, model: torch.nn.Module, output_dir: Path, global_step: int, verify: bool) -> int:
        """Load the best evaluation's checkpoint into `model` when it is not `global_step`'s; the step of the
        weights `model` now holds (the one to export)."""
        best = self.best()
        if best is None or best["step"] == global_step:
            return global_step
        best_dir = output_dir / f"{CHECKPOINT_PREFIX}{best['step']}"
        logger.info("using the best checkpoint %s (%s = %.6g)", best_dir, self.metric, best["metrics"][self.metric])
        load_into(model, read_checkpoint(best_dir, verify=verify))
        return int(best["step"])

    def record(self, step: int, metrics: dict[str, float], output_dir: Path, keep_checkpoint_max: int) -> None:
        """After `add` on rank 0: the history saved, the scores in metrics.jsonl and TensorBoard, a log line,
        the checkpoints beyond the `keep_checkpoint_max` newest removed except the best one."""
        self.save()
        log_eval(output_dir, step, metrics)
        best: Any = self.best()
        logger.info(
            "step %d: %s = %.6g (best %.6g at step %d)",
            step,
            self.metric,
            metrics[self.metric],
            best["metrics"][self.metric],
            best["step"],
        )
        prune_checkpoints(output_dir, keep_checkpoint_max, best["step"])

    def add(self, step: int, metrics: dict[str, float]) -> bool:
        """Record an evaluation; True when training should stop (early stopping)."""
        self.evaluations.append({"step": step, "metrics": metrics})
        best = self.best()
        since_best = sum(e["step"] > best["step"] for e in self.evaluations) if best else 0
        if best is not None and self.patience and since_best >= self.patience:
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


def log_eval(output_dir: Path, step: int, metrics: dict[str, float]) -> None:
    """An evaluation during training: a line of metrics.jsonl and TensorBoard scalars under eval/."""

    scalars = {k: v for k, v in metrics.items() if k != "loss"}
    with open(output_dir / METRICS_NAME, "a", encoding="utf-8") as f:
        f.write(json.dumps({"step": step, **scalars}) + "\n")
    with EventWriter(output_dir / "eval") as w:
        w.add_scalars(step, scalars)


def train_with_evaluations(
    trainer: Trainer,
    batches: Callable[[int], Iterator[list[dict[str, torch.Tensor]]]],
    loss_fn: LossFn,
    num_train_steps: int,
    data_state: Callable[[int], dict[str, Any]],
    *,
    history: EvalHistory | None = None,
    evaluate: Callable[[int], dict[str, float]] | None = None,
    eval_every_steps: int = 0,
    keep_checkpoint_max: int = 0,
    totals_fn: TotalsFn | None = None,
    checkpoint_info: dict[str, Any] | None = None,
) -> dict[str, float] | None:
    """Steps from `trainer.global_step` to `num_train_steps`, `batches(step)` giving the micro-batches from
    `step` on. With a `history` (evaluation during training), `evaluate(step)` scores the dev set every
    `eval_every_steps` steps and at the last; each score is recorded (`eval_history.json`, `metrics.jsonl`,
    TensorBoard under eval/), checkpoints beyond the `keep_checkpoint_max` newest are removed except the
    best one, and early stopping ends training. Returns the last logged training metrics, None when no
    step was left to run."""
    dist = trainer.dist
    output_dir = trainer.output_dir

    def evaluate_if_due(step: int) -> bool:
        # True when training is over: the last step, or early stopping.
        due = step > 0 and (step % max(eval_every_steps, 1) == 0 or step == num_train_steps)
        if history is not None and evaluate is not None and due and not history.evaluated(step):
            metrics = evaluate(step)
            stop = history.add(step, metrics)
            if dist.is_main:
                history.record(step, metrics, output_dir, keep_checkpoint_max)
            dist.barrier()
            if stop:
                return True
        return step >= num_train_steps or (history is not None and history.stopped_at is not None)

    last: dict[str, float] | None = None
    while not evaluate_if_due(trainer.global_step):
        step = trainer.global_step
        chunk_end = num_train_steps
        if history is not None:
            chunk_end = min(num_train_steps, (step // eval_every_steps + 1) * eval_every_steps)
        stream = prefetch(batches(step), pin=dist.device.type == "cuda")
        try:
            last = trainer.train(
                stream, loss_fn, chunk_end, data_state, totals_fn=totals_fn, checkpoint_info=checkpoint_info
            )
        finally:
            stream.close()
    return last
