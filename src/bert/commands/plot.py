"""`bert plot`: the training curves of one or more runs on the same axes, as a PNG (`bert.plotting`).

Every training command draws its own `curves.png` at the end; this command redraws it, or compares runs:
pre-trained against random initialisation, two learning rates, two seeds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bert.errors import InputError
from bert.outputs import claim
from bert.plotting import CURVES_NAME, EVAL_RESULTS_NAME, METRICS_NAME, plot_runs


@dataclass
class PlotArgs:
    """Draw the training loss, evaluation metrics and learning rate of one or more runs on the same axes.

    Each RUN_DIR is the --output_dir of a training command (pretrain, classify, ner, squad, swag): its
    metrics.jsonl and eval_results.json are read. The series drawn are written beside the PNG as JSON.
    """

    run_dirs: list[str] = field(
        metadata={"help": "Output directories of training runs (each with metrics.jsonl).", "positional": True}
    )
    output_file: str | None = field(
        default=None,
        metadata={"help": f"The PNG to write. Default: RUN_DIR/{CURVES_NAME} (one run), ./{CURVES_NAME} (several)."},
    )
    names: str | None = field(
        default=None,
        metadata={"help": "The runs' names in the legend, comma separated, in order. Default: their directory names."},
    )


def run_plot(args: PlotArgs) -> dict[str, Any]:
    """Draw the PNG and print where it went; returns what `bert.plotting.plot_runs` drew."""
    if not args.run_dirs:
        raise InputError("give one or more run directories: bert plot RUN_DIR [RUN_DIR ...]")
    default = Path(args.run_dirs[0]) / CURVES_NAME if len(args.run_dirs) == 1 else Path(CURVES_NAME)
    output = Path(args.output_file) if args.output_file else default
    if output.suffix.lower() != ".png":
        raise InputError(f"--output_file={output}: the picture is a PNG; give a name ending in .png")
    names = [s.strip() for s in args.names.split(",")] if args.names else None
    # The files read, not the run directories: the default output is a file of the (only) run directory.
    read = [Path(d) / name for d in args.run_dirs for name in (METRICS_NAME, EVAL_RESULTS_NAME)]
    with claim("plot", files={"--output_file": [output, output.with_suffix(".json")]}, inputs={"RUN_DIR": read}):
        record = plot_runs(args.run_dirs, output, names)
    runs = ", ".join(r["label"] for r in record["runs"])
    print(f"wrote {output} ({runs}; the series drawn: {output.with_suffix('.json')})")
    return record
