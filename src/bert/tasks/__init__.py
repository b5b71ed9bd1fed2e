"""Fine-tuning tasks: text -> examples -> features -> NumPy batches, and outputs -> metrics and files.

No model code and no torch: the fine-tuning runner (`bert.finetune`) runs the model. `TASKS` maps a
`--task_name` (lower case) to its processor class, as run_classifier's `processors` dict (`cola`, `mnli`,
`mrpc`, `xnli`), extended with the other GLUE tasks and `generic` (one's own files); it lives in
`bert.tasks.classification` with `bert classify`'s task, the GLUE processors and feature conversion in
`bert.tasks.glue` (the port of run_classifier.py), one's own files in `bert.tasks.generic`, long documents in
`bert.tasks.windows`. NER (`bert.tasks.ner`), SQuAD (`bert.tasks.squad`) and SWAG
(`bert.tasks.swag`) have their own modules; `bert.tasks.common` holds what they share.
"""

from __future__ import annotations

from bert.tasks.classification import ALIASES, TASKS, get_processor

__all__ = ["ALIASES", "TASKS", "get_processor"]
