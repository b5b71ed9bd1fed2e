"""Fine-tuning tasks: text -> examples -> features (no model code, no torch; the runners import these
modules, never the reverse).

`TASKS` maps a `--task_name` (lower case) to its processor class, as run_classifier's `processors` dict
(`cola`, `mnli`, `mrpc`, `xnli`), extended with the other GLUE tasks and `generic` (one's own files).
NER (`bert.tasks.ner`) and SWAG (`bert.tasks.swag`) are not sentence classification and have their own
modules.
"""

from __future__ import annotations

from typing import Any

from bert.errors import InputError
from bert.tasks.glue import (
    ColaProcessor,
    DataProcessor,
    GenericProcessor,
    MnliMismatchedProcessor,
    MnliProcessor,
    MrpcProcessor,
    QnliProcessor,
    QqpProcessor,
    RteProcessor,
    Sst2Processor,
    StsbProcessor,
    WnliProcessor,
    XnliProcessor,
)

TASKS: dict[str, type[DataProcessor]] = {
    "cola": ColaProcessor,
    "mnli": MnliProcessor,
    "mrpc": MrpcProcessor,
    "xnli": XnliProcessor,
    "mnli-mm": MnliMismatchedProcessor,
    "sst-2": Sst2Processor,
    "sts-b": StsbProcessor,
    "qqp": QqpProcessor,
    "qnli": QnliProcessor,
    "rte": RteProcessor,
    "wnli": WnliProcessor,
    "generic": GenericProcessor,
}

# Other spellings in use (the GLUE folder names lower-cased, HF's names).
ALIASES = {
    "sst2": "sst-2",
    "stsb": "sts-b",
    "mnli-m": "mnli",
    "mnli_mismatched": "mnli-mm",
    "mnli-mismatched": "mnli-mm",
}


def get_processor(task_name: str, **kwargs: Any) -> DataProcessor:
    """The processor of `task_name` (case-insensitive, aliases allowed), built with `kwargs`
    (e.g. `language="de"` for XNLI, the column arguments for `generic`)."""
    name = task_name.lower()
    name = ALIASES.get(name, name)
    if name not in TASKS:
        raise InputError(f"Task not found: {task_name!r}; --task_name must be one of {', '.join(TASKS)}")
    return TASKS[name](**kwargs)


__all__ = ["ALIASES", "TASKS", "get_processor"]
