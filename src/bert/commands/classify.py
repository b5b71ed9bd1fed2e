"""`bert classify`: sentence and sentence-pair classification, the original's run_classifier.py.

The same flags and defaults (`--task_name`, `--data_dir`, `--vocab_file`, `--bert_config_file`,
`--init_checkpoint`, `--do_train/--do_eval/--do_predict`, batch sizes 32/8/8, learning rate 5e-5,
3 epochs, warmup 0.1, ...), so a command from the original README ports by replacing
`python run_classifier.py` with `bert classify`. The model is `BertForSequenceClassification`: dropout
0.1 on the pooled output (hard-coded in the original; a config's `classifier_dropout` overrides it),
a linear layer, softmax cross-entropy, or the squared error for regression tasks (STS-B, or
`--task_name=generic --is_regression`). The runner (`bert.finetune`) does the rest; see it for the
batching, evaluation during training, early stopping and resuming.

Tasks (`--task_name`, case-insensitive): the original's `cola`, `mnli`, `mrpc`, `xnli` (language from
`--xnli_language`, "zh" by default as the original hard-codes), the other GLUE tasks `sst-2`, `sts-b`,
`qqp`, `qnli`, `rte`, `wnli`, `mnli-mm`, and `generic` for one's own TSV, CSV or JSON-lines files, whose
columns are named by `--text_a_column`, `--text_b_column` and `--label_column` (0-based numbers, or
header names with `--has_header`) and whose labels are `--labels` or, without it, the sorted labels of
the training file (saved with the model, so evaluation alone needs no training file).

Outputs: `eval_results.txt` with the original's keys `eval_accuracy`, `eval_loss` (the mean loss per
example; the mean squared error for regression, which has no `eval_accuracy`), `global_step`, `loss`
(the mean over batches of `--eval_batch_size` of the batch loss, as the Estimator reports it), plus the
task's GLUE metrics: `eval_f1` (MRPC, QQP), `eval_mcc` (CoLA), `eval_pearson`, `eval_spearman` and
their mean `eval_corr` (regression). `test_results.tsv`: one line per test example, in input order, no
header: the class probabilities in label-list order, tab separated, as the original prints them; for
regression the predicted score.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from bert.finetune import FinetuneArgs, run_finetune
from bert.tasks.glue import ClassificationTask


@dataclass(kw_only=True)
class ClassifyArgs(FinetuneArgs):
    """Fine-tune and evaluate BERT on sentence (pair) classification (run_classifier.py).

    Resumes from the newest checkpoint in --output_dir when there is one.
    """

    task_name: str = field(
        metadata={
            "run_defining": "model",
            "help": "The name of the task to train: cola, mnli, mrpc, xnli, sst-2, sts-b, qqp, qnli, rte, wnli, "
            "mnli-mm, or generic (one's own files, see --text_a_column).",
        }
    )
    xnli_language: str = field(
        default="zh", metadata={"run_defining": "model", "help": "The XNLI language (the original hard-codes zh)."}
    )
    text_a_column: str | None = field(
        default=None,
        metadata={
            "run_defining": "model",
            "help": "generic: column of the first text, a 0-based number or a header name (default 0).",
        },
    )
    text_b_column: str | None = field(
        default=None,
        metadata={
            "run_defining": "model",
            "help": "generic: column of the second text, for sentence pairs (default none).",
        },
    )
    label_column: str | None = field(
        default=None,
        metadata={
            "run_defining": "model",
            "help": "generic: column of the label, a number (-1: the last) or a name (default -1).",
        },
    )
    labels: str | None = field(
        default=None,
        metadata={
            "run_defining": "model",
            "help": "generic: the labels in id order, comma separated (default: sorted labels of train file).",
        },
    )
    has_header: bool = field(
        default=False,
        metadata={"run_defining": "train", "help": "generic: the .tsv/.csv files start with a header line (skipped)."},
    )
    is_regression: bool = field(
        default=False,
        metadata={"run_defining": "model", "help": "generic: the labels are numbers to regress on (as STS-B)."},
    )
    train_file: str | None = field(
        default=None,
        metadata={
            "run_defining": "train",
            "help": "generic: training file in --data_dir: .tsv, .csv or .jsonl (train.tsv).",
        },
    )
    dev_file: str | None = field(default=None, metadata={"help": "generic: dev file in --data_dir (dev.tsv)."})
    test_file: str | None = field(default=None, metadata={"help": "generic: test file in --data_dir (test.tsv)."})


def run_classify(args: ClassifyArgs) -> dict[str, Any]:
    """Train, evaluate and/or predict (see the module docstring); returns the runner's summary."""
    return run_finetune(args, ClassificationTask(args))
