"""The one training loop (`Trainer`), used by pre-training, fine-tuning and the sentence commands alike.

It knows models, optimizers and checkpoints, but no task: a task hands it the model, an iterator of
per-step micro-batches and a loss function. What it does, in the order of one step:

1. `totals_fn` sums normalisers over the step's micro-batches and all ranks (e.g. the number of
   examples and the sum of the masked-LM weights of the *global* batch);
2. for each micro-batch, `loss_fn(model, batch, totals)` returns this micro-batch's contribution to the
   global batch's loss, which is backpropagated (times the world size, since DDP and FSDP average
   gradients over ranks); the contributions of all micro-batches and ranks add up to the loss of the
   whole global batch, so gradient accumulation and data parallelism give the gradient of one big
   batch, not an average of per-batch losses;
3. the reduced gradient is clipped to a global norm (1.0, as the original), the optimizer and the
   scheduler step.

Around it: device and precision (fp32; bf16 autocast; fp16 autocast with a GradScaler), DDP or FSDP
under `torchrun`, a tqdm bar, metrics every `log_every` steps to `metrics.jsonl` and TensorBoard, a guard
against non-finite steps, and checkpoints `output_dir/checkpoint-<step>/` of the weights and the training
state (`bert.checkpointing` writes and reads them; rerunning with the same output directory resumes from
the newest one). The rest of a run has modules of its own: the output directory (`bert.run_dir`),
evaluations during training (`bert.evaluations`) and the batches (`bert.batching`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.fsdp import FSDPModule
from torch.nn.parallel import DistributedDataParallel

from bert.checkpointing import (
    CHECKPOINT_PREFIX,
    check_finite_weights,
    export_model,
    get_rng_state,
    latest_checkpoint,
    prune_checkpoints,
    remove_incomplete,
    set_rng_state,
    write_checkpoint,
)

# Re-exported for `bert.starting_model`, which reads the checkpoint a run resumes (`bert.checkpointing`'s).
from bert.distributed import DistContext, autocast, wrap_model
from bert.errors import InputError, NonFiniteError
from bert.flags import PRECISIONS, PerformanceArgs, TrainingArgs
from bert.formats.tensorboard import EventWriter
from bert.modeling import BertPreTrainedModel
from bert.optimization import clip_grad_norm, create_optimizer
from bert.plotting import METRICS_NAME
from bert.utils import progress

logger = logging.getLogger(__name__)


def prepare_model(
    model: BertPreTrainedModel, args: PerformanceArgs, dist: DistContext, fsdp: bool = False
) -> nn.Module:
    """Gradient checkpointing and `--compile` as the flags say, then `wrap_model`; returns the wrapped model."""
    if args.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    if args.compile:
        compile_model(model)
    return wrap_model(model, dist, fsdp=fsdp)


def head_loss(model: nn.Module, batch: dict, totals: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """A `LossFn` for the fine-tuning heads: the head's own loss over the global batch's loss terms."""
    out = model(**batch, loss_normalizers=totals)
    return out.loss, {"loss": out.loss.detach()}


def _is_fsdp(model: nn.Module) -> bool:
    return hasattr(model, "set_requires_gradient_sync")


def compile_model(model: torch.nn.Module, **compile_kwargs: Any) -> torch.nn.Module:
    """`torch.compile` the model in place (`--compile`), with a fallback to eager execution.

    In place, like `nn.Module.compile`: the class, the parameter names and the state dict stay as they
    are, and DDP or FSDP wrap the model afterwards as usual (DDP's forward marks the compiled frame so that
    dynamo splits the graph at gradient buckets). Compilation happens at the first call; when torch.compile
    itself fails there (no C++ compiler or Triton, an unsupported operator, ...), a warning is logged and
    the model runs eagerly from then on. Errors of the inputs are raised as in eager mode.

    Args:
        model: the unwrapped model.
        compile_kwargs: passed to `torch.compile` (e.g. `backend`, `mode`, `dynamic`).

    Returns:
        `model` itself.
    """
    try:
        compiled = torch.compile(model._call_impl, **compile_kwargs)
    except Exception as e:  # torch.compile unsupported on this platform or Python version
        logger.warning("--compile: torch.compile is unavailable (%s: %s); running eagerly", type(e).__name__, e)
        return model

    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return compiled(*args, **kwargs)
        except torch._dynamo.exc.TorchDynamoException as e:
            reason = str(e).strip().splitlines()[0] if str(e).strip() else ""
            logger.warning("--compile: compilation failed (%s: %s); running eagerly", type(e).__name__, reason)
            model._compiled_call_impl = None
            return model._call_impl(*args, **kwargs)

    model._compiled_call_impl = call
    return model


# ------------------------------------------------------------------------------------------ logging
class MetricsLogger:
    """Scalars to `output_dir/metrics.jsonl` (one JSON object per line) and to TensorBoard events."""

    def __init__(self, output_dir: str | os.PathLike, start_step: int = 0, tensorboard_subdir: str | None = None):
        self.path = Path(output_dir) / METRICS_NAME
        if self.path.exists():
            # A resumed run repeats the steps after its checkpoint: drop their old lines.
            kept = [
                line
                for line in self.path.read_text(encoding="utf-8").splitlines()
                if line.strip() and json.loads(line).get("step", 0) <= start_step
            ]
            self.path.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
        logdir = Path(output_dir) / tensorboard_subdir if tensorboard_subdir else Path(output_dir)
        self.events = EventWriter(logdir)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"step": step, **metrics}) + "\n")
        self.events.add_scalars(step, {k: v for k, v in metrics.items() if isinstance(v, (int, float))})

    def close(self) -> None:
        self.events.close()


def pin_memory(item: Any) -> Any:
    """`item` (tensors in lists and dicts) with every tensor in page-locked memory."""
    if isinstance(item, torch.Tensor):
        return item.pin_memory()
    if isinstance(item, dict):
        return {k: pin_memory(v) for k, v in item.items()}
    if isinstance(item, list):
        return [pin_memory(v) for v in item]
    return item


def prefetch(iterator: Iterator, depth: int = 2, pin: bool = False) -> Generator:
    """Run `iterator` in a background thread, `depth` items ahead (batch assembly overlaps compute).

    With `pin`, the thread also copies each item's tensors to page-locked memory, so that the
    `non_blocking` host-to-GPU copies of `to_device` really are asynchronous.
    """
    q: queue.Queue = queue.Queue(maxsize=depth)
    done = object()
    stop = threading.Event()

    def put(entry: tuple[Any, BaseException | None]) -> bool:
        """Queue `entry`; False once the consumer has stopped (a full queue would never drain)."""
        while not stop.is_set():
            try:
                q.put(entry, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def work() -> None:
        try:
            for item in iterator:
                if pin:
                    item = pin_memory(item)
                if not put((item, None)):
                    return
            put((done, None))
        except BaseException as e:  # handed to the consumer
            put((None, e))

    thread = threading.Thread(target=work, daemon=True, name="prefetch")
    thread.start()
    try:
        while True:
            item, err = q.get()
            if err is not None:
                raise err
            if item is done:
                return
            yield item
    finally:
        stop.set()
        # Joined, not left behind: a thread still assembling a batch in torch when the process exits (a run
        # ending on an error) aborted it with "terminate called without an active exception" (exit 134).
        thread.join()


def to_device(batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    return {k: v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


# ------------------------------------------------------------------------------------------- trainer
LossFn = Callable[[nn.Module, dict, dict], tuple[torch.Tensor, dict[str, torch.Tensor]]]
TotalsFn = Callable[[dict], dict[str, torch.Tensor]]


@dataclass
class TrainerSettings:
    """How a `Trainer` steps, logs and saves: job settings the training commands take from their flags.

    Attributes:
        precision: "fp32", "bf16" (autocast) or "fp16" (autocast and a GradScaler).
        max_grad_norm: global-norm clipping of the reduced gradient (the original: 1.0).
        save_checkpoints_steps: save every this many steps, and after the last step.
        save_checkpoints_minutes: also save when this many minutes have passed since the last save (0: off).
        keep_checkpoint_max: keep this many newest checkpoints (0 keeps all).
        log_every: write metrics every this many steps, and after the last step.
        examples_per_step: sequences per optimizer step over all ranks (for sequences/s).
        vocab, do_lower_case: the vocabulary file's bytes and the casing, saved beside the weights so checkpoints
            are complete models. The resume rule of every runner: a checkpoint holds all a run needs to resume
            from it, and the run holds its vocabulary in memory from its start, never as the path it came from,
            which may be the checkpoint it resumed, rotated away by `keep_checkpoint_max` before the export.
        desc: the progress bar's label.
        max_nonfinite_steps: steps with a non-finite loss or gradient norm skipped before the run stops.
    """

    precision: str = "fp32"
    max_grad_norm: float = 1.0
    save_checkpoints_steps: int = 1000
    save_checkpoints_minutes: float = 0.0
    keep_checkpoint_max: int = 5
    log_every: int = 100
    examples_per_step: int = 1
    vocab: bytes | None = None
    do_lower_case: bool | None = None
    desc: str = "train"
    max_nonfinite_steps: int = 0


class _LogWindow:
    """The applied steps since the last log line: their summed metrics and learning rates, and when it began."""

    def __init__(self) -> None:
        self.sums: dict[str, torch.Tensor] = {}
        self.steps = 0
        self.lr_sum = 0.0
        self.start = time.perf_counter()

    def add(self, metrics: dict[str, torch.Tensor], lr: float) -> None:
        for k, v in metrics.items():
            self.sums[k] = self.sums[k] + v if k in self.sums else v
        self.lr_sum += lr
        self.steps += 1


class Trainer:
    """Runs optimizer steps, logs, saves and resumes checkpoints.

    Args:
        model: the unwrapped model (its `config` is saved with the weights).
        wrapped: what `wrap_model` returned (the model itself in a single process).
        optimizer, scheduler: built from `model` after wrapping; the scheduler steps once per step.
        dist: from `init_distributed`.
        output_dir: checkpoints, metrics and events go here (written by rank 0 only).
        settings: precision, clipping, checkpoint and log intervals (see `TrainerSettings`).
    """

    def __init__(
        self,
        model: nn.Module,
        wrapped: nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: torch.optim.lr_scheduler.LRScheduler,
        dist: DistContext,
        output_dir: str | os.PathLike,
        settings: TrainerSettings,
    ):
        if settings.precision not in PRECISIONS:
            raise InputError(f"--precision={settings.precision} is not one of {', '.join(PRECISIONS)}")
        self.model = model
        self.wrapped = wrapped
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.dist = dist
        self.output_dir = Path(output_dir)
        self.settings = settings
        self.log_every = max(1, settings.log_every)
        self.scaler = torch.amp.GradScaler(dist.device.type) if settings.precision == "fp16" else None
        self.fsdp = _is_fsdp(wrapped)
        self.global_step = 0
        self.nonfinite_steps = 0  # steps skipped for a non-finite loss or gradient norm (--max_nonfinite_steps)

    # ---------------------------------------------------------------------------------- state
    def _model_state(self) -> dict[str, torch.Tensor]:
        if self.fsdp:
            state = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
            # A model's state is tensors (the declared value type covers optimizer states too).
            return cast(dict[str, torch.Tensor], state)
        return self.model.state_dict()

    def _optimizer_state(self) -> dict[str, Any]:
        # Keyed by parameter name (not position) and unsharded, so that a checkpoint resumes in one
        # process, under DDP or under FSDP alike.

        options = StateDictOptions(full_state_dict=True, cpu_offload=True) if self.fsdp else StateDictOptions()
        return get_optimizer_state_dict(self.model, self.optimizer, options=options)

    def _check_finite(self, model_state: dict[str, torch.Tensor], what: str) -> None:
        """`check_finite_weights` on rank 0 (which holds the full state), its verdict raised on every rank."""
        message = None
        if self.dist.is_main:
            try:
                check_finite_weights(model_state, what)
            except NonFiniteError as e:
                message = str(e)
        message = self.dist.gather_object(message)[0]
        if message is not None:
            raise NonFiniteError(message)

    def _unsharded(self, model_state: dict[str, torch.Tensor]) -> nn.Module:
        if not self.fsdp:
            return self.model
        # save_pretrained wants a module: rebuild an unsharded copy on the CPU, of the class FSDP wrapped.

        cls = next(
            c for c in type(self.model).__mro__ if issubclass(c, BertPreTrainedModel) and not issubclass(c, FSDPModule)
        )
        with torch.random.fork_rng(devices=[]):  # its initialisation must not advance the dropout RNG
            model = cls(self.model.config)
        model.load_state_dict(model_state)
        return model

    def export_model(self, path: str | os.PathLike, extra_files: dict[str, Any] | None = None) -> Path | None:
        """Weights only, in the native layout (collective: call on every rank; rank 0 writes)."""
        model_state = self._model_state()
        self._check_finite(model_state, f"step {self.global_step}: the model to export to {path}")
        out = None
        if self.dist.is_main:
            s = self.settings
            out = export_model(self._unsharded(model_state), path, s.vocab, s.do_lower_case, extra_files)
            logger.info("exported the model to %s", out)
        self.dist.barrier()
        return out

    def save_checkpoint(self, step: int, data_state: dict[str, Any], info: dict[str, Any] | None = None) -> Path | None:
        """Write `checkpoint-<step>` (collective: call on every rank; rank 0 writes) and prune old ones."""
        rng = self.dist.gather_object(get_rng_state())
        model_state = self._model_state()
        optimizer_state = self._optimizer_state()
        path = self.output_dir / f"{CHECKPOINT_PREFIX}{step}"
        self._check_finite(model_state, f"step {step}: the checkpoint {path.name}")
        if self.dist.is_main:
            state = {
                "step": step,
                "optimizer": optimizer_state,
                "scheduler": self.scheduler.state_dict(),
                "scaler": self.scaler.state_dict() if self.scaler is not None else None,
                "rng": rng,
                "data": data_state,
                "world_size": self.dist.world_size,
                "nonfinite_steps": self.nonfinite_steps,
            }
            summary = {"global_step": step, "data": data_state, "world_size": self.dist.world_size, **(info or {})}
            s = self.settings
            write_checkpoint(path, self._unsharded(model_state), state, summary, s.vocab, s.do_lower_case)
            logger.info("saved checkpoint %s", path)
            prune_checkpoints(self.output_dir, s.keep_checkpoint_max, None)
        self.dist.barrier()
        return path if self.dist.is_main else None

    def restore(self, state: dict[str, Any]) -> None:
        """Load optimizer, scheduler, scaler and RNG states from a `load_training_state` result.

        The weights are loaded separately, into the model before wrapping (see `bert.pretrain`).
        """

        options = StateDictOptions(full_state_dict=True) if self.fsdp else StateDictOptions()
        set_optimizer_state_dict(self.model, self.optimizer, state["optimizer"], options=options)
        self.scheduler.load_state_dict(state["scheduler"])
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        rng = state["rng"]
        if len(rng) == self.dist.world_size:
            set_rng_state(rng[self.dist.rank])
        else:
            logger.warning(
                "the checkpoint was written by %d processes, this run has %d: RNG states (dropout) are re-seeded",
                len(rng),
                self.dist.world_size,
            )
            torch.manual_seed(int(state["step"]) * 1000 + self.dist.rank)
        self.global_step = int(state["step"])
        self.nonfinite_steps = int(state.get("nonfinite_steps", 0))

    # ---------------------------------------------------------------------------------- loop
    def _save_due(self, last_save: float) -> bool:
        """Whether --save_checkpoints_minutes have passed since `last_save` on any rank (every rank saves
        together, as FSDP's gather of the full weights needs)."""
        minutes = self.settings.save_checkpoints_minutes
        if minutes <= 0:
            return False
        due = torch.tensor([float(time.perf_counter() - last_save >= 60 * minutes)])
        return bool(self.dist.all_reduce_sum(due.to(self.dist.device)).item() > 0)

    def train(
        self,
        batches: Iterator[list[dict[str, torch.Tensor]]],
        loss_fn: LossFn,
        num_train_steps: int,
        data_state: Callable[[int], dict[str, Any]],
        totals_fn: TotalsFn | None = None,
        checkpoint_info: dict[str, Any] | None = None,
    ) -> dict[str, float]:
        """Run steps from `self.global_step` to `num_train_steps`.

        Args:
            batches: per step, this rank's list of micro-batches (dicts of CPU tensors).
            loss_fn: `(wrapped_model, micro_batch, totals) -> (loss, metrics)`: the micro-batch's
                contribution to the global batch's loss, and detached scalar contributions to metrics
                (summed over micro-batches and ranks, averaged over the steps of a log window).
            num_train_steps: the step to stop at.
            data_state: `step -> JSON-able data position` reached after `step` steps, saved in checkpoints.
            totals_fn: per micro-batch normalisers, summed over the step's micro-batches and all ranks
                and passed to `loss_fn`.
            checkpoint_info: extra fields for each checkpoint's `trainer_state.json`.

        Returns:
            The metrics of the last log window (empty when no step ran).
        """
        if self.dist.is_main:
            remove_incomplete(self.output_dir)
        metrics_logger = MetricsLogger(self.output_dir, self.global_step) if self.dist.is_main else None
        bar = progress(
            total=num_train_steps,
            initial=self.global_step,
            desc=self.settings.desc,
            unit="step",
            disable=not self.dist.is_main,
        )
        self.wrapped.train()
        window = _LogWindow()
        last_save = time.perf_counter()
        last: dict[str, float] = {}
        try:
            while self.global_step < num_train_steps:
                micro_batches = [to_device(b, self.dist.device) for b in next(batches)]
                step_metrics, lr = self._step(micro_batches, loss_fn, totals_fn)
                bar.update(1)
                if step_metrics is not None:  # a skipped step's values would make the window's means NaN
                    window.add(step_metrics, lr)
                final = self.global_step == num_train_steps
                if (self.global_step % self.log_every == 0 or final) and window.steps:
                    last = self._log(window, metrics_logger, bar)
                    window = _LogWindow()
                if self.global_step % self.settings.save_checkpoints_steps == 0 or final or self._save_due(last_save):
                    self.save_checkpoint(self.global_step, data_state(self.global_step), checkpoint_info)
                    last_save = time.perf_counter()
        finally:
            bar.close()
            if metrics_logger is not None:
                metrics_logger.close()
        return last

    def _step(
        self, micro_batches: list[dict[str, torch.Tensor]], loss_fn: LossFn, totals_fn: TotalsFn | None
    ) -> tuple[dict[str, torch.Tensor] | None, float]:
        """One optimizer step over the micro-batches; returns its metrics with the gradient norm (None when its
        update was skipped, see `_guard`) and the learning rate it used."""
        lr = float(self.optimizer.param_groups[0]["lr"])
        step_metrics, loss = self._forward_backward(micro_batches, loss_fn, self._totals(micro_batches, totals_fn))
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        grad_norm = clip_grad_norm(self.model.parameters(), self.settings.max_grad_norm)
        if hasattr(grad_norm, "full_tensor"):  # FSDP: a replicated DTensor
            grad_norm = grad_norm.full_tensor()
        apply = self._guard(loss, grad_norm)
        if self.scaler is not None:
            self.scaler.step(self.optimizer)  # skips the update itself when the gradient is not finite
            self.scaler.update()
        elif apply:
            self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.global_step += 1
        step_metrics["grad_norm"] = grad_norm.detach().float()
        return (step_metrics if apply else None), lr

    def _totals(
        self, micro_batches: list[dict[str, torch.Tensor]], totals_fn: TotalsFn | None
    ) -> dict[str, torch.Tensor]:
        """`totals_fn`'s normalisers summed over the step's micro-batches and all ranks (none without it)."""
        if totals_fn is None:
            return {}
        parts = [totals_fn(b) for b in micro_batches]
        keys = sorted(parts[0])
        summed = torch.stack([sum((p[k].float() for p in parts[1:]), parts[0][k].float()) for k in keys])
        return dict(zip(keys, self.dist.all_reduce_sum(summed)))

    def _guard(self, loss: torch.Tensor, grad_norm: torch.Tensor) -> bool:
        """Whether this step's update may be applied: the loss and the gradient norm must be finite on every
        rank. A step that is not is skipped and counted; past --max_nonfinite_steps the run stops here, before
        the update, so the weights and the last checkpoint stay good. Under fp16 a non-finite gradient with a
        finite loss is the loss scaler's business (it skips the step and lowers its scale)."""
        bad = torch.stack([~torch.isfinite(loss.detach().float()), ~torch.isfinite(grad_norm.detach().float())])
        bad_loss, bad_grad = (bool(x) for x in self.dist.all_reduce_sum(bad.float()).tolist())  # one sync per step
        if not bad_loss and (not bad_grad or self.scaler is not None):
            return True
        step = self.global_step + 1
        what = "the loss" if bad_loss else "the gradient norm"
        self.nonfinite_steps += 1
        if self.nonfinite_steps > self.settings.max_nonfinite_steps:
            last = latest_checkpoint(self.output_dir)
            kept = f"the last good checkpoint is {last.name}" if last is not None else "no checkpoint was saved yet"
            skipped = f" after {self.nonfinite_steps - 1} skipped" if self.nonfinite_steps > 1 else ""
            raise NonFiniteError(
                f"step {step}: {what} is not a finite number{skipped}; the run stopped without applying it and "
                f"{kept}; lower --learning_rate or check the data, or pass --max_nonfinite_steps=N to skip up to N "
                "such steps"
            )
        logger.warning(
            "step %d: %s is not a finite number; its update is skipped (%d of --max_nonfinite_steps=%d)",
            step,
            what,
            self.nonfinite_steps,
            self.settings.max_nonfinite_steps,
        )
        self.optimizer.zero_grad(set_to_none=True)
        return False

    def _forward_backward(
        self, micro_batches: list[dict[str, torch.Tensor]], loss_fn: LossFn, totals: dict[str, torch.Tensor]
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """Forward and backward passes over the micro-batches; returns the summed metrics and this rank's loss."""
        sums: dict[str, torch.Tensor] = {}
        loss_sum = torch.zeros((), device=self.dist.device)
        n = len(micro_batches)
        for i, batch in enumerate(micro_batches):
            sync = i == n - 1  # reduce gradients across ranks only after the last micro-batch
            if isinstance(self.wrapped, FSDPModule):
                self.wrapped.set_requires_gradient_sync(sync)
                ctx: contextlib.AbstractContextManager = contextlib.nullcontext()
            elif isinstance(self.wrapped, DistributedDataParallel) and not sync:
                ctx = self.wrapped.no_sync()
            else:
                ctx = contextlib.nullcontext()
            with ctx:
                with autocast(self.dist.device, self.settings.precision):
                    loss, metrics = loss_fn(self.wrapped, batch, totals)
                loss_sum = loss_sum + loss.detach().float()
                # DDP and FSDP average gradients over ranks; the contributions are meant to be summed.
                loss = loss * self.dist.world_size
                (self.scaler.scale(loss) if self.scaler is not None else loss).backward()
            for k, v in metrics.items():
                sums[k] = sums.get(k, 0) + v.detach().float()
        return sums, loss_sum

    def _log(self, window: _LogWindow, metrics_logger: MetricsLogger | None, bar: Any) -> dict[str, float]:
        # Metric contributions are summed over ranks; the gradient norm is the same on every rank.
        steps, sums = window.steps, window.sums
        seconds = time.perf_counter() - window.start
        keys = sorted(k for k in sums if k != "grad_norm")
        out: dict[str, float] = {}
        if keys:
            values = self.dist.all_reduce_sum(torch.stack([sums[k] for k in keys])) / steps
            out = {k: float(v) for k, v in zip(keys, values.tolist())}
        out["grad_norm"] = float(sums["grad_norm"]) / steps
        out["learning_rate"] = window.lr_sum / steps
        out["sequences_per_second"] = self.settings.examples_per_step * steps / max(seconds, 1e-9)
        if self.nonfinite_steps:
            out["nonfinite_steps"] = self.nonfinite_steps
        if metrics_logger is not None:
            metrics_logger.log(self.global_step, out)
            bar.set_postfix(
                loss=f"{out.get('loss', float('nan')):.4f}", seq_s=f"{out['sequences_per_second']:.1f}", refresh=False
            )
            logger.info(
                "step %d: %s", self.global_step, ", ".join(f"{k} = {v:.6g}" for k, v in out.items() if k != "step")
            )
        return out


def make_trainer(
    model: nn.Module,
    wrapped: nn.Module,
    args: TrainingArgs,
    dist: DistContext,
    *,
    num_train_steps: int,
    num_warmup_steps: int,
    vocab_file: str | None,
    do_lower_case: bool | None,
    desc: str,
    keep_checkpoint_max: int | None = None,
) -> Trainer:
    """The `Trainer` of a training command: the optimizer and schedule of `--optimizer`, `--learning_rate`
    and `--weight_decay` over `num_train_steps`, and the `TrainerSettings` of its flags.
    `keep_checkpoint_max` overrides the flag (0 when evaluations during training prune the checkpoints)."""
    optimizer, scheduler = create_optimizer(
        model, args.learning_rate, num_train_steps, num_warmup_steps, args.optimizer, args.weight_decay
    )
    settings = TrainerSettings(
        precision=args.precision,
        save_checkpoints_steps=args.save_checkpoints_steps,
        save_checkpoints_minutes=args.save_checkpoints_minutes,
        keep_checkpoint_max=args.keep_checkpoint_max if keep_checkpoint_max is None else keep_checkpoint_max,
        log_every=args.log_every,
        examples_per_step=args.train_batch_size,
        # Read once, now: the file may be in the checkpoint this run resumes, which rotation can remove.
        vocab=Path(vocab_file).read_bytes() if vocab_file else None,
        do_lower_case=do_lower_case,
        desc=desc,
        max_nonfinite_steps=args.max_nonfinite_steps,
    )
    return Trainer(model, wrapped, optimizer, scheduler, dist, args.output_dir, settings)
