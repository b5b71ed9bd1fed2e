"""`bert squad`: extractive question answering on SQuAD v1.1 / v2.0, the original's run_squad.py.

The same flags and defaults (`--train_file`, `--predict_file`, `--max_seq_length=384`, `--doc_stride=128`,
`--max_query_length=64`, `--do_train/--do_predict`, batch sizes 32/8, learning rate 5e-5, 3 epochs,
warmup 0.1, `--n_best_size=20`, `--max_answer_length=30`, `--version_2_with_negative`,
`--null_score_diff_threshold=0.0`, ...), so a command from the original README ports by replacing
`python run_squad.py` with `bert squad`. `validate_flags_or_throw` runs before any work; the model
files (`--max_seq_length` against `max_position_embeddings`, the vocabulary against `vocab_size`,
`--do_lower_case` against the checkpoint) and the SQuAD files are checked before `--output_dir` is
written to.

Training, as the original: the examples of `--train_file` (`bert.tasks.squad.read_squad_examples`) are
shuffled with `random.Random(12345)`, then cut into doc-stride windows; a window that does not hold the
whole answer is labelled (0, 0), the `[CLS]` position, even for v1.1 (run_squad.py,
`convert_examples_to_features`, `out_of_span`).
`num_train_steps = int(len(train_examples) / train_batch_size * num_train_epochs)` counts questions, not
windows, as the original does. The model is `BertForQuestionAnswering`; the loss is the mean of the
start and end cross-entropies. The optimizer, schedule, checkpoints, resuming, `metrics.jsonl` and the
dynamic-padding batches are the shared runner's (`bert.finetune`).

Prediction: `predictions.json`, `nbest_predictions.json` and, for v2.0, `null_odds.json`
(`bert.tasks.squad.write_predictions`: the original's n-best post-processing, its v2.0 crash fixed). When
every question of `--predict_file` carries gold answers (a dev file), the official evaluation runs
(`bert.tasks.squad_evaluate`: evaluate-v1.1.py's `exact_match`, `f1`; evaluate-v2.0.py's `exact`, `f1`,
`HasAns_*`, `NoAns_*` and, with `null_odds.json` as the no-answer probabilities, as the original README
runs it, `best_exact`, `best_f1` and their thresholds) and its result goes to `eval_results.json` and
`eval_results.txt` (sorted `key = value` lines).

Distillation (`--teacher=OUTPUT/model` of a larger `bert squad` run, `bert.distillation.SpanTeacher`): the
teacher runs once on the student's own windows (so it must share the student's vocabulary and casing; the
windows are cut by the student's `--max_seq_length`, `--doc_stride` and `--max_query_length`) and its start and
end logits are cached; the loss is the mean of the start and end KL at `--temperature` (times T^2, as
DistilBERT's SQuAD recipe), weighted by `--distill_alpha` against the labels' loss. SQuAD 2.0's null answer is
position 0 of each window, as in the labels. `--transfer_file` adds questions in SQuAD's JSON (answers absent or
ignored) learnt from the teacher alone; `--init_from_teacher_layers=0,2,4` starts the student from the teacher's
layers.

Two divergences, both because a batch is padded to its own longest window instead of to
`--max_seq_length`, and both making the results independent of the padding:
- the loss's softmax runs over the real positions of a window only (the original's also runs over the
  padding up to `--max_seq_length`, whose logits no prediction reads);
- the n-best candidates of a window are its best real positions (the original ranks the padding
  positions too and then discards them, so they can take candidate places when `--n_best_size` is
  large or the model is untrained). The null score is position 0, `[CLS]`, as in the original.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from bert.errors import InputError
from bert.flags import DistillArgs, FinetuneArgs, ModelArgs, same_as
from bert.tasks.squad import NO_EVAL, SquadTask


@dataclass(kw_only=True)
class SquadArgs(FinetuneArgs, DistillArgs):
    """Fine-tune BERT on SQuAD v1.1 / v2.0 and predict answers (run_squad.py).

    Predicting on a file with gold answers also runs the official evaluation. Resumes from the newest
    checkpoint in --output_dir when there is one.
    """

    # run_squad.py has no --data_dir: the files are --train_file and --predict_file.
    data_dir: str | None = field(  # type: ignore[assignment]  # None: the base class requires what squad lacks
        default=None, metadata={"help": "Unused by bert squad.", "cli": False}
    )
    train_file: str | None = field(
        default=None,
        metadata={
            "run_defining": "data",
            "help": "SQuAD json for training. E.g., train-v1.1.json (.json.gz accepted).",
        },
    )
    predict_file: str | None = field(
        default=None,
        metadata={"help": "SQuAD json for predictions. E.g., dev-v1.1.json or test-v1.1.json (.json.gz accepted)."},
    )
    max_seq_length: int = same_as(ModelArgs, "max_seq_length", default=384)  # run_squad.py's default
    doc_stride: int = field(
        default=128,
        metadata={
            "run_defining": "train",
            "min": 1,
            "help": "When splitting up a long document into chunks, how much stride to take between chunks.",
        },
    )
    max_query_length: int = field(
        default=64,
        metadata={
            "run_defining": "train",
            "min": 0,
            "help": "The maximum number of tokens for the question. Questions longer than this will be truncated "
            "to this length.",
        },
    )
    do_predict: bool = field(
        default=False,
        metadata={"help": "Whether to predict answers for --predict_file (and evaluate them when it has answers)."},
    )
    n_best_size: int = field(
        default=20,
        metadata={
            "min": 1,
            "help": "The total number of n-best predictions to generate in the nbest_predictions.json output file.",
        },
    )
    max_answer_length: int = field(
        default=30,
        metadata={
            "min": 1,
            "help": "The maximum length of an answer that can be generated. This is needed because the start and "
            "end predictions are not conditioned on one another.",
        },
    )
    verbose_logging: bool = field(
        default=False,
        metadata={
            "help": "If true, all of the warnings related to data processing will be printed. A number of warnings "
            "are expected for a normal SQuAD evaluation."
        },
    )
    version_2_with_negative: bool = field(
        default=False,
        metadata={
            "run_defining": "model",
            "help": "If true, the SQuAD examples contain some that do not have an answer.",
        },
    )
    null_score_diff_threshold: float = field(
        default=0.0, metadata={"help": "If null_score - best_non_null is greater than the threshold predict null."}
    )
    # The runner's evaluation flags: run_squad.py has no eval mode.
    do_eval: bool = field(default=False, metadata={"help": NO_EVAL, "cli": False})
    eval_batch_size: int = field(default=8, metadata={"help": NO_EVAL, "cli": False})
    eval_every_steps: int = field(default=0, metadata={"help": NO_EVAL, "cli": False})
    early_stopping_patience: int = field(default=0, metadata={"help": NO_EVAL, "cli": False})
    metric_for_best_model: str | None = field(default=None, metadata={"help": NO_EVAL, "cli": False})


def validate_flags_or_throw(args: SquadArgs) -> None:
    """The original's flag checks, before any work (the model files are checked by the runner next).

    Raises:
        InputError: naming the flag to change.
    """
    if not (args.do_train or args.do_predict):
        raise InputError(
            "At least one of `do_train` or `do_predict` must be True: pass --do_train=true and/or --do_predict=true"
        )
    if args.do_eval or args.eval_every_steps or args.early_stopping_patience or args.metric_for_best_model:
        raise InputError(
            "bert squad has no eval mode (do_eval, eval_every_steps, early_stopping_patience, metric_for_best_model): "
            "--do_predict on a file with gold answers evaluates"
        )
    if args.do_train and not args.train_file:
        raise InputError(
            "If `do_train` is True, then `train_file` must be specified: pass --train_file=train-v1.1.json"
        )
    if args.do_predict and not args.predict_file:
        raise InputError(
            "If `do_predict` is True, then `predict_file` must be specified: pass --predict_file=dev-v1.1.json"
        )
    if args.max_seq_length <= args.max_query_length + 3:
        raise InputError(
            f"The max_seq_length ({args.max_seq_length}) must be greater than max_query_length "
            f"({args.max_query_length}) + 3: raise --max_seq_length or lower --max_query_length"
        )


def run_squad(args: SquadArgs) -> dict[str, Any]:
    """Train and/or predict (see the module docstring); returns the runner's summary, with the official
    evaluation under "eval" when the predict file has answers."""
    # Imported here, not at the top, so that a flag error is reported before torch loads (bert.cli parses first).
    from bert.finetune import run_finetune

    validate_flags_or_throw(args)
    task = SquadTask(args)
    result = run_finetune(args, task)
    if task.eval_results is not None:
        result["eval"] = task.eval_results
    return result
