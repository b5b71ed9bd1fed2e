"""The original's result files: `eval_results.txt` (sorted `key = value` lines) with an
`eval_results.json` beside it, and `test_results.tsv` (class probabilities, one line per example).

One writer for every command: run_classifier.py and run_pretraining.py print the Estimator's float32
metrics (`str(np.float32(value))`, `global_step` an integer); run_squad.py's evaluation prints the
official script's numbers as they are (`as_float32=False`).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from bert.utils import atomic_write

logger = logging.getLogger(__name__)


def _text(key: str, value: Any, as_float32: bool) -> str:
    if key == "global_step":
        return str(int(value))
    if as_float32 and isinstance(value, (int, float, np.number)) and not isinstance(value, bool):
        return str(np.float32(value))
    return str(value)


def _json_value(key: str, value: Any) -> Any:
    if key == "global_step":
        return int(value)
    if isinstance(value, (float, np.floating)):
        return float(value)
    if isinstance(value, np.integer):
        return int(value)
    return value


def write_results(
    output_dir: str | os.PathLike, results: Mapping[str, Any], name: str = "eval_results", as_float32: bool = True
) -> Path:
    """Write `<name>.txt` as the original (one `key = value` line per key, keys sorted) and `<name>.json`
    (full precision, keys sorted); log them under `***** Eval results *****`. Returns the .txt path."""
    path = Path(output_dir) / f"{name}.txt"
    logger.info("***** Eval results *****")
    lines = []
    for key in sorted(results):
        text = _text(key, results[key], as_float32)
        logger.info("  %s = %s", key, text)
        lines.append(f"{key} = {text}\n")
    with atomic_write(path) as f:
        f.writelines(lines)
    with atomic_write(Path(output_dir) / f"{name}.json") as f:
        json.dump({k: _json_value(k, v) for k, v in results.items()}, f, indent=2, sort_keys=True)
        f.write("\n")
    return path


def write_test_results(path: str | os.PathLike, probabilities: Any, num_examples: int | None = None) -> None:
    """Write `test_results.tsv` as the original: no header, no ids, one line per example holding its class
    probabilities in label-list order, tab separated, each printed as `str()` of a numpy float32.

    Args:
        path: the output file.
        probabilities: [N, num_labels] (or [N] for one value per example, e.g. a regression score).
        num_examples: when given, the number of lines written must equal it (the original's assertion).
    """
    probs = np.asarray(probabilities, dtype=np.float32)
    if probs.ndim == 1:
        probs = probs[:, None]
    if probs.ndim != 2:
        raise ValueError(f"probabilities must be [N, num_labels], got shape {probs.shape}")
    if num_examples is not None and probs.shape[0] != num_examples:
        raise ValueError(f"{probs.shape[0]} rows of probabilities for {num_examples} test examples")
    logger.info("***** Predict results *****")
    with atomic_write(path) as writer:
        for row in probs:
            writer.write("\t".join(str(p) for p in row) + "\n")
