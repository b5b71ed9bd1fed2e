"""Training curves as a picture: `curves.png` beside `metrics.jsonl`, for one run or several on the same axes.

Three panels: the training loss (with the dev set's `eval_loss` as points), the other evaluation metrics
over steps, and the learning rate. The series come from the run's files:

- `metrics.jsonl`: a line with `learning_rate` is a training log line (loss, learning rate, ...); a line
  with `eval_*` keys is an evaluation during training (`--eval_every_steps`);
- `eval_results.json`: the final evaluation, drawn at its `global_step` (keys without the `eval_`
  prefix, as run_pretraining.py writes them, get it; the Estimator's `loss` is skipped beside `eval_loss`).

`plot_runs` also writes what it drew, series for series, to a JSON file beside the PNG (`curves.json`),
so the picture can be checked against the files and redrawn elsewhere. Plotting needs matplotlib, an
optional extra (`pip install 'bert[plot]'`); without it the training commands print one line saying so
(`try_plot`) and nothing else changes.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bert.errors import InputError
from bert.utils import atomic_write

logger = logging.getLogger(__name__)

METRICS_NAME = "metrics.jsonl"
EVAL_RESULTS_NAME = "eval_results.json"
CURVES_NAME = "curves.png"
INSTALL_HINT = "pip install 'bert[plot]'"
# Evaluation keys that are counts or thresholds, not scores over steps (SQuAD 2.0's official evaluation).
_NOT_A_CURVE = ("total", "thresh", "global_step")

Series = dict[str, list[float]]  # {"steps": [...], "values": [...]}


def _series(points: dict[int, float]) -> Series:
    steps = sorted(points)
    return {"steps": [float(s) for s in steps], "values": [points[s] for s in steps]}


def read_curves(run_dir: str | os.PathLike) -> dict[str, dict[str, Series]]:
    """The series of one run: {"train": {"loss": ..., "learning_rate": ..., ...}, "eval": {"eval_accuracy": ...}}.

    Raises:
        InputError: the directory has no metrics.jsonl, or a line of it is not JSON.
    """
    run = Path(run_dir)
    path = run / METRICS_NAME
    if not path.is_file():
        raise InputError(f"{run}: no {METRICS_NAME}; give the --output_dir of a training run")
    train: dict[str, dict[int, float]] = {}
    evals: dict[str, dict[int, float]] = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            step = int(record["step"])
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            raise InputError(f"{path}:{number}: not a metrics line (JSON with a step); fix or delete it") from None
        target = train if "learning_rate" in record else evals
        for key, value in record.items():
            if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
                target.setdefault(key, {})[step] = float(value)
    final = run / EVAL_RESULTS_NAME
    if final.is_file():
        try:
            results = json.loads(final.read_text(encoding="utf-8"))
        except json.JSONDecodeError:
            results = None
            logger.warning("%s is not valid JSON: the final evaluation is not drawn", final)
        if isinstance(results, dict):
            last_step = max((max(v) for v in train.values() if v), default=0)
            step = int(results.get("global_step", last_step))
            has_eval_loss = "eval_loss" in results
            for key, value in results.items():
                if not isinstance(value, (int, float)) or isinstance(value, bool) or key == "global_step":
                    continue
                if key == "loss" and has_eval_loss:
                    continue
                name = key if key.startswith("eval_") else f"eval_{key}"
                evals.setdefault(name, {}).setdefault(step, float(value))
    return {
        "train": {k: _series(v) for k, v in sorted(train.items())},
        "eval": {k: _series(v) for k, v in sorted(evals.items())},
    }


def _labels(run_dirs: Sequence[Path]) -> list[str]:
    """The runs' names in the legend: their directory names, or paths where names repeat."""
    names = [p.resolve().name or str(p) for p in run_dirs]
    if len(set(names)) == len(names):
        return names
    return [str(p) for p in run_dirs]


def plot_runs(
    run_dirs: Sequence[str | os.PathLike], output_file: str | os.PathLike, labels: Sequence[str] | None = None
) -> dict[str, Any]:
    """Draw the runs' curves on shared axes into `output_file` (PNG) and write what was drawn to the JSON
    file beside it (same name, `.json`). Returns that record: {"png", "runs": [{"label", "dir", "train",
    "eval"}]} with the series as drawn.

    Raises:
        InputError: matplotlib is missing, a run has no metrics, or the labels do not match the runs.
    """
    try:
        # Optional extra, imported only when drawing; the Agg canvas renders without a display.
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise InputError(f"plotting needs matplotlib: {INSTALL_HINT}") from None
    dirs = [Path(d) for d in run_dirs]
    if not dirs:
        raise InputError("no run to plot: give one or more --output_dir of training runs")
    names = list(labels) if labels else _labels(dirs)
    if len(names) != len(dirs):
        raise InputError(f"{len(names)} names for {len(dirs)} runs; give one name per run (--names)")
    runs: list[dict[str, Any]] = [{"label": n, "dir": str(d), **read_curves(d)} for n, d in zip(names, dirs)]

    fig = Figure(figsize=(15, 4.5), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    ax_loss, ax_eval, ax_lr = fig.subplots(1, 3, sharex=True)
    drawn: list[dict[str, Any]] = []
    any_eval = False
    for i, run in enumerate(runs):
        tag = f"{run['label']}: " if len(runs) > 1 else ""
        kept, evaluated = _draw_run(run, f"C{i % 10}", tag, ax_loss, ax_eval, ax_lr)
        drawn.append(kept)
        any_eval |= evaluated
    ax_loss.set_title("loss")
    ax_eval.set_title("evaluation")
    ax_lr.set_title("learning rate")
    if not any_eval:
        ax_eval.text(0.5, 0.5, "no evaluation", ha="center", va="center", transform=ax_eval.transAxes)
    for ax in (ax_loss, ax_eval, ax_lr):
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="small")
    if len(runs) == 1:
        fig.suptitle(str(dirs[0]))
    png = Path(output_file)
    with atomic_write(png, "wb") as f:
        fig.savefig(f, format="png")
    record = {"png": str(png), "runs": drawn}
    with atomic_write(png.with_suffix(".json")) as f:
        json.dump(record, f, indent=1)
        f.write("\n")
    return record


def _draw_run(
    run: dict[str, Any], color: str, tag: str, ax_loss: Any, ax_eval: Any, ax_lr: Any
) -> tuple[dict[str, Any], bool]:
    """One run's curves on the three axes, in `color`, its legend entries prefixed with `tag`; (the series
    drawn, whether an evaluation metric other than the loss was)."""
    kept: dict[str, Any] = {"label": run["label"], "dir": run["dir"], "train": {}, "eval": {}}
    for key, ax in (("loss", ax_loss), ("learning_rate", ax_lr)):
        s = run["train"].get(key)
        if s:
            ax.plot(s["steps"], s["values"], color=color, label=f"{tag}training {key}".replace("_", " "))
            kept["train"][key] = s
    markers = "osD^v<>ph*"
    others = [k for k in run["eval"] if k != "eval_loss" and not any(w in k for w in _NOT_A_CURVE + ("loss",))]
    any_eval = False
    for j, key in enumerate(["eval_loss", *others]):
        s = run["eval"].get(key)
        if not s or not all(math.isfinite(v) for v in s["values"]):
            continue
        ax = ax_loss if key == "eval_loss" else ax_eval
        style = "--" if key == "eval_loss" else "-"
        ax.plot(s["steps"], s["values"], style, color=color, marker=markers[j % len(markers)], label=f"{tag}{key}")
        kept["eval"][key] = s
        any_eval |= key != "eval_loss"
    return kept, any_eval


_missing_matplotlib_reported = False


def try_plot(
    run_dirs: Sequence[str | os.PathLike], output_file: str | os.PathLike, labels: Sequence[str] | None = None
) -> Path | None:
    """`plot_runs` at the end of a command, which it must never fail: without matplotlib one line (once
    per process) says how to get plots; any other failure is a warning. Returns the PNG, or None."""
    global _missing_matplotlib_reported
    png = Path(output_file)
    try:
        plot_runs(run_dirs, png, labels)
    except InputError as e:
        if "matplotlib" in str(e):
            if not _missing_matplotlib_reported:
                logger.warning("no %s: %s to get training curves as pictures", png.name, INSTALL_HINT)
                _missing_matplotlib_reported = True
        else:
            logger.warning("no %s: %s", png, e)
        return None
    except Exception as e:  # a picture must never cost a finished run
        logger.warning("could not draw %s (%s: %s)", png, type(e).__name__, e)
        return None
    logger.info("training curves: %s", png)
    return png
