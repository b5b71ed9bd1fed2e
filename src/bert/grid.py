"""A grid of fine-tuning runs: one run per combination of the values given to the grid flags, the best on the
dev set kept.

The small-BERT release reports each GLUE score of the best of batch sizes 8, 16, 32, 64, 128 and learning
rates 3e-4, 1e-4, 5e-5, 3e-5 over 4 epochs; `bert classify --train_batch_size=8,16,32,64,128
--learning_rate=3e-4,1e-4,5e-5,3e-5 --num_train_epochs=4 --do_train --do_eval ...` runs those 20 runs. Every
fine-tuning command runs a grid so, and `bert train-embeddings` and `bert train-reranker` too (ranked on their
--eval_file).

- The grid flags are the fields whose metadata has "grid" (`bert.flags.FinetuneArgs`, and the sentence
  commands' flags after it: --train_batch_size, --learning_rate, --num_train_epochs), the value being the flag's
  short name. The parser reads a comma list into a Python list (`list_type`); one value stays a scalar, so a
  command line without lists is an ordinary run. Args built in Python may hold a list there too.
- `expand` turns the lists into cells: the command's Args with one value per grid flag, named
  `bs=32,lr=3e-05,ep=4` (the short names, in the Args' field order).
- `run_grid` runs each cell as an ordinary run of the same command (`python -m bert COMMAND`, every other
  flag passed on as it was given: `command_line`) in `OUTPUT_DIR/grid/<cell>/`, which holds its args.json,
  log.txt, checkpoints and `terminal.txt` (what it printed). `--grid_jobs=N` runs N cells at once, each a
  process with 1/N of the CPU threads (OMP_NUM_THREADS); with one job a cell inherits the environment and
  computes what the same command run alone does. A cell that finished in an earlier run of the grid with the
  same flags is not run again; one that was interrupted, or failed, runs again and resumes from its
  checkpoints, as any run does.
- The best cell has the best dev-set score (`--metric_for_best_model`, else the task's `default_metric`; a
  loss is minimised: `bert.metrics.greater_is_better`), the first in grid order on ties. Its model is copied
  to `OUTPUT_DIR/model` and its result files (eval_results.*, predictions) beside it, so `bert predict
  --model=OUTPUT_DIR/model` uses it as it would a single run's. `grid_results.tsv` and `grid_results.json`
  hold a row per cell (its values, the metric, eval_loss, global_step, seconds, status and the error of a
  failed cell), the table printed at the end. Each cell draws its own curves (`bert plot` puts several on one
  figure).
- A cell whose process fails (a diverged loss, out of memory, a batch larger than the data) is a row with
  status "failed" and its last error line; the best of the others wins and the command ends normally, with a
  warning. Only when every cell fails does the command fail (`InputError`, exit 2).

No torch here: the cells are processes of their own.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import itertools
import json
import logging
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from bert.errors import InputError
from bert.flags import teacher_cache_dir
from bert.metrics import greater_is_better
from bert.outputs import atomic_directory, claim
from bert.utils import atomic_write, load_json_file, log_to_file, print_result, progress, write_run_info

if TYPE_CHECKING:
    from bert.commands.train_embeddings import SentenceTrainingArgs
    from bert.flags import FinetuneArgs, TrainingArgs

# The Args of the commands that run grids.
GridArgs = TypeVar("GridArgs", bound="FinetuneArgs | SentenceTrainingArgs")

logger = logging.getLogger(__name__)

GRID_DIR = "grid"  # OUTPUT_DIR/grid/<cell>/: the cells' runs
RESULTS_NAME = "grid_results"  # OUTPUT_DIR/grid_results.tsv and .json
TERMINAL_NAME = "terminal.txt"  # in a cell's directory: what its process printed
EVAL_RESULTS_NAME = "eval_results.json"


@dataclass
class Cell(Generic[GridArgs]):
    """One run of a grid: its name (also its directory's), its grid values ({flag: value}) and its Args."""

    name: str
    values: dict[str, Any]
    args: GridArgs


def grid_fields(args: TrainingArgs | type[TrainingArgs]) -> list[dataclasses.Field]:
    """The grid flags of an Args class or instance, in field order."""
    return [f for f in dataclasses.fields(args) if f.metadata.get("grid")]


def list_type(scalar: Callable[[str], Any]) -> Callable[[str], Any]:
    """The parser's type of a grid flag: one value as `scalar` reads it, or a comma list of them as a list."""

    def parse(text: str) -> Any:
        parts = [p.strip() for p in text.split(",")]
        if len(parts) == 1:
            return scalar(text)
        if not all(parts):
            raise argparse.ArgumentTypeError(f"{text!r} has an empty value; separate the values by single commas")
        values = []
        for p in parts:
            try:
                values.append(scalar(p))
            except ValueError:
                raise argparse.ArgumentTypeError(f"{text!r}: invalid {parse.__name__} value {p!r}") from None
        if len(set(values)) < len(values):
            raise argparse.ArgumentTypeError(f"{text!r} lists a value twice")
        return values

    parse.__name__ = getattr(scalar, "__name__", "value")  # argparse names the type in its errors
    return parse


def is_grid(args: GridArgs) -> bool:
    """Whether a grid flag of `args` holds a list (of values to run a grid over)."""
    return any(isinstance(getattr(args, f.name), list) for f in grid_fields(args))


def _short(value: Any) -> str:
    """A value as a cell's name shows it: 3e-05, 0.0001, 4, 32 (every digit a float needs, no more)."""
    if isinstance(value, float):
        text = f"{value:g}"
        return text if float(text) == value else repr(value)
    return str(value)


def expand(args: GridArgs, dev_flag: str) -> list[Cell[GridArgs]] | None:
    """The cells of a grid, or None for an ordinary run (after the checks that concern it).

    `dev_flag` is the command's flag that scores the dev set (`FinetuneTask.dev_flag`; the sentence commands'
    do_eval), which ranks the cells.

    Raises:
        InputError: --grid_jobs without a grid, a grid without training or dev scores or under torchrun, an
            ordinary training run in a grid's directory.
    """
    output_dir = Path(args.output_dir)
    if not is_grid(args):
        if args.grid_jobs > 1:
            raise InputError(
                f"--grid_jobs={args.grid_jobs} runs the cells of a grid at once: give several values to "
                f"{' or '.join(f'--{f.name}' for f in grid_fields(args))} (comma separated), or drop it"
            )
        if args.do_train and (output_dir / f"{RESULTS_NAME}.json").is_file():
            raise InputError(
                f"--output_dir={output_dir} holds a grid of runs ({RESULTS_NAME}.json; its runs are in "
                f"{GRID_DIR}/): train in another --output_dir"
            )
        return None
    lists = [f for f in grid_fields(args) if isinstance(getattr(args, f.name), list)]
    given = " ".join(f"--{f.name}={','.join(map(_short, _values(args, f)))}" for f in lists)
    if not (args.do_train and getattr(args, dev_flag)):
        raise InputError(
            f"a grid ({given}) trains a run per combination and keeps the best on the dev set: it needs "
            f"--do_train=true and --{dev_flag}=true"
        )
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise InputError(
            f"a grid ({given}) runs each cell as a process of its own: start it once, not under torchrun "
            "(--grid_jobs=N runs N cells at once)"
        )
    fields = grid_fields(args)
    cells = []
    for combination in itertools.product(*(_values(args, f) for f in fields)):
        values = {f.name: v for f, v in zip(fields, combination)}
        name = ",".join(f"{f.metadata['grid']}={_short(v)}" for f, v in zip(fields, combination))
        cell_args = dataclasses.replace(args, **values, grid_jobs=1, output_dir=str(output_dir / GRID_DIR / name))
        if getattr(args, "teacher", None) and getattr(args, "teacher_cache_dir", "") is None:
            # One cache for every cell: no grid flag changes the teacher's outputs, so it labels the data once.
            shared: dict[str, Any] = {"teacher_cache_dir": str(teacher_cache_dir(None, output_dir))}
            cell_args = dataclasses.replace(cell_args, **shared)
        cells.append(Cell(name, values, cell_args))
    return cells


def _values(args: GridArgs, f: dataclasses.Field) -> list[Any]:
    value = getattr(args, f.name)
    return list(value) if isinstance(value, list) else [value]


def _flag_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)  # every digit: the cell runs with exactly this value
    return str(value)


def command_line(args: TrainingArgs) -> list[str]:
    """The flags that make `bert COMMAND` run with `args`: every flag whose value is not its default (so a
    flag added to a command later is passed on too).

    Raises:
        InputError: a value no command line can give (None for a flag with a default, a flag the parser
            does not offer).
    """
    flags = []
    for f in dataclasses.fields(args):
        value = getattr(args, f.name)
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = dataclasses.MISSING
        if default is not dataclasses.MISSING and value == default:
            continue
        if value is None or f.metadata.get("cli") is False or f.metadata.get("positional"):
            raise InputError(f"--{f.name}={value!r}: a grid's runs take their flags on a command line; leave it out")
        flags.append(f"--{f.name}={_flag_text(value)}")
    return flags


# ---------------------------------------------------------------------------------------------- running
def _cpu_threads() -> int:
    threads = os.environ.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) > 0:
        return int(threads)
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def cell_environment(jobs: int) -> dict[str, str]:
    """The environment of a cell's process: this one's, with the threads shared out when cells run at once."""
    env = dict(os.environ)
    if jobs > 1:
        env["OMP_NUM_THREADS"] = str(max(1, _cpu_threads() // jobs))
    return env


def _error_of(terminal: Path, command: str, code: int) -> str:
    """Why a cell's process failed: its `bert COMMAND: error:` line, else the last line it printed (a
    traceback's exception), else its exit status."""
    if code < 0:
        name = signal.Signals(-code).name if -code in signal.valid_signals() else str(-code)
        return f"killed by {name}" + (" (out of memory?)" if -code == signal.SIGKILL else "")
    text = terminal.read_text(encoding="utf-8", errors="replace") if terminal.is_file() else ""
    lines = [line.strip() for line in re.split(r"[\r\n]+", text) if line.strip()]
    prefix = f"bert {command}: error: "
    errors = [line[len(prefix) :] for line in lines if line.startswith(prefix)]
    return errors[-1] if errors else lines[-1] if lines else f"exit status {code}"


def _run_cell(cell: Cell, command: str, env: Mapping[str, str]) -> tuple[int, float]:
    """Run one cell's process; (exit code, seconds)."""
    directory = Path(cell.args.output_dir)
    directory.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    with open(directory / TERMINAL_NAME, "w", encoding="utf-8") as out:
        done = subprocess.run(
            [sys.executable, "-m", "bert", command, *command_line(cell.args)],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=dict(env),
            check=False,
        )
    return done.returncode, time.monotonic() - start


def _row(cell: Cell, command: str, metric: str, code: int, seconds: float) -> dict[str, Any]:
    """A cell's row of the results table, from its exit code and its eval_results.json."""
    directory = Path(cell.args.output_dir)
    row: dict[str, Any] = {"cell": cell.name, **cell.values, metric: None, "eval_loss": None, "global_step": None}
    row.update(seconds=round(seconds, 1), status="ok", error=None, flags=[command, *command_line(cell.args)])
    if code != 0:
        row.update(status="failed", error=_error_of(directory / TERMINAL_NAME, command, code))
        return row
    results = load_json_file(directory / EVAL_RESULTS_NAME, "a grid cell's results", missing_ok=True) or {}
    value = results.get(metric)
    row.update(eval_loss=results.get("eval_loss"), global_step=results.get("global_step"))
    row[metric] = value
    if not isinstance(value, (int, float)) or not math.isfinite(value):
        row.update(status="failed", error=f"{directory / EVAL_RESULTS_NAME} has no finite {metric}")
    return row


def _earlier_rows(output_dir: Path) -> dict[str, dict[str, Any]]:
    saved = load_json_file(output_dir / f"{RESULTS_NAME}.json", "the grid's results", missing_ok=True) or {}
    return {row["cell"]: row for row in saved.get("cells", [])}


def _finished(cell: Cell, command: str, earlier: dict[str, Any] | None) -> bool:
    """Whether an earlier run of the grid finished this cell with the same flags (and its results are there)."""
    return (
        earlier is not None
        and earlier.get("status") == "ok"
        and earlier.get("flags") == [command, *command_line(cell.args)]
        and (Path(cell.args.output_dir) / EVAL_RESULTS_NAME).is_file()
    )


def best_row(rows: Sequence[dict[str, Any]], metric: str) -> dict[str, Any] | None:
    """The finished row with the best `metric` (the first on ties), None when none finished."""
    sign = 1.0 if greater_is_better(metric) else -1.0
    finished = [r for r in rows if r["status"] == "ok"]
    return max(finished, key=lambda r: sign * r[metric]) if finished else None


# ---------------------------------------------------------------------------------------------- results
def _columns(fields: Sequence[str], metric: str) -> list[str]:
    return list(dict.fromkeys(["cell", *fields, metric, "eval_loss", "global_step", "seconds", "status", "error"]))


def _cell_text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return _short(value)
    return re.sub(r"\s+", " ", str(value))


def _write_results(
    output_dir: Path, command: str, rows: Sequence[dict[str, Any]], fields: Sequence[str], metric: str
) -> None:
    best = best_row(rows, metric)
    record = {
        "command": command,
        "metric": metric,
        "greater_is_better": greater_is_better(metric),
        "best": best["cell"] if best else None,
        "cells": list(rows),
    }
    with atomic_write(output_dir / f"{RESULTS_NAME}.json") as f:
        json.dump(record, f, indent=2)
        f.write("\n")
    columns = _columns(fields, metric)
    with atomic_write(output_dir / f"{RESULTS_NAME}.tsv") as f:
        f.write("\t".join(columns) + "\n")
        for row in rows:
            f.write("\t".join(_cell_text(row.get(c)) for c in columns) + "\n")


def table_lines(rows: Sequence[dict[str, Any]], fields: Sequence[str], metric: str, width: int = 60) -> list[str]:
    """The results table as aligned text, the best row marked with `*`, errors cut to `width` characters."""
    best = best_row(rows, metric)
    columns = _columns(fields, metric)
    texts = []
    for row in rows:
        cells = []
        for c in columns:
            value = row.get(c)
            if c in (metric, "eval_loss") and isinstance(value, float):
                text = f"{value:.4f}"
            elif c == "seconds" and value is not None:
                text = f"{value:.0f}"
            else:
                text = _cell_text(value)
            cells.append(text if len(text) <= width else text[: width - 3] + "...")
        cells[0] = ("* " if row is best else "  ") + cells[0]
        texts.append(cells)
    header = ["  cell", *columns[1:]]
    widths = [max(len(r[i]) for r in [header, *texts]) for i in range(len(columns))]
    return ["  ".join(t.ljust(w) for t, w in zip(r, widths)).rstrip() for r in [header, *texts]]


def _export(best_dir: Path, output_dir: Path, result_names: Sequence[str]) -> None:
    """The best cell's model and result files into the grid's output directory (each replaced whole); a
    result an earlier best left that this one lacks is removed."""
    for name in result_names:
        source, target = best_dir / name, output_dir / name
        if source.is_dir():
            with atomic_directory(target) as tmp:
                shutil.copytree(source, tmp, dirs_exist_ok=True)
        elif source.is_file():
            with atomic_write(target, "wb", encoding=None) as f:
                f.write(source.read_bytes())
        elif target.is_dir():
            shutil.rmtree(target)
        elif target.exists():
            target.unlink()


def _check_output_dir(output_dir: Path) -> None:
    holds_run = (output_dir / "args.json").is_file() or any(output_dir.glob("checkpoint-*"))
    if holds_run and not (output_dir / f"{RESULTS_NAME}.json").is_file():
        raise InputError(
            f"--output_dir={output_dir} holds a single run (args.json): a grid writes its runs into {GRID_DIR}/ and "
            "the best one's model beside them; choose another --output_dir"
        )


def run_grid(
    args: GridArgs,
    cells: Sequence[Cell[GridArgs]],
    command: str,
    metric: str,
    inputs: Mapping[str, Any],
    result_names: Sequence[str],
    model_dir: str,
) -> dict[str, Any]:
    """Run the cells of a grid (see the module docstring) and keep the best.

    Args:
        args: the command's Args, with lists for the grid flags (recorded in args.json).
        cells: `expand(args, ...)`.
        command: the subcommand each cell runs.
        metric: the eval_results key that ranks the cells.
        inputs: {flag: path} the runs read, which the output directory must not be.
        result_names: the files and directories of a run's results, copied from the best cell.
        model_dir: which of them is the model.

    Returns:
        {"output_dir", "metric", "best" (the best cell's name), "cells" (the rows), "eval" (the best cell's
        eval_results), "global_step", "num_train_steps" (None)}.

    Raises:
        InputError: every cell failed (after the table is printed and written).
    """
    output_dir = Path(args.output_dir)
    fields = [f.name for f in grid_fields(args)]
    with claim(command, dirs={"--output_dir": output_dir}, inputs=inputs):
        _check_output_dir(output_dir)
        with log_to_file(output_dir / "log.txt"):
            earlier = _earlier_rows(output_dir)
            rows, pending = _first_rows(cells, command, earlier)
            order = [cell.name for cell in cells]

            def save() -> None:
                _write_results(output_dir, command, [rows[n] for n in order], fields, metric)

            save()  # first: the directory is a grid's from now on (`_check_output_dir`)
            write_run_info(output_dir, command, args)
            logger.info(
                "grid of %d runs (%d to run, %d at once) in %s",
                len(cells),
                len(pending),
                args.grid_jobs,
                output_dir / GRID_DIR,
            )
            _run_cells(pending, command, metric, args.grid_jobs, earlier, rows, save)
            table = [rows[n] for n in order]
            best = best_row(table, metric)
            if best is not None:
                best_dir = output_dir / GRID_DIR / best["cell"]
                _export(best_dir, output_dir, result_names)
                logger.info("best: %s (%s = %s), exported to %s", best["cell"], metric, best[metric], output_dir)
    _print_table(command, output_dir, table, fields, metric, model_dir)
    return _result(output_dir, metric, table, best)


def _result(output_dir: Path, metric: str, table: list[dict[str, Any]], best: dict[str, Any] | None) -> dict[str, Any]:
    """`run_grid`'s result, or its error when every cell failed."""
    if best is None:
        raise InputError(
            f"every run of the grid failed (the table above, {output_dir / RESULTS_NAME}.tsv); the first: "
            f"{table[0]['cell']}: {table[0]['error']}"
        )
    results = load_json_file(output_dir / EVAL_RESULTS_NAME, "the best run's results")
    return {
        "output_dir": str(output_dir),
        "metric": metric,
        "best": best["cell"],
        "cells": table,
        "eval": results,
        "global_step": best["global_step"],
        "num_train_steps": None,
    }


def _first_rows(
    cells: Sequence[Cell], command: str, earlier: dict[str, dict[str, Any]]
) -> tuple[dict[str, dict[str, Any]], list[Cell]]:
    """Each cell's row before the grid runs (an earlier run's when it finished the cell, else pending), and
    the cells to run."""
    rows: dict[str, dict[str, Any]] = {}
    pending = []
    for cell in cells:
        if _finished(cell, command, earlier.get(cell.name)):
            rows[cell.name] = earlier[cell.name]
            logger.info("%s: finished in an earlier run of the grid, not run again", cell.name)
        else:
            rows[cell.name] = {"cell": cell.name, **cell.values, "status": "pending"}
            pending.append(cell)
    return rows, pending


def _run_cells(
    pending: Sequence[Cell],
    command: str,
    metric: str,
    jobs: int,
    earlier: dict[str, dict[str, Any]],
    rows: dict[str, dict[str, Any]],
    save: Callable[[], None],
) -> None:
    """Run the pending cells, `jobs` at once, each one's row put in `rows` and saved as it ends."""
    env = cell_environment(jobs)
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = {pool.submit(_run_cell, cell, command, env): cell for cell in pending}
        done = concurrent.futures.as_completed(futures)
        for future in progress(done, total=len(futures), desc=f"{command} grid", unit="run"):
            cell = futures[future]
            code, seconds = future.result()
            before = earlier.get(cell.name) or {}
            if before.get("flags") == [command, *command_line(cell.args)]:
                seconds += before.get("seconds") or 0.0  # the earlier, interrupted or failed, tries
            row = rows[cell.name] = _row(cell, command, metric, code, seconds)
            if row["status"] == "ok":
                logger.info("%s: %s = %s (%.0f s)", cell.name, metric, row[metric], seconds)
            else:
                logger.warning("grid run %s failed: %s", cell.name, row["error"])
            save()


def _print_table(
    command: str, output_dir: Path, table: Sequence[dict[str, Any]], fields: Sequence[str], metric: str, model_dir: str
) -> None:
    """The grid's result block: the table, the failures, the best cell and the command that uses its model."""
    best = best_row(table, metric)
    failed = [r for r in table if r["status"] != "ok"]
    lines = [
        f"grid of {len(table)} runs in {output_dir / GRID_DIR}, ranked by {metric} "
        f"({'higher' if greater_is_better(metric) else 'lower'} is better):",
        *table_lines(table, fields, metric),
        f"{len(failed)} of {len(table)} runs failed (their error is in the table)" if failed else "",
        f"best: {best['cell']}; its model and results copied to {output_dir}" if best else "",
        f"written to {output_dir}: {RESULTS_NAME}.tsv, {RESULTS_NAME}.json"
        + (f", {model_dir}/, eval_results.txt" if best else ""),
        f"next: bert predict --model={output_dir / model_dir} --input_file=TEXTS.txt" if best else "",
    ]
    print_result(command, *lines)
