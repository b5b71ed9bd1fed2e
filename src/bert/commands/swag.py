"""`bert swag`: multiple choice on SWAG (Zellers et al. 2018; the BERT paper's section 4.4 recipe).

The original repository has no SWAG script; this one takes the common fine-tuning flags of
`bert classify` (`bert.finetune`). Data: `--data_dir` holds `train.csv`, `val.csv` and `test.csv` in the
layout of rowanz/swagaf `data/` (read by `bert.tasks.swag`; `test.csv` may lack the `label` column).
Each example becomes four sequences `[CLS] sent1 [SEP] sent2 ending_i [SEP]`; `BertForMultipleChoice`
scores each from its pooled output and a softmax over the four is trained with cross-entropy.

Outputs: `eval_results.txt` with `eval_accuracy`, `eval_loss` (mean cross-entropy per example), `loss`
and `global_step`; with `--do_predict`, `test_results.tsv` in `bert classify`'s layout: one line per test
example, in input order, no header, the four endings' probabilities tab separated (the predicted ending
is the column of the largest).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from bert.flags import FinetuneArgs, TeacherArgs
from bert.tasks.swag import SwagTask


@dataclass(kw_only=True)
class SwagArgs(FinetuneArgs, TeacherArgs):
    """Fine-tune and evaluate BERT on SWAG multiple choice.

    Resumes from the newest checkpoint in --output_dir when there is one.
    """

    train_file: str = field(
        default="train.csv", metadata={"run_defining": "train", "help": "Training file in --data_dir."}
    )
    dev_file: str = field(default="val.csv", metadata={"help": "Dev file in --data_dir (--do_eval)."})
    test_file: str = field(default="test.csv", metadata={"help": "Test file in --data_dir (--do_predict)."})


def run_swag(args: SwagArgs) -> dict[str, Any]:
    """Train, evaluate and/or predict (see the module docstring); returns the runner's summary."""
    # Imported here, not at the top, so that a flag error is reported before torch loads (bert.cli parses first).
    from bert.finetune import run_finetune

    return run_finetune(args, SwagTask(args))
