"""`bert embed`: one vector per input line, as a .npy matrix or JSON lines (`bert.inference.Predictor.embed`).

Any model directory works (a pre-trained or a fine-tuned one: its encoder is used). A
sentence-transformers directory (`modules.json`, `1_Pooling/config.json`, `sentence_bert_config.json`)
sets the default pooling, normalisation and length, so all-MiniLM-L6-v2 gives what
sentence-transformers gives. Memory does not grow with the input: lines are embedded in chunks and each
chunk's vectors written out before the next; a .npy file gets its header first (the lines are counted
beforehand), then its rows.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bert.errors import InputError
from bert.flags import InferenceArgs
from bert.inference import EMBEDDINGS, POOLINGS, Predictor, cosine_similarity, map_input_lines
from bert.outputs import claim
from bert.utils import count_lines, json_line, output_file_or_stdout, readable_input

logger = logging.getLogger(__name__)

# --similarity prints an N x N matrix: meant for a handful of sentences.
MAX_SIMILARITY_LINES = 1000


@dataclass
class EmbedArgs(InferenceArgs):
    """Embed text: one vector per input line (plain text, or JSON lines with a "text" field).

    Output: --output_file=x.npy writes a float32 matrix, row i for line i; any other name (or stdout)
    gets JSON lines {"embedding": [...]}. --similarity outputs the cosine similarity matrix of the
    inputs instead.
    """

    model: str = field(metadata={"help": "The model directory (any BERT model; sentence-transformers dirs too)."})
    input_file: str | None = field(
        default=None, metadata={"help": "Input lines (plain text or JSON lines, .gz accepted); stdin if unset."}
    )
    output_file: str | None = field(
        default=None, metadata={"help": "A .npy file (float32 matrix), or a JSON-lines file; stdout if unset."}
    )
    pooling: str | None = field(
        default=None,
        metadata={
            "help": "cls (the last layer at [CLS]), mean (the mean over the tokens), max (their element-wise "
            "maximum) or pooler (tanh(dense([CLS])), the pre-training pooler). Default: the model's "
            "sentence-transformers pooling, else mean.",
            "choices": list(POOLINGS),
        },
    )
    normalize: bool | None = field(
        default=None,
        metadata={
            "help": "Scale vectors to unit length; default: as sentence-transformers' modules.json says, else no."
        },
    )
    similarity: bool = field(
        default=False,
        metadata={"help": f"Output the cosine similarity matrix of the inputs (at most {MAX_SIMILARITY_LINES} lines)."},
    )
    max_seq_length: int | None = field(
        default=None,
        metadata={
            "help": "Longer inputs are cut to this many tokens; default: the model's (sentence_bert_config.json "
            "or config.json), else max_position_embeddings."
        },
    )


def _write_rows(out, vectors: np.ndarray, as_npy: bool) -> None:
    if as_npy:
        out.write(np.ascontiguousarray(vectors, dtype="<f4").tobytes())
        return
    for v in vectors:
        # str() of a float32 is its shortest round-trip form: JSON keeps exactly the float32 values.
        out.write(json_line({"embedding": [float(str(x)) for x in v]}) + "\n")


def run_embed(args: EmbedArgs) -> dict[str, Any]:
    """Embed every input line; returns {"lines", "dim", "output_file", "pooling", "normalize"}."""
    inputs = {"--input_file": args.input_file, "--model": args.model}
    with claim("embed", files={"--output_file": args.output_file}, inputs=inputs):
        return _run(args)


def _run(args: EmbedArgs) -> dict[str, Any]:
    settings = args.predictor_settings()
    predictor = Predictor.from_pretrained(args.model, max_seq_length=args.max_seq_length, **settings)
    pooling = args.pooling or predictor.default_pooling
    normalize = predictor.default_normalize if args.normalize is None else args.normalize
    as_npy = args.output_file is not None and args.output_file.endswith(".npy")
    dim = predictor.config.hidden_size
    name = args.input_file or "<stdin>"
    with readable_input(args.input_file) as path:
        total = count_lines(path)
        if args.similarity and total > MAX_SIMILARITY_LINES:
            raise InputError(
                f"--similarity outputs a {total} x {total} matrix; give at most {MAX_SIMILARITY_LINES} lines, or "
                "write the vectors (--output_file=x.npy) and compare them yourself"
            )
        kept = []
        desc = "embed" if args.input_file is not None else None
        with output_file_or_stdout(args.output_file, "wb" if as_npy else "w") as out:
            if as_npy:
                rows = total
                cols = total if args.similarity else dim
                np.lib.format.write_array_header_1_0(
                    out, {"descr": "<f4", "fortran_order": False, "shape": (rows, cols)}
                )
            embed = lambda texts: predictor.embed(texts, pooling=pooling, normalize=normalize)  # noqa: E731
            for vectors in map_input_lines(path, name, EMBEDDINGS, embed, total, desc):
                if args.similarity:
                    kept.append(vectors)
                else:
                    _write_rows(out, vectors, as_npy)
            if args.similarity:
                matrix = cosine_similarity(np.concatenate(kept)) if kept else np.zeros((0, 0), np.float32)
                if as_npy:
                    out.write(np.ascontiguousarray(matrix, dtype="<f4").tobytes())
                else:
                    for row in matrix:
                        out.write("\t".join(f"{x:.4f}" for x in row) + "\n")
    logger.info("embedded %d lines (%s pooling%s)", total, pooling, ", normalized" if normalize else "")
    return {"lines": total, "dim": dim, "output_file": args.output_file, "pooling": pooling, "normalize": normalize}
