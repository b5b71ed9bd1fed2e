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

Long documents (`--long_document=windows`, not in the original): text_a is read whole in windows of
`--max_seq_length`, `--doc_stride` tokens apart (text_b, for pairs, goes into every window, cut at its end
only when it would leave text_a less than half a window); each window is a training feature with its
example's label, and at evaluation and prediction the windows' logits of an example are pooled
(`--window_pooling=mean`, or `max`) into one prediction, so the result files keep one line per example.
Steps are counted in examples, as run_squad.py counts them, so an epoch of steps sees as many windows as
there are examples (the log gives the windows per example). `eval_loss` and `loss` average over windows.

Multi-label (`--task_name=generic --multi_label`): the label cell holds several labels separated by
`--label_separator` (default ","); the label list is the sorted union of the training file's labels (or
`--labels`); the head scores each label with a sigmoid and binary cross-entropy (transformers'
`multi_label_classification`: `eval_loss` is the mean over examples and labels). A label is predicted when
its probability reaches its threshold: `--threshold` (default 0.5, or the thresholds saved with the model
evaluated), or with `--tune_thresholds` the one that maximises the label's F1 on the dev set. Results:
`eval_micro_f1` (the default metric), `eval_micro_precision`, `eval_micro_recall`, the `eval_macro_*`
means over labels, `eval_subset_accuracy` (exact label sets), with `--tune_thresholds`
`eval_tuned_micro_f1` and `eval_tuned_macro_f1` (optimistic: tuned and scored on the dev set);
`eval_label_scores.tsv` (per label: threshold, precision, recall, F1, support); `test_results.tsv`: one
line per example of per-label probabilities in label-list order; `test_predicted_labels.tsv`: one line per
example, its predicted labels joined by the separator. The exported config.json holds `problem_type`,
`id2label`, `label2id` and `label_thresholds`, plus `long_document`, `doc_stride` and `window_pooling` for
every classifier, so `bert predict` does the same.

Distillation (`--teacher=OUTPUT/model`, a larger classifier `bert classify` fine-tuned on the same labels,
`bert.distillation`): the teacher reads every training example and every example of `--transfer_file`
(unlabelled text in the test set's layout, e.g. GLUE's test.tsv) through its own tokenizer, length and
window settings, as `bert predict` does, so its vocabulary and casing may differ from the student's; its
logits are computed once and cached (`--teacher_cache_dir`, default OUTPUT_DIR/teacher_cache), so every
epoch and a resumed run reuse them. A training example's loss is `--distill_alpha` x KD + (1 - alpha) x the
label loss, a transfer example's KD alone; KD is KL(softmax(teacher/T) || softmax(student/T)) x T^2
(`--temperature`), the squared difference for regression, the sigmoid cross-entropy against the teacher's
probabilities for multi-label. Steps count the transfer examples. `--init_from_teacher_layers=0,2,4` also
starts the student from those of the teacher's layers (DistilBERT's start) instead of `--init_checkpoint`.

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

from bert.flags import DistillArgs, FinetuneArgs
from bert.tasks.classification import ClassificationTask


@dataclass(kw_only=True)
class ClassifyArgs(FinetuneArgs, DistillArgs):
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
    long_document: str = field(
        default="truncate",
        metadata={
            "help": "Texts longer than --max_seq_length: truncate (the original: the pair cut to max_seq_length) or "
            "windows (text_a read whole in windows of max_seq_length, --doc_stride apart, text_b in every window; "
            "each window trains with its example's label; predictions pool the windows, see --window_pooling)."
        },
    )
    doc_stride: int = field(
        default=128,
        metadata={
            "min": 1,
            "help": "windows: tokens of text_a between the starts of consecutive windows (run_squad's default).",
        },
    )
    window_pooling: str = field(
        default="mean",
        metadata={
            "help": "windows: how an example's window logits become one prediction: mean (the usual choice: every "
            "window votes, scores stay on the one-window scale) or max (each label's largest logit: suits "
            "'any window says yes' labels such as a topic mentioned once in a long text)."
        },
    )
    multi_label: bool = field(
        default=False,
        metadata={
            "help": "generic: each example has a set of labels (sigmoid per label, binary cross-entropy); the label "
            "cell lists them separated by --label_separator."
        },
    )
    label_separator: str | None = field(
        default=None,
        metadata={
            "help": "multi_label: what separates the labels of a cell (default ','; a .csv cell holding commas is "
            "quoted, as any CSV writer does; JSON lines may give a list)."
        },
    )
    allow_empty_labels: bool = field(
        default=False,
        metadata={"help": "multi_label: an empty label cell is an example with no label (by default an error)."},
    )
    threshold: float | None = field(
        default=None,
        metadata={
            "help": "multi_label: predict a label when its probability reaches this, for every label (default: the "
            "thresholds saved with the model evaluated, else 0.5)."
        },
    )
    tune_thresholds: bool = field(
        default=False,
        metadata={
            "help": "multi_label: after evaluation, set each label's threshold to the one maximising its F1 on the dev "
            "set (halfway between two dev scores); used for the predictions and saved with the model."
        },
    )


def run_classify(args: ClassifyArgs) -> dict[str, Any]:
    """Train, evaluate and/or predict (see the module docstring); returns the runner's summary."""
    # Imported here, not at the top, so that a flag error is reported before torch loads (bert.cli parses first).
    from bert.finetune import run_finetune

    return run_finetune(args, ClassificationTask(args))
