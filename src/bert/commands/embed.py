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
import tempfile
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bert.errors import InputError
from bert.flags import EMBEDDING_PRECISIONS, POOLINGS, InferenceArgs, ShardArgs
from bert.outputs import claim
from bert.tasks.classification import LONG_DOCUMENT
from bert.utils import (
    count_lines,
    json_line,
    output_file_or_stdout,
    print_result,
    readable_input,
    shard_file,
    shard_range,
)

logger = logging.getLogger(__name__)

# --similarity prints an N x N matrix: meant for a handful of sentences.
MAX_SIMILARITY_LINES = 1000


@dataclass
class EmbedArgs(InferenceArgs, ShardArgs):
    """Embed text: one vector per input line (plain text, or JSON lines with a "text" field).

    Output: --output_file=x.npy writes a float32 matrix, row i for line i; any other name (or stdout)
    gets JSON lines {"embedding": [...]}. --similarity outputs the cosine similarity matrix of the
    inputs instead.

    --num_shards=N --shard_index=i embeds the i-th of N consecutive blocks of the lines into
    OUTPUT-0000i-of-0000N.npy (or .jsonl): the N files, read in name order, are the unsharded output.
    """

    model: str = field(
        metadata={"model": True, "help": "The model directory (any BERT model; sentence-transformers dirs too)."}
    )
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
    dimensions: int | None = field(
        default=None,
        metadata={
            "help": "Keep the first N components of each vector (Matryoshka truncation), then normalize them "
            "again when normalizing, as sentence-transformers' truncate_dim; default: all."
        },
    )
    prompt_name: str | None = field(
        default=None,
        metadata={
            "help": 'Prepend the model\'s prompt of this name (config_sentence_transformers.json "prompts", e.g. '
            "query); default: the model's default_prompt_name, if any."
        },
    )
    prompt: str | None = field(
        default=None, metadata={"help": "Prepend this text to every input (instead of a --prompt_name)."}
    )
    precision: str = field(
        default="float32",
        metadata={
            "help": "Number format of the vectors, as sentence-transformers' quantize_embeddings: float32; int8 or "
            "uint8 (each dimension's range over all the inputs cut into 256 buckets); binary or ubinary (one "
            "sign bit per component, 8 per byte, as int8 - 128 or uint8).",
            "choices": list(EMBEDDING_PRECISIONS),
        },
    )
    long_document: str = field(
        default="truncate",
        metadata={
            "help": "Inputs longer than max_seq_length: truncate (cut, as sentence-transformers does) or windows "
            "(read whole in windows of max_seq_length, --doc_stride apart, cut as bert classify cuts them; "
            "the vector is the mean of the windows' vectors).",
            "choices": list(LONG_DOCUMENT),
        },
    )


def _write_rows(out, vectors: np.ndarray, as_npy: bool) -> None:
    if as_npy:
        out.write(np.ascontiguousarray(vectors, dtype=vectors.dtype.newbyteorder("<")).tobytes())
        return
    for v in vectors:
        # str() of a float32 is its shortest round-trip form: JSON keeps exactly the float32 values.
        values = [float(str(x)) for x in v] if v.dtype == np.float32 else v.tolist()
        out.write(json_line({"embedding": values}) + "\n")


def _check_flags(args: EmbedArgs) -> None:
    if args.dimensions is not None and args.dimensions < 1:
        raise InputError(f"--dimensions={args.dimensions} must be at least 1")
    if args.prompt is not None and args.prompt_name is not None:
        raise InputError("--prompt and --prompt_name both give a prompt; keep one")
    if args.doc_stride is not None and args.long_document != "windows":
        logger.warning("--doc_stride=%d has no effect without --long_document=windows", args.doc_stride)
    if args.similarity and args.precision != "float32":
        raise InputError("--similarity compares float32 vectors; drop --precision or --similarity")
    args.check_shard_flags()
    if args.num_shards > 1 and (args.output_file is None or args.similarity):
        raise InputError("--num_shards needs --output_file (each shard writes its own file) and no --similarity")
    if args.num_shards > 1 and args.precision in ("int8", "uint8"):
        # Their ranges come from all the inputs; each shard would calibrate on its own share.
        raise InputError(
            f"--precision={args.precision} takes its ranges from all the inputs, which one shard does not see; "
            "embed the shards as float32 and quantize the joined vectors"
        )


def run_embed(args: EmbedArgs) -> dict[str, Any]:
    """Embed every input line; returns {"lines", "dim", "output_file", "pooling", "normalize"}.

    int8 and uint8 take each dimension's range over all the inputs (sentence-transformers' calibration on
    the embeddings themselves), so their float32 vectors wait in a temporary file until the last line is
    embedded, then are quantized chunk by chunk."""
    _check_flags(args)
    output_file = args.output_file
    if args.num_shards > 1 and args.output_file is not None:  # each shard claims and writes its own file
        output_file = shard_file(args.output_file, args.shard_index, args.num_shards)
    inputs = {"--input_file": args.input_file, "--model": args.model}
    with claim("embed", files={"--output_file": output_file}, inputs=inputs):
        return _run(args, output_file)


def _run(args: EmbedArgs, output_file: str | None) -> dict[str, Any]:
    settings = args.predictor_settings()
    # Imported here, not at the top, so that bert.cli reports a flag error before torch loads.
    from bert.inference import CHUNK_LINES, EMBEDDINGS, Predictor, cosine_similarity, map_input_lines
    from bert.retrieval import Calibration, quantize_embeddings, quantized_shape

    predictor = Predictor.from_pretrained(args.model, max_seq_length=args.max_seq_length, **settings)
    pooling = args.pooling or predictor.default_pooling
    normalize = predictor.default_normalize if args.normalize is None else args.normalize
    as_npy = args.output_file is not None and args.output_file.endswith(".npy")
    dim = args.dimensions or predictor.config.hidden_size
    if dim > predictor.config.hidden_size:
        raise InputError(f"--dimensions={dim} is more than the model's {predictor.config.hidden_size}")
    calibrate = args.precision in ("int8", "uint8")
    name = args.input_file or "<stdin>"
    with readable_input(args.input_file) as path:
        lines = shard_range(count_lines(path), args.shard_index, args.num_shards)
        total = len(lines)
        if args.similarity and total > MAX_SIMILARITY_LINES:
            raise InputError(
                f"--similarity outputs a {total} x {total} matrix; give at most {MAX_SIMILARITY_LINES} lines, or "
                "write the vectors (--output_file=x.npy) and compare them yourself"
            )
        (rows, cols), dtype = quantized_shape(total, dim, args.precision)
        if args.similarity:
            cols = total
        kept = []
        desc = "embed" if args.input_file is not None else None
        with output_file_or_stdout(output_file, "wb" if as_npy else "w") as out, tempfile.TemporaryFile() as spill:
            if as_npy:
                np.lib.format.write_array_header_1_0(
                    out, {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": (rows, cols)}
                )

            def embed(texts: list[str]) -> np.ndarray:
                return predictor.embed(
                    texts,
                    pooling=pooling,
                    normalize=normalize,
                    prompt_name=args.prompt_name,
                    prompt=args.prompt,
                    dimensions=args.dimensions,
                    long_document=args.long_document,
                    doc_stride=args.doc_stride,
                )

            calibration = Calibration()
            only = lines if args.num_shards > 1 else None
            for vectors in map_input_lines(path, name, EMBEDDINGS, embed, total, desc, only):
                if args.similarity:
                    kept.append(vectors)
                elif calibrate:
                    spill.write(np.ascontiguousarray(vectors, dtype="<f4").tobytes())
                    calibration.add(vectors)
                else:
                    _write_rows(out, quantize_embeddings(vectors, args.precision), as_npy)
            if calibrate and total:
                ranges = calibration.ranges()
                spill.seek(0)
                for start in range(0, total, CHUNK_LINES):
                    chunk = np.frombuffer(spill.read(min(CHUNK_LINES, total - start) * dim * 4), dtype="<f4")
                    _write_rows(out, quantize_embeddings(chunk.reshape(-1, dim), args.precision, ranges), as_npy)
            if args.similarity:
                matrix = cosine_similarity(np.concatenate(kept)) if kept else np.zeros((0, 0), np.float32)
                if as_npy:
                    out.write(np.ascontiguousarray(matrix, dtype="<f4").tobytes())
                else:
                    for row in matrix:
                        out.write("\t".join(f"{x:.4f}" for x in row) + "\n")
    logger.info(
        "embedded %d lines (%s pooling%s, %s)", total, pooling, ", normalized" if normalize else "", args.precision
    )
    if args.output_file is not None:  # on stdout the lines themselves are the result
        what = (
            f"a {total} x {total} cosine similarity matrix"
            if args.similarity
            else f"{total} {args.precision} vectors of {dim}"
        )
        norm = ", normalized" if normalize else ""
        print_result("embed", f"{what} ({pooling} pooling{norm})", f"written to {output_file}")
    return {"lines": total, "dim": dim, "output_file": output_file, "pooling": pooling, "normalize": normalize}
