"""`bert predict`: a fine-tuned model on raw text, one JSON line out per input line.

The model directory's head decides the task (`bert.inference.Predictor`): sequence classification
(`bert classify`'s models), NER (`bert ner`), question answering (`bert squad`) or multiple choice
(`bert swag`). Inputs are plain text lines or JSON lines (see `bert.inference.read_input_record`);
results are `bert.inference`'s, in input order. Input is read in chunks, so memory does not grow with
its length; the output appears only once every line has been read and predicted.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from bert.errors import InputError
from bert.flags import InferenceArgs
from bert.inference import (
    CLASSIFICATION,
    MULTIPLE_CHOICE,
    NER,
    QUESTION_ANSWERING,
    InputItemError,
    Predictor,
    map_input_lines,
)
from bert.outputs import claim
from bert.utils import count_lines, json_line, output_file_or_stdout, readable_input

logger = logging.getLogger(__name__)


@dataclass
class PredictArgs(InferenceArgs):
    """Run a fine-tuned model on raw text: one JSON line per input line.

    Input (stdin or --input_file), per line: plain text, or JSON: {"text"} or {"text", "text_pair"} for
    classification and NER, {"question", "context"} for question answering, {"context", "endings": [...]}
    for multiple choice. Output (stdout or --output_file): classification {"label", "score"} (multi-label
    {"labels": [...]}, regression {"score"}), NER {"entities": [{"entity", "start", "end", "text",
    "score"}]}, question answering {"answer", "start", "end", "score"} (answer null: no answer),
    multiple choice {"choice", "ending", "score", "scores"}. Offsets are character positions in the input.
    """

    model: str = field(
        metadata={"help": "The fine-tuned model: a directory such as OUTPUT_DIR/model of bert classify/ner/squad/swag."}
    )
    input_file: str | None = field(
        default=None, metadata={"help": "Input lines (plain text or JSON lines, .gz accepted); stdin if unset."}
    )
    output_file: str | None = field(default=None, metadata={"help": "Output JSON-lines file; stdout if unset."})
    top_k: int = field(
        default=1, metadata={"help": "Classification: also list the k best labels with their scores (0: all)."}
    )
    long_document: str = field(
        default="truncate",
        metadata={
            "help": "Classification of texts longer than max_seq_length: truncate (as bert classify: the end is "
            "cut off) or windows (the whole text in windows of max_seq_length, --doc_stride apart; the windows' "
            "logits are averaged, which keeps them on the scale the model was fine-tuned at, so scores, "
            "thresholds and regression outputs stay meaningful and a short text gets its truncate result; max "
            "pooling would inflate them with the number of windows).",
            "choices": ["truncate", "windows"],
        },
    )
    doc_stride: int | None = field(
        default=None,
        metadata={
            "help": "Tokens between window starts (question answering, --long_document=windows); default: "
            "the model's config, else 128."
        },
    )
    max_seq_length: int | None = field(
        default=None,
        metadata={
            "help": "Longest sequence in tokens; default: the model's fine-tuning length (config.json), "
            "else 128 (384 for question answering)."
        },
    )


def _predict(predictor: Predictor, records: list, args: PredictArgs) -> list[dict[str, Any]]:
    task = predictor.task
    if task == CLASSIFICATION:
        return predictor.classify(
            records, top_k=args.top_k, long_document=args.long_document, doc_stride=args.doc_stride
        )
    if task == NER:
        texts = []
        for i, (text, pair) in enumerate(records):
            if pair is not None:
                raise InputItemError(i, 'NER takes one text per line; drop "text_pair"')
            texts.append(text)
        return [{"entities": entities} for entities in predictor.ner(texts)]
    if task == QUESTION_ANSWERING:
        return predictor.answer([q for q, _ in records], [c for _, c in records])
    return predictor.choose([c for c, _ in records], [e for _, e in records])


def run_predict(args: PredictArgs) -> dict[str, Any]:
    """Predict every input line; returns {"lines", "task", "output_file"}."""
    inputs = {"--input_file": args.input_file, "--model": args.model}
    with claim("predict", files={"--output_file": args.output_file}, inputs=inputs):
        return _run(args)


def _run(args: PredictArgs) -> dict[str, Any]:
    if args.top_k < 0:
        raise InputError(f"--top_k={args.top_k} must be 0 (all labels) or more")
    if args.doc_stride is not None and args.doc_stride < 1:
        raise InputError(f"--doc_stride={args.doc_stride} must be at least 1")
    settings = args.predictor_settings()
    predictor = Predictor.from_pretrained(args.model, max_seq_length=args.max_seq_length, **settings)
    if predictor.task not in (CLASSIFICATION, NER, QUESTION_ANSWERING, MULTIPLE_CHOICE):
        other = "bert fill-mask" if predictor.has_mlm_head else "bert embed"
        raise InputError(
            f"--model={args.model} is a {predictor.architecture} (config.json architectures) without a task head; "
            f"fine-tune it first (bert classify, ner, squad or swag), or use {other}"
        )
    if predictor.task != CLASSIFICATION:
        given = [f for f, default in (("top_k", 1), ("long_document", "truncate")) if getattr(args, f) != default]
        if given:
            raise InputError(
                f"--{given[0]} applies to classification models; --model={args.model} is a {predictor.architecture}"
            )
    if predictor.task == QUESTION_ANSWERING and args.doc_stride is not None:
        predictor.doc_stride = args.doc_stride
    # Records of NER lines are read like classification ones, so that a stray "text_pair" is refused.
    task = CLASSIFICATION if predictor.task == NER else predictor.task
    name = args.input_file or "<stdin>"
    n = 0
    with readable_input(args.input_file) as path:
        total = count_lines(path)
        desc = "predict" if args.input_file is not None else None
        with output_file_or_stdout(args.output_file) as out:
            for results in map_input_lines(path, name, task, lambda r: _predict(predictor, r, args), total, desc):
                for result in results:
                    out.write(json_line(result) + "\n")
                n += len(results)
    logger.info("predicted %d lines with %s (%s)", n, args.model, predictor.task)
    return {"lines": n, "task": predictor.task, "output_file": args.output_file}
