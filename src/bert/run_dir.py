"""The output directory of a training command's run: claimed, compared with the run it holds, logged to.

Every training runner (fine-tuning, the sentence commands, pre-training) wraps its work in `run_directory`:
rank 0 claims the directory (`bert.outputs.claim`, through `claim_output_dir`), compares the run-defining
flags with the run the directory holds (`record_run`: `args.json`, and `args_history.jsonl` for reruns with
`--allow_changed_flags`) and sends this package's INFO log to `log.txt`. `finish_run` ends the run: the
curves and the exported model's card. The names of what a run leaves in the directory are here too
(`MODEL_DIR`, `RESULT_FILES`, `RESULT_NAMES`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bert.checkpoint import CONFIG_NAME
from bert.checkpointing import latest_checkpoint
from bert.distributed import DistContext
from bert.errors import InputError
from bert.flags import TrainingArgs
from bert.model_card import write_model_card
from bert.outputs import claim
from bert.plotting import CURVES_NAME, METRICS_NAME, try_plot
from bert.utils import atomic_write, load_json_file, log_to_file, write_run_info

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

logger = logging.getLogger(__name__)

ARGS_NAME = "args.json"
ARGS_HISTORY_NAME = "args_history.jsonl"
MODEL_DIR = "model"
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
