"""BERT in PyTorch, faithful to google-research/bert.

The public API is re-exported here lazily, so `import bert.tokenization` does not import torch.
"""

from __future__ import annotations

import importlib
from typing import Any

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
