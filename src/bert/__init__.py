"""BERT in PyTorch, faithful to google-research/bert.

The public API is re-exported here lazily, so `import bert.tokenization` does not import torch.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

# OpenMP threads that wait at a barrier spin (libgomp: about 3 ms) before they sleep. On a machine whose
# cores other processes also use, a spinning thread takes the core from the thread it waits for, and
# torch's two-thread matmuls ran 3-10x slower than one thread (bench/bench_contention.py). Sleeping at once
# (OMP_WAIT_POLICY=PASSIVE) keeps the fair share but wakes a sleeping thread at each of the hundreds of
# parallel regions of a forward pass, 5-12% of an idle machine's throughput; 1,000 spins (tens of
# microseconds, libgomp's own count when threads outnumber cores) bridge the gap between one region and
# the next and still give a busy core back at once (bench/RESULTS.md). libgomp reads these variables once,
# when torch loads it, so this runs before any module of the package imports torch; a user's own
# OMP_WAIT_POLICY or GOMP_SPINCOUNT is left as it is.
if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
    os.environ["GOMP_SPINCOUNT"] = "1000"

__version__ = "0.1.0"

_EXPORTS = {
    "BertConfig": "bert.config",
    "BertModel": "bert.modeling",
    "BertForPreTraining": "bert.modeling",
    "BertForSequenceClassification": "bert.modeling",
    "BertForQuestionAnswering": "bert.modeling",
    "BertForTokenClassification": "bert.modeling",
    "BertForMultipleChoice": "bert.modeling",
    "FullTokenizer": "bert.tokenization",
    "BasicTokenizer": "bert.tokenization",
    "WordpieceTokenizer": "bert.tokenization",
    "InputError": "bert.errors",
}

__all__ = [*_EXPORTS, "__version__"]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'bert' has no attribute {name!r}")
