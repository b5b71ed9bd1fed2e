"""`bert embed`: one vector per input line or Parquet row, as a .npy matrix, a Parquet file or JSON lines
(`bert.inference.Predictor.embed`).

Any model directory works (a pre-trained or a fine-tuned one: its encoder is used). A
sentence-transformers directory (`modules.json`, `1_Pooling/config.json`, `sentence_bert_config.json`)
sets the default pooling, normalisation and length, so all-MiniLM-L6-v2 gives what
sentence-transformers gives. Memory does not grow with the input: lines are embedded in chunks and each
chunk's vectors written out before the next; a .npy file gets its header first (the lines are counted
beforehand), then its rows; a Parquet input is read a batch at a time and a Parquet output written a row
group at a time (`bert.formats.parquet`, pyarrow from the `parquet` extra).
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import json
import logging
import os
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import numpy as np

from bert.errors import InputError
from bert.flags import EMBEDDING_PRECISIONS, InferenceArgs, ShardArgs
from bert.formats.parquet import SPAN_COLUMNS, EmbeddingWriter, ParquetTexts, is_parquet, pyarrow
from bert.late_chunking import LateChunks, check_chunk_overlap, late_chunk_embeddings
from bert.outputs import claim
from bert.pretraining.corpus import SENTENCE_SPLITTERS, make_sentence_splitter
from bert.request_rules import DIMENSIONS_MINIMUM, POOLINGS, check_dimensions
from bert.tasks.classification import LONG_DOCUMENT
from bert.utils import (
    atomic_write,
    count_lines,
    json_line,
    load_json_file,
    output_file_or_stdout,
    print_result,
    readable_input,
    shard_file,
    shard_range,
)

if TYPE_CHECKING:
    from bert.inference import Predictor

logger = logging.getLogger(__name__)

# The flags that change a shard's vectors, recorded in its manifest: a re-run with others is refused.
VECTOR_FLAGS = (
    "pooling",
    "normalize",
    "dimensions",
    "prompt_name",
    "prompt",
    "precision",
    "long_document",
    "doc_stride",
    "max_seq_length",
    "do_lower_case",
    "quantize",
    "dtype",
    "backend",
    "text_column",
    "id_column",
    "late_chunking",
    "chunk_size",
    "chunk_overlap",
    "chunk_by",
)
# Text tokens a chunk of --late_chunking when --chunk_size is not given.
DEFAULT_CHUNK_TOKENS = 128
MANIFEST_SUFFIX = ".manifest.json"

# --similarity prints an N x N matrix: meant for a handful of sentences.
MAX_SIMILARITY_LINES = 1000


@dataclass
class EmbedArgs(InferenceArgs, ShardArgs):
    """Embed text: one vector per input line (plain text, or JSON lines with a "text" field), or per row of
    a Parquet file (--input_file=x.parquet, its --text_column; --id_column kept beside each vector).

    Output: --output_file=x.npy writes a float32 matrix, row i for line i; x.parquet an "embedding" column
    of fixed-size lists (after the --id_column); any other name (or stdout) gets JSON lines
    {"embedding": [...]}. --similarity outputs the cosine similarity matrix of the
    inputs instead.

    --num_shards=N --shard_index=i embeds the i-th of N consecutive blocks of the lines into
    OUTPUT-0000i-of-0000N.npy (or .parquet, .jsonl): the N files, read in name order, are the unsharded
    output. Each shard records what it holds in OUTPUT-0000i-of-0000N.npy.manifest.json: re-run, a complete
    shard made with the same model, input and flags is skipped, a missing or partial one embedded again, and
    one made otherwise refused.

    --late_chunking encodes each input once (in windows --doc_stride apart where it is longer than
    max_seq_length, each token's vector from the window where it has the most context) and writes one row per
    chunk of --chunk_size tokens, the mean of the last layer over the chunk's tokens ([CLS] with the first,
    [SEP] with the last), with its id DOCID#k (DOCID: the --id_column value, else the 0-based input line or row; k: the
    chunk, from 0) as "id" of a JSON line or the first column of a .parquet --output_file.
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
            "again when normalizing, as sentence-transformers' truncate_dim; default: all.",
            "min": DIMENSIONS_MINIMUM,
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
    text_column: str | None = field(
        default=None,
        metadata={"help": 'The column of the texts in a Parquet --input_file (a .parquet file); default: "text".'},
    )
    id_column: str | None = field(
        default=None,
        metadata={
            "help": "A column of a Parquet --input_file written beside each vector, as it is: the first column of a "
            '.parquet --output_file, "id" of JSON lines.'
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
    late_chunking: bool = field(
        default=False,
        metadata={
            "help": "One row per chunk of --chunk_size tokens of each input, pooled from one pass over the whole "
            "input (each chunk's vector sees its context), with ids DOCID#k; .parquet or JSON-lines output."
        },
    )
    chunk_size: int | None = field(
        default=None,
        metadata={"positive": True, "help": f"Text tokens a chunk of --late_chunking; default {DEFAULT_CHUNK_TOKENS}."},
    )
    chunk_by: str = field(
        default="tokens",
        metadata={
            "help": "How --late_chunking cuts a text: tokens (every --chunk_size tokens), or pysbd or blingfire: "
            "whole sentences split by that PyPI package (as prepare-corpus splits them), as many as fit in "
            "--chunk_size tokens, a longer sentence cut by tokens.",
            "choices": ["tokens", *SENTENCE_SPLITTERS],
        },
    )
    chunk_overlap: int | None = field(
        default=None,
        metadata={
            "min": 0,
            "help": "Text tokens a chunk of --late_chunking shares with the one before (less than --chunk_size); "
            "default 0: the chunks partition the text.",
        },
    )


# Each of VECTOR_FLAGS at its default, as a manifest records it: what a shard made before the flag existed did.
VECTOR_FLAG_DEFAULTS = {f"--{f.name}": f.default for f in fields(EmbedArgs) if f.name in VECTOR_FLAGS}


class _Rows:
    """Where the vectors go: a .npy matrix (its header written first), a Parquet file (`formats.parquet`), or
    JSON lines; `ids` (a pyarrow array, from --id_column) go beside the vectors."""

    def __init__(
        self, out: IO, kind: str, shape: tuple[int, int], dtype: np.dtype, id_field: Any | None, spans: bool
    ) -> None:
        self.out = out
        self.kind = kind
        self.parquet = EmbeddingWriter(out, shape[1], dtype, id_field, spans) if kind == "parquet" else None
        if kind == "npy":
            np.lib.format.write_array_header_1_0(
                out, {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": shape}
            )

    def write(self, vectors: np.ndarray, ids: Any | None = None, spans: np.ndarray | None = None) -> None:
        """`ids`: a pyarrow array of the --id_column, or a list (--late_chunking's DOCID#k), or None; `spans`:
        --late_chunking's [rows, 2] characters of each chunk's document, (start, stop)."""
        if self.parquet is not None:
            self.parquet.write(vectors, ids, spans)
        elif self.kind == "npy":
            self.out.write(np.ascontiguousarray(vectors, dtype=vectors.dtype.newbyteorder("<")).tobytes())
        else:
            keys = ids if isinstance(ids, list) else ids.to_pylist() if ids is not None else [None] * len(vectors)
            for i, (key, v) in enumerate(zip(keys, vectors, strict=True)):
                # str() of a float32 is its shortest round-trip form: JSON keeps exactly the float32 values.
                values = [float(str(x)) for x in v] if v.dtype == np.float32 else v.tolist()
                row: dict[str, Any] = {} if ids is None else {"id": key}
                if spans is not None:
                    row.update(zip(SPAN_COLUMNS, map(int, spans[i])))
                self.out.write(json_line({**row, "embedding": values}) + "\n")

    def close(self) -> None:
        if self.parquet is not None:
            self.parquet.close()


def _output_kind(output_file: str | None) -> str:
    if output_file is not None and output_file.endswith(".npy"):
        return "npy"
    return "parquet" if is_parquet(output_file) else "jsonl"


def _check_flags(args: EmbedArgs) -> None:
    if args.prompt is not None and args.prompt_name is not None:
        raise InputError("--prompt and --prompt_name both give a prompt; keep one")
    if args.doc_stride is not None and args.long_document != "windows" and not args.late_chunking:
        logger.warning(
            "--doc_stride=%d has no effect without --long_document=windows or --late_chunking", args.doc_stride
        )
    if args.similarity and args.precision != "float32":
        raise InputError("--similarity compares float32 vectors; drop --precision or --similarity")
    for flag, value in (("--text_column", args.text_column), ("--id_column", args.id_column)):
        if value is not None and not is_parquet(args.input_file):
            raise InputError(f"{flag} names a column of a Parquet --input_file (X.parquet); drop it, or give one")
    kind = _output_kind(args.output_file)
    if args.id_column is not None and kind == "npy":
        raise InputError("--id_column keeps ids beside the vectors, which a .npy matrix cannot; write .parquet")
    if args.similarity and (kind == "parquet" or is_parquet(args.input_file)):
        raise InputError("--similarity outputs a matrix of a few lines; drop it for Parquet files")
    _check_late_chunking(args, kind)
    args.check_shard_flags()
    if args.num_shards > 1 and (args.output_file is None or args.similarity):
        raise InputError("--num_shards needs --output_file (each shard writes its own file) and no --similarity")
    if args.num_shards > 1 and args.precision in ("int8", "uint8"):
        # Their ranges come from all the inputs; each shard would calibrate on its own share.
        raise InputError(
            f"--precision={args.precision} takes its ranges from all the inputs, which one shard does not see; "
            "embed the shards as float32 and quantize the joined vectors"
        )


def _check_late_chunking(args: EmbedArgs, kind: str) -> None:
    if not args.late_chunking:
        chunking: dict[str, object] = {"--chunk_size": args.chunk_size, "--chunk_overlap": args.chunk_overlap}
        chunking["--chunk_by"] = None if args.chunk_by == "tokens" else args.chunk_by
        for flag, value in chunking.items():
            if value is not None:
                raise InputError(f"{flag} sets the chunks of --late_chunking; give --late_chunking, or drop it")
        return
    if args.chunk_by != "tokens":
        make_sentence_splitter(args.chunk_by, "--chunk_by")  # its package is installed, before the model loads
        if args.chunk_overlap:
            raise InputError(
                f"--chunk_overlap counts tokens, and --chunk_by={args.chunk_by} cuts chunks at sentences; drop one"
            )
    check_chunk_overlap(args.chunk_size or DEFAULT_CHUNK_TOKENS, args.chunk_overlap or 0, "--")
    if kind == "npy":
        raise InputError(
            "--late_chunking writes a row per chunk with its id, which a .npy matrix cannot hold; write .parquet"
        )
    others = {
        "--similarity": args.similarity,
        "--long_document=windows": args.long_document == "windows",
        f"--precision={args.precision}": args.precision in ("int8", "uint8"),  # ranges over rows yet to be cut
        f"--pooling={args.pooling}": args.pooling not in (None, "mean"),  # a chunk is the mean of its tokens
    }
    for flag, given in others.items():
        if given:
            raise InputError(f"--late_chunking and {flag} do not go together; drop one")


def run_embed(args: EmbedArgs) -> dict[str, Any]:
    """Embed every input line (or Parquet row); returns {"lines", "dim", "output_file", "pooling", "normalize"}.

    int8 and uint8 take each dimension's range over all the inputs (sentence-transformers' calibration on
    the embeddings themselves), so their float32 vectors wait in a temporary file until the last line is
    embedded, then are quantized chunk by chunk.

    A shard (--num_shards > 1) writes `SHARD_FILE.manifest.json` after its output (`shard_manifest`): a
    re-run finds a complete shard made the same way and skips it, redoes one without it, and refuses one
    made another way."""
    _check_flags(args)
    output_file = args.output_file
    if args.num_shards > 1 and args.output_file is not None:  # each shard claims and writes its own file
        output_file = shard_file(args.output_file, args.shard_index, args.num_shards)
    inputs = {"--input_file": args.input_file, "--model": args.model}
    derived = {"--output_file": [MANIFEST_SUFFIX]}
    with claim("embed", files={"--output_file": output_file}, inputs=inputs, derived=derived):
        if args.num_shards == 1 or output_file is None or args.input_file is None:
            # stdin is read once: no manifest can say that a later run reads the same input.
            return _run(args, output_file)
        return _run_shard(args, output_file)


def _input_rows(args: EmbedArgs, path: str) -> tuple[int, ParquetTexts | None]:
    """(rows of the input, its Parquet reader when it is one)."""
    if is_parquet(args.input_file):
        source = ParquetTexts(path, args.text_column or "text", args.id_column)
        return source.rows, source
    return count_lines(path), None


def _run_shard(args: EmbedArgs, output_file: str) -> dict[str, Any]:
    assert args.input_file is not None
    digest = model_digest(args.model, args.backend)
    with readable_input(args.input_file) as path:
        total, _ = _input_rows(args, path)
    lines = shard_range(total, args.shard_index, args.num_shards)
    flags = {f"--{name}": getattr(args, name) for name in VECTOR_FLAGS}
    made = shard_manifest(args, lines, total, digest, flags)
    manifest = Path(output_file + MANIFEST_SUFFIX)
    old = read_shard_manifest(manifest, "--output_file") if manifest.is_file() else None
    if old is not None:
        for key in made:
            if old.get(key) != made[key]:
                flag, was, now = _first_difference(key, old.get(key), made[key])
                raise InputError(
                    f"{output_file} was made with {_flag_text(flag, was)}, this run has {_flag_text(flag, now)}: "
                    f"delete it and {manifest.name} to embed it again, or give another --output_file"
                )
        done = Path(output_file)
        if done.is_file() and done.stat().st_size == old.get("result", {}).get("bytes"):
            logger.info("%s is complete (%s): skipped", output_file, manifest.name)
            print_result("embed", f"shard {args.shard_index} of {args.num_shards}", f"complete in {output_file}")
            return {**old["result"]["summary"], "output_file": output_file, "skipped": True}
        manifest.unlink()  # its output is missing or cut short: made again below
    summary = _run(args, output_file)
    result = {"bytes": Path(output_file).stat().st_size, "summary": dict(summary)}
    with atomic_write(manifest) as f:
        json.dump({**made, "result": result}, f, indent=2)
    return summary


def model_digest(model: str, backend: str) -> str:
    """The digest that names the model a run embeds with: its weights' (`weights_digest`), or its ONNX files'
    bytes with --backend=onnx. Recorded by shard manifests and `bert index`, compared by `bert search --index`."""
    # Imported here, not at the top, so that bert.cli reports a flag error before torch loads (the digest
    # reads weights through bert.checkpoint).
    from bert.distillation import data_digest, weights_digest

    if backend == "onnx":
        path = Path(model)
        return data_digest(*(sorted(path.glob("*.onnx")) if path.is_dir() else [path]))
    return weights_digest(model)


def _flag_text(flag: str, value: Any) -> str:
    return f"no {flag}" if value is None else f"{flag}={value}"


def shard_manifest(args: EmbedArgs, lines: range, total: int, digest: str, flags: dict[str, Any]) -> dict[str, Any]:
    """What a shard's output holds and how it was made: the shard, its input rows, the input (name, rows,
    bytes), the model's weights digest and the flags that change its vectors."""
    assert args.input_file is not None
    source = {"name": Path(args.input_file).name, "rows": total, "bytes": os.path.getsize(args.input_file)}
    return {
        "shard": [args.shard_index, args.num_shards],
        "input_rows": [lines.start, lines.stop],
        "input_file": source,
        "model_digest": digest,
        "flags": flags,
    }


def read_shard_manifest(path: Path, flag: str) -> dict[str, Any]:
    """A shard's manifest (`shard_manifest`'s record and its result), each vector flag that it does not name
    (one newer than the bert that made the shard) at its default: what that bert did."""
    made = load_json_file(path, flag)
    if isinstance(made.get("flags"), dict):
        made["flags"] = {**VECTOR_FLAG_DEFAULTS, **made["flags"]}
    return made


def _first_difference(key: str, was: Any, now: Any) -> tuple[str, Any, Any]:
    """(flag, old value, new value) naming the first thing a shard's manifest and this run disagree on."""
    if key == "flags" and isinstance(was, dict):
        for flag in now:
            if was.get(flag) != now[flag]:
                return flag, was.get(flag), now[flag]
    if key == "model_digest":
        return "--model", f"weights {str(was)[:12]}", f"weights {str(now)[:12]}"
    return "--input_file", was, now


def _run(args: EmbedArgs, output_file: str | None) -> dict[str, Any]:
    settings = args.predictor_settings()
    # Imported here, not at the top, so that bert.cli reports a flag error before torch loads.
    from bert.inference import Predictor
    from bert.retrieval import quantized_shape

    predictor = Predictor.from_pretrained(args.model, max_seq_length=args.max_seq_length, **settings)
    pooling = "mean" if args.late_chunking else args.pooling or predictor.default_pooling
    normalize = predictor.default_normalize if args.normalize is None else args.normalize
    kind = _output_kind(args.output_file)
    check_dimensions(args.dimensions, predictor.config.hidden_size, name="--dimensions")
    dim = args.dimensions or predictor.config.hidden_size
    with readable_input(args.input_file) as path:
        count, source = _input_rows(args, path)
        lines = shard_range(count, args.shard_index, args.num_shards)
        total = len(lines)
        if args.similarity and total > MAX_SIMILARITY_LINES:
            raise InputError(
                f"--similarity outputs a {total} x {total} matrix; give at most {MAX_SIMILARITY_LINES} lines, or "
                "write the vectors (--output_file=x.npy) and compare them yourself"
            )
        (rows, cols), dtype = quantized_shape(total, dim, args.precision)
        if args.similarity:
            cols = total
        id_field = source.id_field if source is not None else None
        if args.late_chunking and kind == "parquet":  # DOCID#k, whatever the type of DOCID
            id_field = pyarrow()[0].field(args.id_column or "id", pyarrow()[0].string())
        with (
            output_file_or_stdout(output_file, "wb" if kind != "jsonl" else "w") as out,
            tempfile.TemporaryFile() as spill,
            contextlib.closing(_Rows(out, kind, (rows, cols), dtype, id_field, args.late_chunking)) as writer,
        ):
            embed = _embedder(args, predictor, pooling, normalize)
            ids: collections.deque[Any] = collections.deque()
            results = _embedded_chunks(args, path, source, lines, embed, ids)
            written, kept, ranges = _write_vectors(args, results, ids, lines, dim, writer, spill)
            if ranges is not None:
                _write_calibrated(args, source, lines, dim, spill, ranges, writer)
            if args.similarity:
                _write_similarity(kept, out, kind)
    if args.late_chunking:
        logger.info("late chunking: %d chunks of %d inputs", written, total)
    logger.info(
        "embedded %d lines (%s pooling%s, %s)", total, pooling, ", normalized" if normalize else "", args.precision
    )
    if args.output_file is not None:  # on stdout the lines themselves are the result
        what = (
            f"a {total} x {total} cosine similarity matrix"
            if args.similarity
            else f"{written} {args.precision} vectors of {dim}" + (f" ({total} inputs)" if args.late_chunking else "")
        )
        norm = ", normalized" if normalize else ""
        print_result("embed", f"{what} ({pooling} pooling{norm})", f"written to {output_file}")
    return {"lines": total, "dim": dim, "output_file": output_file, "pooling": pooling, "normalize": normalize}


def _embedder(
    args: EmbedArgs, predictor: Predictor, pooling: str, normalize: bool
) -> Callable[[list[str]], np.ndarray | list[LateChunks]]:
    """The vectors of a chunk of texts: one per text, or with --late_chunking each text's chunks."""
    splits = args.late_chunking and args.chunk_by != "tokens"
    sentences = make_sentence_splitter(args.chunk_by, "--chunk_by") if splits else None

    def embed(texts: list[str]) -> np.ndarray | list[LateChunks]:
        if args.late_chunking:
            return late_chunk_embeddings(
                predictor,
                texts,
                args.chunk_size or DEFAULT_CHUNK_TOKENS,
                normalize=normalize,
                chunk_overlap=args.chunk_overlap or 0,
                sentences=sentences,
                dimensions=args.dimensions,
                prompt_name=args.prompt_name,
                prompt=args.prompt,
                doc_stride=args.doc_stride,
            )
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

    return embed


def _embedded_chunks(
    args: EmbedArgs,
    path: str,
    source: ParquetTexts | None,
    lines: range,
    embed: Callable[[list[str]], Any],
    ids: collections.deque[Any],
) -> Iterator[Any]:
    """`embed`'s outputs for this shard's lines, a chunk at a time in input order; a Parquet input's id column
    of each chunk is appended to `ids` as its chunk is read."""
    # Imported here, not at the top, so that bert.cli reports a flag error before torch loads.
    from bert.inference import EMBEDDINGS
    from bert.input_lines import CHUNK_LINES, map_input_chunks, map_input_lines

    name = args.input_file or "<stdin>"
    desc = "embed" if args.input_file is not None else None
    if source is not None:

        def chunks() -> Iterator[tuple[range, list[str]]]:
            for first, texts, chunk_ids in source.chunks(lines, CHUNK_LINES):
                ids.append(chunk_ids)
                yield range(first, first + len(texts)), texts

        return map_input_chunks(chunks(), name, "row", embed, len(lines), desc)
    only = lines if args.num_shards > 1 else None
    return map_input_lines(path, name, EMBEDDINGS, embed, len(lines), desc, only)


def _write_vectors(
    args: EmbedArgs,
    results: Iterator[Any],
    ids: collections.deque[Any],
    lines: range,
    dim: int,
    writer: _Rows,
    spill: IO[bytes],
) -> tuple[int, list[np.ndarray], np.ndarray | None]:
    """Write each chunk's vectors as they come, except with --similarity (kept for the matrix: returned) and
    int8/uint8 (spilled as float32 to `spill` until the ranges of all are known: returned); and the number of
    vectors."""
    # Imported here, not at the top, so that bert.cli reports a flag error before torch loads.
    from bert.retrieval import Calibration, quantize_embeddings

    calibrate = args.precision in ("int8", "uint8")
    calibration = Calibration()
    kept = []
    written, documents = 0, iter(lines)
    for vectors in results:
        chunk_ids = ids.popleft() if ids else None
        spans = None
        if args.late_chunking:
            vectors, chunk_ids, spans = _chunk_rows(vectors, chunk_ids, documents, dim)
        written += len(vectors)
        if args.similarity:
            kept.append(vectors)
        elif calibrate:
            spill.write(np.ascontiguousarray(vectors, dtype="<f4").tobytes())
            calibration.add(vectors)
        else:
            writer.write(quantize_embeddings(vectors, args.precision), chunk_ids, spans)
    return written, kept, calibration.ranges() if calibrate and len(lines) else None


def _write_calibrated(
    args: EmbedArgs,
    source: ParquetTexts | None,
    lines: range,
    dim: int,
    spill: IO[bytes],
    ranges: np.ndarray,
    writer: _Rows,
) -> None:
    """int8/uint8: the spilled float32 vectors quantized with the ranges of all of them."""
    # Imported here, not at the top, so that bert.cli reports a flag error before torch loads.
    from bert.input_lines import CHUNK_LINES
    from bert.retrieval import quantize_embeddings

    total = len(lines)
    spill.seek(0)
    # The ids are read from the input again, in the batches it yields them in, rather than kept.
    if source is not None and source.id_column is not None:
        batches: Iterator[tuple[int, Any]] = ((len(a), a) for a in source.ids(lines, CHUNK_LINES))
    else:
        batches = ((min(CHUNK_LINES, total - s), None) for s in range(0, total, CHUNK_LINES))
    for n, chunk_ids in batches:
        chunk = np.frombuffer(spill.read(n * dim * 4), dtype="<f4").reshape(-1, dim)
        writer.write(quantize_embeddings(chunk, args.precision, ranges), chunk_ids)


def _write_similarity(kept: list[np.ndarray], out: IO, kind: str) -> None:
    """--similarity: the cosine matrix of every vector with every other."""
    # Imported here, not at the top, so that bert.cli reports a flag error before torch loads.
    from bert.inference import cosine_similarity

    matrix = cosine_similarity(np.concatenate(kept)) if kept else np.zeros((0, 0), np.float32)
    if kind == "npy":
        out.write(np.ascontiguousarray(matrix, dtype="<f4").tobytes())
    else:
        for row in matrix:
            out.write("\t".join(f"{x:.4f}" for x in row) + "\n")


def _chunk_rows(
    documents_chunks: list[LateChunks], chunk_ids: Any | None, documents: Iterator[int], dim: int
) -> tuple[np.ndarray, list[str], np.ndarray]:
    """--late_chunking: one row per chunk of each document, named DOCID#k, with its characters of the document."""
    # DOCID: the --id_column's value, else the input line or row (counted over the whole input)
    keys = chunk_ids.to_pylist() if chunk_ids is not None else list(itertools.islice(documents, len(documents_chunks)))
    names = [f"{key}#{k}" for key, doc in zip(keys, documents_chunks) for k in range(len(doc.spans))]
    if not documents_chunks:
        return np.zeros((0, dim), np.float32), names, np.zeros((0, 2), np.int64)
    vectors = np.concatenate([doc.vectors for doc in documents_chunks])
    return vectors, names, np.array([span for doc in documents_chunks for span in doc.spans], dtype=np.int64)
