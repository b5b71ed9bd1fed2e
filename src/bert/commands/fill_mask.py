"""`bert fill-mask`: the likeliest tokens at each [MASK] of each input line, from the pre-training
masked-LM head (`bert.inference.Predictor.fill_mask`), one JSON line out per input line."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from bert.errors import InputError
from bert.flags import InferenceArgs
from bert.outputs import claim
from bert.request_rules import TOP_K_MINIMUM
from bert.tasks.common import FILL_MASK
from bert.utils import count_lines, json_line, output_file_or_stdout, print_result, readable_input

logger = logging.getLogger(__name__)


@dataclass
class FillMaskArgs(InferenceArgs):
    """Predict the tokens at [MASK]: one input line (plain text, or JSON with a "text" field) with one or
    more [MASK] -> one JSON line {"sequence", "masks": [{"start", "end", "predictions": [{"token",
    "token_id", "score", "word"}, ...]}, ...]}.

    Scores are softmax probabilities over the vocabulary, best first. A "##" piece continues the word
    before the mask: its "word" is that whole word (play[MASK] with ##ing -> playing), and "sequence",
    the text with every mask replaced by its top prediction, joins it to that word.
    """

    model: str = field(
        metadata={
            "model": True,
            "help": "A pre-trained model with its masked-LM head (BertForPreTraining or BertForMaskedLM).",
        }
    )
    input_file: str | None = field(
        default=None, metadata={"help": "Input lines (plain text or JSON lines, .gz accepted); stdin if unset."}
    )
    output_file: str | None = field(default=None, metadata={"help": "Output JSON-lines file; stdout if unset."})
    top_k: int = field(default=5, metadata={"help": "Predictions per mask.", "min": TOP_K_MINIMUM})
    # InferenceArgs' window stride: fill-mask cuts long inputs, so the flag is not offered.
    doc_stride: int | None = field(
        default=None, kw_only=True, metadata={"help": "Unused by bert fill-mask.", "cli": False}
    )


def run_fill_mask(args: FillMaskArgs) -> dict[str, Any]:
    """Fill the masks of every input line; returns {"lines", "masks", "output_file"}."""
    inputs = {"--input_file": args.input_file, "--model": args.model}
    with claim("fill-mask", files={"--output_file": args.output_file}, inputs=inputs):
        return _run(args)


def _run(args: FillMaskArgs) -> dict[str, Any]:
    settings = args.predictor_settings()
    # Imported here, not at the top, so that bert.cli reports a flag error before torch loads.
    from bert.inference import Predictor
    from bert.input_lines import map_input_lines

    predictor = Predictor.from_pretrained(args.model, max_seq_length=args.max_seq_length, **settings)
    if not predictor.has_head(FILL_MASK):
        raise InputError(
            f"--model={args.model} is a {predictor.architecture} without the masked-LM head (cls.predictions.*); "
            "use a pre-trained BertForPreTraining or BertForMaskedLM model"
        )
    name = args.input_file or "<stdin>"
    lines_done = masks = 0
    with readable_input(args.input_file) as path:
        total = count_lines(path)
        desc = "fill-mask" if args.input_file is not None else None
        with output_file_or_stdout(args.output_file) as out:
            fill = lambda texts: predictor.fill_mask(texts, top_k=args.top_k)  # noqa: E731
            for results in map_input_lines(path, name, FILL_MASK, fill, total, desc):
                for result in results:
                    out.write(json_line(result) + "\n")
                    masks += len(result["masks"])
                lines_done += len(results)
    logger.info("filled %d masks in %d lines", masks, lines_done)
    if args.output_file is not None:  # on stdout the lines themselves are the result
        print_result("fill-mask", f"{masks} masks filled in {lines_done} lines", f"written to {args.output_file}")
    return {"lines": lines_done, "masks": masks, "output_file": args.output_file}
