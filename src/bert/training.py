"""One small training loop, used by `bert pretrain` and meant for the fine-tuning commands too.

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
under `torchrun`, a tqdm bar, metrics every `log_every` steps to `metrics.jsonl` and TensorBoard, and
checkpoints `output_dir/checkpoint-<step>/` written into a temporary directory and renamed, holding the
weights in the native layout (`bert.checkpoint.save_pretrained`) and `training_state.pt` (optimizer,
scheduler, scaler, step, every rank's RNG states and the task's data position) readable with
`torch.load(weights_only=True)`. Rerunning with the same output directory resumes from the newest one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import queue
import random
import re
import shutil
import sys
import threading
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Protocol, cast

import numpy as np
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

from bert.checkpoint import CONFIG_NAME, load_into, read_checkpoint, save_pretrained, write_vocab
from bert.config import SHAPE_FIELDS, BertConfig
from bert.distributed import DistContext, autocast, wrap_model
from bert.errors import InputError, NonFiniteError
from bert.flags import PRECISIONS, PerformanceArgs, TrainingArgs
from bert.formats.tensorboard import EventWriter
from bert.metrics import greater_is_better
from bert.model_card import write_model_card
from bert.modeling import BertPreTrainedModel
from bert.optimization import clip_grad_norm, create_optimizer
from bert.outputs import atomic_directory, claim, remove_temporaries
from bert.plotting import CURVES_NAME, METRICS_NAME, try_plot
from bert.utils import atomic_write, load_json_file, log_to_file, progress, write_run_info

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

logger = logging.getLogger(__name__)

CHECKPOINT_PREFIX = "checkpoint-"
TRAINING_STATE_NAME = "training_state.pt"
TRAINER_STATE_NAME = "trainer_state.json"
ARGS_NAME = "args.json"
ARGS_HISTORY_NAME = "args_history.jsonl"
MODEL_DIR = "model"
EVAL_HISTORY_NAME = "eval_history.json"
# What the result block of a fine-tuning or sentence run lists of its output directory, when there.
RESULT_FILES = (MODEL_DIR, "eval_results.txt", METRICS_NAME, CURVES_NAME, "log.txt")
# What a run leaves besides its checkpoints and logs: removed when a rerun continues the run with other
# flags (or starts a new training in the directory), so that no result of the earlier flags stays beside
# the new ones.
RESULT_NAMES = (
    MODEL_DIR,
    "eval_results.txt",
    "eval_results.json",
    "test_results.tsv",
    "eval_predictions.txt",
    "test_predictions.txt",
    "predictions.json",
    "nbest_predictions.json",
    "null_odds.json",
)


@contextlib.contextmanager
def claim_output_dir(
    output_dir: str | os.PathLike, command: str, dist: DistContext, inputs: dict[str, Any] | None = None
) -> Iterator[None]:
    """Hold `output_dir` for the block: rank 0 claims it (`bert.outputs.claim`: checked, locked for the run,
    leftovers of a killed run removed; `inputs`, the run's input paths, must not be it). Call it before any
    work, so that a bad output path is reported before the data and the model are read; a claim failure
    stops every rank."""
    with contextlib.ExitStack() as stack:
        error: BaseException | None = None
        if dist.is_main:
            try:
                stack.enter_context(claim(command, dirs={"--output_dir": output_dir}, inputs=inputs))
            except (InputError, OSError) as e:
                error = e
        _stop_together(dist, error)
        yield


def written_line(output_dir: Path) -> str:
    """The result block's line naming the `RESULT_FILES` a run left in `output_dir`."""
    kept = [f"{n}/" if (output_dir / n).is_dir() else n for n in RESULT_FILES if (output_dir / n).exists()]
    return f"written to {output_dir}: {', '.join(kept)}"


def _stop_together(dist: DistContext, error: BaseException | None) -> None:
    """Raise rank 0's `error` on every rank (the other ranks would otherwise wait for it in a collective)."""
    message = dist.gather_object(None if error is None else str(error))[0]
    if error is not None:
        raise error
    if message is not None:
        raise InputError(message)


@contextlib.contextmanager
def run_directory(
    output_dir: str | os.PathLike,
    command: str,
    args: TrainingArgs,
    dist: DistContext,
    inputs: dict[str, Any] | None = None,
) -> Iterator[Path]:
    """The output directory of a training command during its run.

    On entering, rank 0 claims it (`claim_output_dir`; a no-op when the run claimed it already) and
    compares the run-defining flags of `args` with the run the directory holds (`record_run`): a
    difference stops every rank with one line, unless `--allow_changed_flags`. During the block this
    package's INFO log goes to `log.txt`.
    """
    output_dir = Path(output_dir)
    with claim_output_dir(output_dir, command, dist, inputs):
        error: BaseException | None = None
        if dist.is_main:
            try:
                record_run(output_dir, command, args)
            except (InputError, OSError) as e:
                error = e
        _stop_together(dist, error)
        with log_to_file(output_dir / "log.txt", dist.is_main):
            yield output_dir


def finish_run(
    output_dir: Path,
    exported: Path,
    command: str,
    args: TrainingArgs,
    results: dict[str, Any] | None,
    dist: DistContext,
) -> None:
    """The end of a training command's run (rank 0): the curves drawn and the exported model's card written
    with the final evaluation's figures."""
    if not dist.is_main:
        return
    if (output_dir / METRICS_NAME).is_file():
        try_plot([output_dir], output_dir / CURVES_NAME)
    if (exported / CONFIG_NAME).is_file():
        write_model_card(exported, command, args, results)


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


def _resolved_paths(value: Any, cwd: str) -> Any:
    if not isinstance(value, str):
        return value
    return ",".join(os.path.normpath(os.path.join(cwd, os.path.expanduser(p.strip()))) for p in value.split(","))


def _effective_args(output_dir: Path, saved: dict) -> dict[str, Any]:
    """The flags the directory's run has now: args.json, with the changes reruns made (args_history.jsonl)."""
    args = dict(saved.get("args", {}))
    history = output_dir / ARGS_HISTORY_NAME
    if history.is_file():
        for line in history.read_text(encoding="utf-8").splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            for name, change in (entry.get("changed") or {}).items():
                args[name] = change.get("now")
    return args


def changed_flags(
    args: DataclassInstance, saved: dict[str, Any], saved_cwd: str, scopes: set[str]
) -> dict[str, dict[str, Any]]:
    """{flag: {"was", "now"}} for the run-defining flags of `args` (of the given scopes) whose value differs
    from `saved`; flags `saved` does not know (added since) are not compared."""
    changes = {}
    for f in dataclasses.fields(args):
        scope = f.metadata.get("run_defining")
        if scope not in scopes or f.name not in saved:
            continue
        was, now = saved[f.name], _jsonable(getattr(args, f.name))
        if scope == "data":  # compared, and recorded, as absolute paths
            was, now = _resolved_paths(was, saved_cwd), _resolved_paths(now, os.getcwd())
        if was != now:
            changes[f.name] = {"was": was, "now": now}
    return changes


def _remove_results(output_dir: Path, why: str) -> None:
    removed = []
    for name in RESULT_NAMES:
        p = output_dir / name
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        elif p.exists():
            p.unlink()
        else:
            continue
        removed.append(name)
    if removed:
        logger.warning("%s: removed the results of the earlier run (%s), %s", output_dir, ", ".join(removed), why)


def record_run(output_dir: Path, command: str, args: TrainingArgs) -> None:
    """Record this run in `output_dir` and check that it continues the run there.

    A run that trains from scratch (no checkpoint to resume), or that reuses nothing of the directory,
    writes `args.json`. A run that resumes its training, or evaluates or predicts with its model, must
    have the run-defining flags of the run there (`GuardArgs`): a difference raises `InputError` naming
    each one, unless `--allow_changed_flags`, which records the new values in `args_history.jsonl`
    (`args.json` keeps the flags the run started with) and removes the earlier results. Every such rerun
    adds a line to the history.
    """
    saved = load_json_file(output_dir / ARGS_NAME, "the run's flags", missing_ok=True)
    training = args.do_train
    resumes = latest_checkpoint(output_dir) is not None
    reuses = resumes or (output_dir / MODEL_DIR / CONFIG_NAME).is_file()
    if saved is None or (training and not resumes) or not reuses:
        if training and saved is not None:
            _remove_results(output_dir, "since this run trains a new model from scratch")
        write_run_info(output_dir, command, args)
        return
    if saved.get("command") != command:
        raise InputError(
            f"--output_dir={output_dir} holds a run of `bert {saved.get('command')}`, not of `bert {command}`; "
            "choose another --output_dir"
        )
    scopes = {"train", "data", "model"} if training else {"model"}
    changes = changed_flags(args, _effective_args(output_dir, saved), saved.get("cwd", os.getcwd()), scopes)
    if changes and not args.allow_changed_flags:
        listed = ", ".join(f"--{k}={v['now']} (the run has {v['was']})" for k, v in changes.items())
        what = "resume its training" if training else "reuse its model"
        raise InputError(
            f"--output_dir={output_dir} holds a run with other flags: {listed}; to {what}, pass the run's flags, "
            "or choose another --output_dir, or pass --allow_changed_flags to continue it with the new ones"
        )
    if changes:
        logger.warning(
            "continuing the run in %s with changed flags: %s (recorded in %s)",
            output_dir,
            ", ".join(f"{k} {v['was']} -> {v['now']}" for k, v in changes.items()),
            ARGS_HISTORY_NAME,
        )
        _remove_results(output_dir, "since they were made with the earlier flags")
    entry = {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": command,
        "argv": sys.argv,
        "cwd": os.getcwd(),
        "changed": changes,
        "args": _jsonable(dataclasses.asdict(args)),
    }
    history = output_dir / ARGS_HISTORY_NAME
    previous = history.read_text(encoding="utf-8") if history.is_file() else ""
    with atomic_write(history) as f:
        f.write(previous + json.dumps(entry, sort_keys=True) + "\n")


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


def set_seed(seed: int) -> None:
    """Seed Python, NumPy and torch (all devices) from one integer."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


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


# -------------------------------------------------------------------------------------- RNG states
def get_rng_state() -> dict[str, Any]:
    """Python, NumPy and torch RNG states, as tensors, lists and numbers (loadable with weights_only)."""
    version, mt, gauss = random.getstate()
    # The legacy generator's state is this tuple (`legacy=True`, the default); the stubs also allow a dict.
    legacy = cast(tuple[str, np.ndarray, int, int, float], np.random.get_state())
    name, keys, pos, has_gauss, cached = legacy
    state: dict[str, Any] = {
        "python": {"version": version, "state": list(mt), "gauss": gauss},
        "numpy": {"name": name, "keys": keys.tolist(), "pos": int(pos), "has_gauss": int(has_gauss), "cached": cached},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what `get_rng_state` returned."""
    py = state["python"]
    random.setstate((py["version"], tuple(py["state"]), py["gauss"]))
    n = state["numpy"]
    np.random.set_state((n["name"], np.array(n["keys"], dtype=np.uint32), n["pos"], n["has_gauss"], n["cached"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available() and len(state["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(state["cuda"])


# -------------------------------------------------------------------------------------- checkpoints
def list_checkpoints(output_dir: str | os.PathLike) -> list[tuple[int, Path]]:
    """Complete checkpoints `checkpoint-<step>` in `output_dir`, oldest first.

    A checkpoint directory appears under its final name only when complete (it is renamed into place),
    so temporary `.checkpoint-*` directories of an interrupted save are never listed.
    """
    out: list[tuple[int, Path]] = []
    d = Path(output_dir)
    if not d.is_dir():
        return out
    for p in d.iterdir():
        m = re.fullmatch(rf"{CHECKPOINT_PREFIX}(\d+)", p.name)
        if m and p.is_dir() and (p / TRAINING_STATE_NAME).is_file():
            out.append((int(m.group(1)), p))
    return sorted(out)


def remove_incomplete(output_dir: str | os.PathLike) -> None:
    """Delete the temporary files and directories of saves that a crash interrupted."""
    remove_temporaries(Path(output_dir))


def latest_checkpoint(output_dir: str | os.PathLike) -> Path | None:
    ckpts = list_checkpoints(output_dir)
    return ckpts[-1][1] if ckpts else None


def check_checkpoint_config(checkpoint_dir: Path, config: BertConfig, flag: str = "--bert_config_file") -> None:
    """Refuse to resume a checkpoint whose model has another shape than `config`."""
    path = checkpoint_dir / CONFIG_NAME
    try:
        saved = BertConfig.from_json_file(path)
    except (OSError, ValueError, InputError) as e:
        raise InputError(f"{path}: cannot read the config of the checkpoint to resume ({e})") from None
    diffs = [
        f"{k} {getattr(saved, k)} (now {getattr(config, k)})"
        for k in SHAPE_FIELDS
        if getattr(saved, k) != getattr(config, k)
    ]
    if diffs:
        raise InputError(
            f"{path} holds a model of another shape: {', '.join(diffs)}; the output directory is resumed "
            f"from its newest checkpoint, so pass the {flag} it was trained with, or use a new --output_dir"
        )


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            h.update(chunk)
    return h.hexdigest()


def load_training_state(checkpoint_dir: str | os.PathLike, verify: bool = True) -> dict[str, Any]:
    """Read `training_state.pt` with `weights_only=True` (it holds no pickled code).

    With `verify`, its SHA-256 must be the one saved beside it in `trainer_state.json` (torch checks no
    checksum: a flipped bit would be loaded silently).
    """
    path = Path(checkpoint_dir) / TRAINING_STATE_NAME
    state = load_json_file(Path(checkpoint_dir) / TRAINER_STATE_NAME, "checkpoint state", missing_ok=True)
    expected = (state or {}).get("training_state_sha256")
    if verify and expected is not None and path.is_file() and _file_sha256(path) != expected:
        raise InputError(
            f"{path} is damaged: it does not match the digest saved beside it in {TRAINER_STATE_NAME} (a flipped bit, "
            f"or a copy cut short); delete {Path(checkpoint_dir).name} to resume from an older checkpoint, or pass "
            "--ignore_checkpoint_digest to load it anyway"
        )
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises many types for a damaged file
        raise InputError(
            f"{path}: cannot read the training state ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); "
            f"delete {Path(checkpoint_dir).name} to resume from an older checkpoint"
        ) from None


def check_finite_weights(state: dict[str, torch.Tensor], what: str) -> None:
    """Refuse to save weights that are not finite numbers: a run that diverged must not leave a NaN model."""
    for name, t in state.items():
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise NonFiniteError(
                f"{what}: {name} holds NaN or inf values (the training diverged); nothing was saved. Lower "
                "--learning_rate, or resume from the last good checkpoint"
            )


def _save_torch(obj: Any, path: Path) -> str:
    """`torch.save` atomically; returns the SHA-256 of the bytes written. A full disk is an `OSError`
    naming `path` (torch reports it as a RuntimeError of its zip writer)."""

    class _Hashing:
        def __init__(self, f: Any):
            self.f, self.h = f, hashlib.sha256()

        def write(self, data: bytes) -> int:
            self.h.update(data)
            return self.f.write(data)

        def flush(self) -> None:
            self.f.flush()

    with atomic_write(path, "wb") as f:
        out = _Hashing(f)
        try:
            # torch.save calls only `write` and `flush`; its annotation asks for a whole binary file.
            torch.save(obj, cast(IO[bytes], out))
        except RuntimeError as e:
            cause = e.__cause__ or e.__context__
            if isinstance(cause, OSError):
                raise cause from None
            raise
    return out.h.hexdigest()


def export_model(
    model: nn.Module,
    path: str | os.PathLike,
    vocab: bytes | None = None,
    do_lower_case: bool | None = None,
    extra_files: dict[str, Any] | None = None,
) -> Path:
    """Write weights only (native layout, loadable with `from_pretrained`) to `path`, atomically, with the
    vocabulary `vocab` (its file's bytes) and `extra_files` ({relative path: JSON value}) beside them."""
    path = Path(path)
    check_finite_weights(model.state_dict(), f"the model to export to {path}")
    with atomic_directory(path) as tmp:
        _save_model(model, tmp, vocab, do_lower_case)
        for name, obj in (extra_files or {}).items():
            (tmp / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp / name).write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return path


def _save_model(model: nn.Module, out: Path, vocab: bytes | None, do_lower_case: bool | None) -> None:
    """A checkpoint's or the export's model files: weights, config, tokenizer settings and vocabulary."""
    save_pretrained(model, out, do_lower_case=do_lower_case)
    if vocab is not None:
        write_vocab(out, vocab)


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
            model = self._unsharded(model_state)
            with atomic_directory(path) as tmp:
                s = self.settings
                _save_model(model, tmp, s.vocab, s.do_lower_case)
                digest = _save_torch(state, tmp / TRAINING_STATE_NAME)
                summary = {"global_step": step, "data": data_state, "world_size": self.dist.world_size, **(info or {})}
                summary["training_state_sha256"] = digest
                with atomic_write(tmp / TRAINER_STATE_NAME) as f:
                    f.write(json.dumps(summary, indent=2, sort_keys=True) + "\n")
            logger.info("saved checkpoint %s", path)
            if self.settings.keep_checkpoint_max > 0:
                for _, old in list_checkpoints(self.output_dir)[: -self.settings.keep_checkpoint_max]:
                    shutil.rmtree(old, ignore_errors=True)
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
        dist, device = self.dist, self.dist.device
        if dist.is_main:
            remove_incomplete(self.output_dir)
        metrics_logger = MetricsLogger(self.output_dir, self.global_step) if dist.is_main else None
        bar = progress(
            total=num_train_steps,
            initial=self.global_step,
            desc=self.settings.desc,
            unit="step",
            disable=not dist.is_main,
        )
        self.wrapped.train()
        window: dict[str, torch.Tensor] = {}
        window_steps = 0
        window_lr = 0.0
        window_start = last_save = time.perf_counter()
        last: dict[str, float] = {}
        try:
            while self.global_step < num_train_steps:
                micro_batches = [to_device(b, device) for b in next(batches)]
                totals: dict[str, torch.Tensor] = {}
                if totals_fn is not None:
                    parts = [totals_fn(b) for b in micro_batches]
                    keys = sorted(parts[0])
                    summed = torch.stack([sum((p[k].float() for p in parts[1:]), parts[0][k].float()) for k in keys])
                    totals = dict(zip(keys, dist.all_reduce_sum(summed)))
                lr = self.optimizer.param_groups[0]["lr"]
                step_metrics, loss = self._forward_backward(micro_batches, loss_fn, totals)
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
                bar.update(1)

                step_metrics["grad_norm"] = grad_norm.detach().float()
                if apply:  # a skipped step's values would make the window's means NaN
                    for k, v in step_metrics.items():
                        window[k] = window.get(k, 0) + v
                    window_lr += float(lr)
                    window_steps += 1
                final = self.global_step == num_train_steps
                if (self.global_step % self.log_every == 0 or final) and window_steps:
                    seconds = time.perf_counter() - window_start
                    last = self._log(window, window_steps, window_lr, seconds, metrics_logger, bar)
                    window, window_steps, window_lr, window_start = {}, 0, 0.0, time.perf_counter()
                if self.global_step % self.settings.save_checkpoints_steps == 0 or final or self._save_due(last_save):
                    self.save_checkpoint(self.global_step, data_state(self.global_step), checkpoint_info)
                    last_save = time.perf_counter()
        finally:
            bar.close()
            if metrics_logger is not None:
                metrics_logger.close()
        return last

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

    def _log(self, window, steps: int, lr_sum: float, seconds: float, metrics_logger, bar) -> dict[str, float]:
        # Metric contributions are summed over ranks; the gradient norm is the same on every rank.
        keys = sorted(k for k in window if k != "grad_norm")
        out: dict[str, float] = {}
        if keys:
            values = self.dist.all_reduce_sum(torch.stack([window[k] for k in keys])) / steps
            out = {k: float(v) for k, v in zip(keys, values.tolist())}
        out["grad_norm"] = float(window["grad_norm"]) / steps
        out["learning_rate"] = lr_sum / steps
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


# ------------------------------------------------------------------------------ evaluations during training


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


def prune_checkpoints(output_dir: Path, keep: int, protect: int | None) -> None:
    """Keep the `keep` newest checkpoints (all when 0) and the one of step `protect`."""

    if keep <= 0:
        return
    ckpts = list_checkpoints(output_dir)
    for step, path in ckpts[:-keep]:
        if step != protect:
            shutil.rmtree(path, ignore_errors=True)


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
