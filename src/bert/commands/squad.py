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
whole answer is labelled (0, 0), the `[CLS]` position, even for v1.1 (spec §11 row 22).
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

Two divergences, both because a batch is padded to its own longest window instead of to
`--max_seq_length`, and both making the results independent of the padding:
- the loss's softmax runs over the real positions of a window only (the original's also runs over the
  padding up to `--max_seq_length`, whose logits no prediction reads);
- the n-best candidates of a window are its best real positions (the original ranks the padding
  positions too and then discards them, so they can take candidate places when `--n_best_size` is
  large or the model is untrained). The null score is position 0, `[CLS]`, as in the original.
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bert.errors import InputError
from bert.finetune import FinetuneArgs, FinetuneTask, run_finetune
from bert.formats.results import write_results
from bert.modeling import BertForQuestionAnswering
from bert.tasks.common import pad_2d
from bert.tasks.squad import RawResult, convert_examples_to_features, squad_examples_from_json, write_predictions
from bert.tasks.squad_evaluate import evaluate_v1, evaluate_v2, iter_questions
from bert.utils import load_json_file

logger = logging.getLogger(__name__)

# The seed run_squad.py shuffles the training examples with, before making features.
TRAIN_SHUFFLE_SEED = 12345
PREDICTIONS_NAME = "predictions.json"
NBEST_NAME = "nbest_predictions.json"
NULL_ODDS_NAME = "null_odds.json"
_NO_EVAL = "run_squad.py has no eval mode: --do_predict on a file with answers evaluates. Not a flag of bert squad."


@dataclass(kw_only=True)
class SquadArgs(FinetuneArgs):
    """Fine-tune BERT on SQuAD v1.1 / v2.0 and predict answers (run_squad.py).

    Predicting on a file with gold answers also runs the official evaluation. Resumes from the newest
    checkpoint in --output_dir when there is one.
    """

    # run_squad.py has no --data_dir: the files are --train_file and --predict_file.
    data_dir: str | None = field(default=None, metadata={"help": "Unused by bert squad.", "cli": False})
    train_file: str | None = field(
        default=None, metadata={"help": "SQuAD json for training. E.g., train-v1.1.json (.json.gz accepted)."}
    )
    predict_file: str | None = field(
        default=None,
        metadata={"help": "SQuAD json for predictions. E.g., dev-v1.1.json or test-v1.1.json (.json.gz accepted)."},
    )
    max_seq_length: int = field(
        default=384,
        metadata={
            "help": "The maximum total input sequence length after WordPiece tokenization. Sequences longer than "
            "this will be truncated, and sequences shorter than this will be padded."
        },
    )
    doc_stride: int = field(
        default=128,
        metadata={"help": "When splitting up a long document into chunks, how much stride to take between chunks."},
    )
    max_query_length: int = field(
        default=64,
        metadata={
            "help": "The maximum number of tokens for the question. Questions longer than this will be truncated "
            "to this length."
        },
    )
    do_predict: bool = field(
        default=False,
        metadata={"help": "Whether to predict answers for --predict_file (and evaluate them when it has answers)."},
    )
    predict_batch_size: int = field(default=8, metadata={"help": "Total batch size for predictions."})
    n_best_size: int = field(
        default=20,
        metadata={
            "help": "The total number of n-best predictions to generate in the nbest_predictions.json output file."
        },
    )
    max_answer_length: int = field(
        default=30,
        metadata={
            "help": "The maximum length of an answer that can be generated. This is needed because the start and "
            "end predictions are not conditioned on one another."
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
        default=False, metadata={"help": "If true, the SQuAD examples contain some that do not have an answer."}
    )
    null_score_diff_threshold: float = field(
        default=0.0, metadata={"help": "If null_score - best_non_null is greater than the threshold predict null."}
    )
    # The runner's evaluation flags: run_squad.py has no eval mode.
    do_eval: bool = field(default=False, metadata={"help": _NO_EVAL, "cli": False})
    eval_batch_size: int = field(default=8, metadata={"help": _NO_EVAL, "cli": False})
    eval_every_steps: int = field(default=0, metadata={"help": _NO_EVAL, "cli": False})
    early_stopping_patience: int = field(default=0, metadata={"help": _NO_EVAL, "cli": False})
    metric_for_best_model: str | None = field(default=None, metadata={"help": _NO_EVAL, "cli": False})


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
    for name in ("doc_stride", "n_best_size", "max_answer_length"):
        if getattr(args, name) < 1:
            raise InputError(f"--{name}={getattr(args, name)} must be at least 1")
    if args.max_query_length < 0:
        raise InputError(f"--max_query_length={args.max_query_length} must not be negative")


def gold_dataset(dataset_json: dict, version_2_with_negative: bool, source: str) -> list | None:
    """The `data` list to evaluate predictions against, or None when the file holds no gold answers.

    A file is a dev file when its questions have `answers` lists (v1.1: not all empty; v2.0: some
    non-empty or an `is_impossible` field). The answers are checked here, before any work, so that the
    evaluation after predicting cannot fail on them.

    Raises:
        InputError: only some questions have answers, an answer has no text, or (v1.1) a question has an
            empty answer list.
    """

    questions = [
        qa for article in dataset_json["data"] for paragraph in article["paragraphs"] for qa in paragraph["qas"]
    ]
    with_answers = [qa for qa in questions if "answers" in qa]
    if not with_answers:
        return None
    if len(with_answers) != len(questions):
        missing = next(qa["id"] for qa in questions if "answers" not in qa)
        raise InputError(
            f'{source}: {len(questions) - len(with_answers)} of {len(questions)} questions have no "answers" list '
            f"(first: {missing}); give every question its answers ([] for none) or none of them"
        )
    answered = any(isinstance(qa["answers"], list) and qa["answers"] for qa in questions)
    if not answered and not (version_2_with_negative and any("is_impossible" in qa for qa in questions)):
        return None  # a test file with empty answer lists
    for qa in iter_questions(dataset_json["data"], source):
        if not qa["answers"] and not version_2_with_negative:
            raise InputError(
                f"{source}: question {qa['id']} has no gold answer, which SQuAD v1.1 cannot score; "
                "pass --version_2_with_negative=true for a v2.0 file"
            )
    version = str(dataset_json.get("version", "")).lstrip("vV")
    if version[:1] in ("1", "2") and (version[:1] == "2") != version_2_with_negative:
        logger.warning("%s says version %s but --version_2_with_negative=%s", source, version, version_2_with_negative)
    return dataset_json["data"]


class SquadTask(FinetuneTask):
    """Start and end positions of the answer in doc-stride windows (`bert.tasks.squad` features).

    A batch's `labels` are [B, 3]: start position, end position (0, 0 when the window does not hold the
    answer; 0, 0 in prediction) and the window's number of real tokens (its padding is masked out of the
    loss and of the kept logits).
    """

    command = "squad"

    def __init__(self, args: SquadArgs):

        self.args = args
        self.model_class = BertForQuestionAnswering
        self.gold: list | None = None  # the predict file's `data` list when it has answers
        self.eval_results: dict[str, Any] | None = None

    def read_examples(self, split: str) -> list:

        a = self.args
        if split == "train":
            data = load_json_file(a.train_file, "--train_file")
            examples = squad_examples_from_json(data, True, a.version_2_with_negative, source=a.train_file)
            if not examples:
                raise InputError(f"--train_file={a.train_file} holds no usable questions; give a SQuAD training file")
            # As run_squad.py: shuffle the examples (not the windows) before making features.
            random.Random(TRAIN_SHUFFLE_SEED).shuffle(examples)
            return examples
        if split == "test":
            data = load_json_file(a.predict_file, "--predict_file")
            examples = squad_examples_from_json(data, False, a.version_2_with_negative, source=a.predict_file)
            self.gold = gold_dataset(data, a.version_2_with_negative, a.predict_file)
            return examples
        raise InputError(_NO_EVAL)

    def convert(self, examples: Sequence, tokenizer, max_seq_length: int, pad: bool) -> list:

        # Training examples carry answer positions (-1 for impossible ones); prediction examples none.
        is_training = any(ex.start_position is not None for ex in examples)
        features = convert_examples_to_features(
            examples,
            tokenizer,
            max_seq_length,
            self.args.doc_stride,
            self.args.max_query_length,
            is_training,
            pad_to_max_length=pad,
        )
        logger.info(
            "%d %s examples -> %d features", len(examples), "training" if is_training else "predict", len(features)
        )
        return features

    def feature_length(self, feature) -> int:
        return len(feature.tokens)

    def collate(self, features: Sequence, pad_to: int | None) -> dict[str, np.ndarray]:

        labels = [[f.start_position or 0, f.end_position or 0, len(f.tokens)] for f in features]
        return {
            "input_ids": pad_2d([f.input_ids for f in features], pad_to),
            "attention_mask": pad_2d([f.input_mask for f in features], pad_to),
            "token_type_ids": pad_2d([f.segment_ids for f in features], pad_to),
            "labels": np.array(labels, dtype=np.int64).reshape(len(features), 3),
        }

    def loss_terms(self, logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per window, (CE(start) + CE(end)) / 2 over its real positions; the loss is their mean."""
        logits = logits.float()  # [B, T, 2]
        positions = torch.arange(logits.shape[1], device=logits.device)  # [T]
        padding = positions[None, :] >= labels[:, 2:3]  # [B, T]
        logits = logits.masked_fill(padding[..., None], float("-inf"))
        start_logits, end_logits = logits.unbind(-1)  # 2 x [B, T]
        ce = torch.nn.functional.cross_entropy
        losses = (
            ce(start_logits, labels[:, 0].long(), reduction="none")
            + ce(end_logits, labels[:, 1].long(), reduction="none")
        ) / 2  # [B]
        return losses, torch.ones_like(losses)

    def feature_outputs(self, logits: torch.Tensor, batch: dict[str, torch.Tensor]) -> list[np.ndarray]:
        """The [n, 2] start/end logits of each window's n real positions."""
        arr = logits.float().cpu().numpy()  # [B, T, 2]
        return [arr[i, :n].copy() for i, n in enumerate(batch["labels"][:, 2].tolist())]

    def metrics(self, examples: Sequence, features: Sequence, outputs: list[np.ndarray]) -> dict[str, Any]:
        raise InputError(_NO_EVAL)

    def write_predictions(
        self, output_dir: Path, examples: Sequence, features: Sequence, outputs: list
    ) -> dict[str, Any]:
        """The three prediction files and, for a file with answers, the official evaluation."""

        a = self.args
        results = [RawResult(f.unique_id, out[:, 0], out[:, 1]) for f, out in zip(features, outputs)]
        files = {"predictions": output_dir / PREDICTIONS_NAME, "nbest_predictions": output_dir / NBEST_NAME}
        if a.version_2_with_negative:
            files["null_odds"] = output_dir / NULL_ODDS_NAME
        predictions = write_predictions(
            examples,
            features,
            results,
            a.n_best_size,
            a.max_answer_length,
            a.do_lower_case,
            files["predictions"],
            files["nbest_predictions"],
            files.get("null_odds"),
            version_2_with_negative=a.version_2_with_negative,
            null_score_diff_threshold=a.null_score_diff_threshold,
            verbose_logging=a.verbose_logging,
        )
        out: dict[str, Any] = {k: str(v) for k, v in files.items()}
        out["num_examples"] = len(examples)
        out["num_features"] = len(features)
        if self.gold is not None:
            self.eval_results = evaluate_predictions(output_dir, self.gold, predictions, a.version_2_with_negative)
            out["eval"] = self.eval_results
        else:
            logger.info("%s has no gold answers: not evaluated", a.predict_file)
        return out


def evaluate_predictions(
    output_dir: Path, dataset: list, predictions: dict[str, str], version_2_with_negative: bool
) -> dict[str, Any]:
    """Score `predictions` with the official v1.1 or v2.0 evaluation (v2.0: `null_odds.json` of `output_dir`
    as the no-answer probabilities) and write `eval_results.json` and `eval_results.txt`."""

    if version_2_with_negative:
        null_odds = json.loads((output_dir / NULL_ODDS_NAME).read_text(encoding="utf-8"))
        result = dict(evaluate_v2(dataset, predictions, na_probs=null_odds))
    else:
        result = evaluate_v1(dataset, predictions)
    write_results(output_dir, result, as_float32=False)
    return result


def run_squad(args: SquadArgs) -> dict[str, Any]:
    """Train and/or predict (see the module docstring); returns the runner's summary, with the official
    evaluation under "eval" when the predict file has answers."""
    validate_flags_or_throw(args)
    task = SquadTask(args)
    result = run_finetune(args, task)
    if task.eval_results is not None:
        result["eval"] = task.eval_results
    return result
