"""`bert predict`: a fine-tuned model on raw text, one JSON line out per input line.

The model directory's head decides the task (`bert.inference.Predictor`): sequence classification
(`bert classify`'s models), NER (`bert ner`), question answering (`bert squad`) or multiple choice
(`bert swag`). Inputs are plain text lines or JSON lines (see `bert.input_lines.read_input_record`);
results are `bert.inference`'s, in input order. Input is read in chunks, so memory does not grow with
its length; the output appears only once every line has been read and predicted.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from bert.errors import InputError
from bert.flags import InferenceArgs
from bert.outputs import claim
from bert.tasks.classification import LONG_DOCUMENT
from bert.tasks.common import CLASSIFICATION, FILL_MASK, MULTIPLE_CHOICE, NER, QUESTION_ANSWERING
from bert.tasks.windows import WINDOW_POOLINGS
from bert.utils import count_lines, json_line, output_file_or_stdout, print_result, readable_input

if TYPE_CHECKING:
    from bert.inference import Predictor

logger = logging.getLogger(__name__)

# Flags only classification reads, with their defaults.
CLASSIFICATION_FLAGS = (("top_k", 1), ("long_document", None), ("window_pooling", None))


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
        metadata={
            "model": True,
            "help": "The fine-tuned model: a directory such as OUTPUT_DIR/model of bert classify/ner/squad/swag.",
        }
    )
    input_file: str | None = field(
        default=None, metadata={"help": "Input lines (plain text or JSON lines, .gz accepted); stdin if unset."}
    )
    output_file: str | None = field(default=None, metadata={"help": "Output JSON-lines file; stdout if unset."})
    top_k: int = field(
        default=1,
        metadata={"help": "Classification: also list the k best labels with their scores (0: all).", "min": 0},
    )
    long_document: str | None = field(
        default=None,
        metadata={
            "help": "Classification of texts longer than max_seq_length: truncate (as bert classify: the end is "
            "cut off) or windows (the whole text in windows of max_seq_length, --doc_stride apart, pooled by "
            "--window_pooling). Default: as the model was fine-tuned (config.json), else truncate.",
            "choices": list(LONG_DOCUMENT),
        },
    )
    window_pooling: str | None = field(
        default=None,
        metadata={
            "help": "Classification with --long_document=windows: how the windows' logits become one "
            "prediction, mean or max. Default: as the model was fine-tuned (config.json), else mean.",
            "choices": list(WINDOW_POOLINGS),
        },
    )


def _predict(predictor: Predictor, records: list, args: PredictArgs) -> list[dict[str, Any]]:
    # Imported here, not at the top, so that bert.cli reports a flag error before torch loads.
    from bert.input_lines import InputItemError

    task = predictor.task
    if task == CLASSIFICATION:
        return predictor.classify(records, top_k=args.top_k)
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
    settings = args.predictor_settings()
    # Imported here, not at the top, so that bert.cli reports a flag error before torch loads.
    from bert.inference import Predictor
    from bert.input_lines import map_input_lines

    predictor = Predictor.from_pretrained(args.model, max_seq_length=args.max_seq_length, **settings)
    if not any(predictor.has_head(task) for task in (CLASSIFICATION, NER, QUESTION_ANSWERING, MULTIPLE_CHOICE)):
        other = "bert fill-mask" if predictor.has_head(FILL_MASK) else "bert embed"
        raise InputError(
            f"--model={args.model} is a {predictor.architecture} (config.json architectures) without a task head; "
            f"fine-tune it first (bert classify, ner, squad or swag), or use {other}"
        )
    if predictor.task != CLASSIFICATION:
        given = [f for f, default in CLASSIFICATION_FLAGS if getattr(args, f) != default]
        if given:
            raise InputError(
                f"--{given[0]} applies to classification models; --model={args.model} is a {predictor.architecture}"
            )
    predictor.set_windows(args.long_document, args.doc_stride, args.window_pooling, "the command line")
    # Records of NER lines are read like classification ones, so that a stray "text_pair" is refused.
    task = CLASSIFICATION if predictor.task == NER else predictor.task
    name = args.input_file or "<stdin>"
    n = 0
    with readable_input(args.input_file) as path:
        total = count_lines(path)
        desc = "predict" if args.input_file is not None else None
        with output_file_or_stdout(args.output_file) as out, predictor.counting_truncations():
            for results in map_input_lines(path, name, task, lambda r: _predict(predictor, r, args), total, desc):
                for result in results:
                    out.write(json_line(result) + "\n")
                n += len(results)
    logger.info("predicted %d lines with %s (%s)", n, args.model, predictor.task)
    if args.output_file is not None:  # on stdout the lines themselves are the result
        print_result(
            "predict",
            f"{n} lines, {predictor.task} ({predictor.architecture})",
            f"written to {args.output_file}",
        )
    return {"lines": n, "task": predictor.task, "output_file": args.output_file}
