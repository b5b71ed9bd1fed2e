"""`bert search`: the top-k documents of a corpus for each query, by the cosine similarity of their
embeddings (`bert.retrieval.TopK`: exact, the corpus read in chunks), or through a FAISS index that `bert index`
built (`--index`, `bert.vector_index`).

The corpus vectors come from `bert embed --output_file=x.npy` over the same corpus file
(`--corpus_embeddings`), or are embedded here, chunk by chunk; the queries are embedded here with the same
model. Either way memory holds one chunk of the corpus, the query vectors and each query's running top k.
With --index the index answers (in memory as a whole) and its manifest's model digest must be the query model's.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from bert.commands.embed import EmbedArgs, model_digest
from bert.errors import InputError
from bert.flags import InferenceArgs, same_as
from bert.formats.embeddings import open_embeddings
from bert.input_lines import InputItemError
from bert.outputs import claim
from bert.request_rules import TOP_K_MINIMUM
from bert.utils import json_line, output_file_or_stdout, print_result, progress, readable_input
from bert.vector_index import (
    DEFAULT_EF_SEARCH,
    DEFAULT_NPROBE,
    DEFAULT_RESCORE_MULTIPLIER,
    VectorIndex,
    is_binary,
    open_index,
)

if TYPE_CHECKING:
    from bert.inference import Predictor

logger = logging.getLogger(__name__)

OUTPUT_FORMATS = ("results", "rerank")


@dataclass
class SearchArgs(InferenceArgs):
    """Search a corpus: for each query, the --top_k most similar documents.

    --corpus and --queries hold one text per line: plain text, JSON lines {"text"}, or BEIR's corpus.jsonl
    and queries.jsonl ({"_id", "title", "text"}; a title goes before its text). Output, one JSON line per
    query: {"query_id", "results": [{"corpus_id", "index", "score"}, ...]} best first, "index" the
    document's 0-based record in --corpus and ids "_id" (else the record's index); with
    --output_format=rerank, {"query_id", "query", "corpus_ids", "documents": [text, ...]}, the input of
    `bert rerank`.

    --index=DIR searches the FAISS index `bert index --output_dir=DIR` built instead (ids from the index;
    --corpus only for --output_format=rerank's texts); the index's vectors must come from --model. An index of
    binary vectors is searched with the queries' sign bits and its --rescore_multiplier x --top_k nearest
    rescored with the float queries (scores: the cosine of the query with a document's bits as +1/-1).
    """

    model: str = field(
        metadata={"model": True, "help": "The embedding model directory (sentence-transformers dirs too)."}
    )
    queries: str = field(metadata={"help": "The queries: plain text, JSON lines or BEIR queries.jsonl (.gz too)."})
    corpus: str | None = field(
        default=None, metadata={"help": "The documents: plain text, JSON lines or BEIR corpus.jsonl (.gz too)."}
    )
    corpus_embeddings: str | None = field(
        default=None,
        metadata={
            "help": "The corpus vectors as `bert embed --output_file=x.npy` wrote them from --corpus with the same "
            "model (float32, one row per record), or its shards x-0000i-of-0000N.npy (--num_shards) when x.npy "
            "is not there; default: embed the corpus here."
        },
    )
    index: str | None = field(
        default=None,
        metadata={"help": "A `bert index` directory to search through instead of the exact search (the default)."},
    )
    nprobe: int | None = field(
        default=None,
        metadata={
            "positive": True,
            "help": f"Inverted lists an ivf_flat/ivf_pq --index visits per query (more: better recall, slower); "
            f"default {DEFAULT_NPROBE}, at most its nlist; nlist gives the exact search's results with ivf_flat.",
        },
    )
    ef_search: int | None = field(
        default=None,
        metadata={
            "positive": True,
            "help": f"Candidates an hnsw --index keeps per query (more: better recall, slower); default "
            f"{DEFAULT_EF_SEARCH} or --top_k if more.",
        },
    )
    rescore_multiplier: int | None = field(
        default=None,
        metadata={
            "positive": True,
            "help": "An --index of binary vectors (bert embed --precision=ubinary) finds this many x --top_k "
            "candidates by Hamming distance, then ranks them by the float query against their +1/-1 bits; default "
            f"{DEFAULT_RESCORE_MULTIPLIER}.",
        },
    )
    output_file: str | None = field(default=None, metadata={"help": "Output JSON-lines file; stdout if unset."})
    top_k: int = field(default=10, metadata={"help": "Documents per query.", "min": TOP_K_MINIMUM})
    output_format: str = field(
        default="results",
        metadata={
            "help": "results (ids and scores) or rerank (the query and its documents' texts, best first: the "
            "input of bert rerank).",
            "choices": list(OUTPUT_FORMATS),
        },
    )
    chunk_size: int = field(
        default=10000, metadata={"help": "Corpus documents scored at a time (memory: chunk x queries block)."}
    )
    query_prompt_name: str | None = field(
        default=None, metadata={"help": "The model's prompt for queries (config_sentence_transformers.json)."}
    )
    corpus_prompt_name: str | None = field(
        default=None, metadata={"help": "The model's prompt for documents (config_sentence_transformers.json)."}
    )
    # The corpus vectors of --corpus_embeddings must have been written with the same N (checked below).
    dimensions: int | None = same_as(EmbedArgs, "dimensions")


def _embed(
    predictor: Predictor, texts: list[str], prompt_name: str | None, dimensions: int | None, name: str, first: int
) -> np.ndarray:
    try:
        return predictor.embed(texts, prompt_name=prompt_name, dimensions=dimensions)
    except InputItemError as e:
        raise InputError(f"{name} record {first + e.index + 1}: {e.reason}") from None


def _chunks(items: list, size: int):
    for start in range(0, len(items), size):
        yield start, items[start : start + size]


def run_search(args: SearchArgs) -> dict[str, Any]:
    """Search the corpus for every query; returns {"queries", "documents", "output_file"}."""
    inputs = {
        "--corpus": args.corpus,
        "--queries": args.queries,
        "--corpus_embeddings": args.corpus_embeddings,
        "--index": args.index,
        "--model": args.model,
    }
    with claim("search", files={"--output_file": args.output_file}, inputs=inputs):
        return _run(args)


def _run(args: SearchArgs) -> dict[str, Any]:
    if args.output_format not in OUTPUT_FORMATS:
        raise InputError(f"--output_format={args.output_format} must be one of {', '.join(OUTPUT_FORMATS)}")
    if args.chunk_size < 1:
        raise InputError(f"--chunk_size={args.chunk_size} must be at least 1")
    if args.corpus_embeddings is not None and args.corpus_prompt_name is not None:
        raise InputError("--corpus_prompt_name applies when the corpus is embedded here; drop --corpus_embeddings")
    _check_index_flags(args)
    settings = args.predictor_settings()
    # Imported here, not at the top, so that bert.cli reports a flag error before torch loads.
    from bert.inference import Predictor
    from bert.retrieval import read_texts

    index = _open_index(args) if args.index is not None else None
    predictor = Predictor.from_pretrained(args.model, max_seq_length=args.max_seq_length, **settings)
    with readable_input(args.queries, "--queries") as path:
        queries = list(read_texts(path, args.queries))
    if not queries:
        raise InputError(f"--queries={args.queries} holds no queries; give one per line")
    parts = []
    with progress(total=len(queries), unit="query", desc="search: queries") as bar:
        for start, block in _chunks(queries, args.chunk_size):
            block_texts = [t for _, t in block]
            parts.append(_embed(predictor, block_texts, args.query_prompt_name, args.dimensions, args.queries, start))
            bar.update(len(block))
    vectors = np.concatenate(parts)
    if index is not None:
        return _search_index(args, index, queries, vectors)
    found, corpus_ids = _search_corpus(args, predictor, vectors)
    texts = _texts(args, {row for hits in found for row, _ in hits}) if args.output_format == "rerank" else {}
    _write(args, queries, found, corpus_ids, texts)
    logger.info("searched %d documents for %d queries with %s", len(corpus_ids), len(queries), args.model)
    if args.output_file is not None:  # on stdout the lines themselves are the result
        found_what = f"the top {args.top_k} of {len(corpus_ids)} documents for {len(queries)} queries"
        print_result("search", found_what, f"written to {args.output_file}")
    return {"queries": len(queries), "documents": len(corpus_ids), "output_file": args.output_file}


def _search_corpus(
    args: SearchArgs, predictor: Predictor, vectors: np.ndarray
) -> tuple[list[list[tuple[int, float]]], list[str]]:
    """The exact search: each query's top --top_k rows of --corpus (embedded here, or its
    --corpus_embeddings), read a chunk at a time; (the hits, the corpus's ids)."""
    # Imported here, not at the top, so that bert.cli reports a flag error before torch loads.
    from bert.retrieval import TopK, read_texts

    assert args.corpus is not None  # _check_index_flags: the exact search reads it
    top = TopK(vectors, args.top_k)
    corpus_ids: list[str] = []
    stored = None
    if args.corpus_embeddings is not None:
        stored = open_embeddings(args.corpus_embeddings, f"--corpus_embeddings={args.corpus_embeddings}")
        if stored.dims != vectors.shape[1]:
            raise InputError(
                f"--corpus_embeddings={args.corpus_embeddings} holds {stored.dims}-dimensional vectors, the queries "
                f"{vectors.shape[1]}; embed the corpus with the same model and --dimensions"
            )
    with readable_input(args.corpus, "--corpus") as path, progress(unit="doc", desc="search: corpus") as bar:
        records = read_texts(path, args.corpus)
        while chunk := list(itertools.islice(records, args.chunk_size)):
            start = len(corpus_ids)
            corpus_ids += [i for i, _ in chunk]
            if stored is None:
                chunk_texts = [t for _, t in chunk]
                top.add(_embed(predictor, chunk_texts, args.corpus_prompt_name, args.dimensions, args.corpus, start))
            elif len(corpus_ids) <= len(stored):
                top.add(stored.rows(start, len(corpus_ids)))
            bar.update(len(chunk))
    if stored is not None and len(stored) != len(corpus_ids):
        raise InputError(
            f"--corpus_embeddings={args.corpus_embeddings} has {len(stored)} rows for {len(corpus_ids)} records of "
            f"--corpus={args.corpus}; embed that corpus file with bert embed"
        )
    if not corpus_ids:
        raise InputError(f"--corpus={args.corpus} holds no documents; give one per line")
    return top.result(), corpus_ids


def _texts(args: SearchArgs, wanted: set[int]) -> dict[int, str]:
    """The texts of the corpus rows `wanted`: a pass over --corpus that keeps only those."""
    # Imported here, not at the top, so that bert.cli reports a flag error before torch loads.
    from bert.retrieval import read_texts

    assert args.corpus is not None
    with readable_input(args.corpus, "--corpus") as path:
        texts = {row: text for row, (_, text) in enumerate(read_texts(path, args.corpus)) if row in wanted}
    if len(texts) < len(wanted):
        raise InputError(
            f"--corpus={args.corpus} has no record {min(wanted - texts.keys()) + 1}, which --index={args.index} "
            "found; give the corpus file the index was built from"
        )
    return texts


def _write(
    args: SearchArgs,
    queries: list[tuple[str, str]],
    found: list[list[tuple[int, float]]],
    corpus_ids: Sequence[Any] | Mapping[int, Any],
    texts: dict[int, str],
) -> None:
    """One JSON line per query (the class docstring's two formats) into --output_file or stdout."""
    with output_file_or_stdout(args.output_file) as out:
        for (query_id, query), hits in zip(queries, found):
            record: dict[str, Any]
            if args.output_format == "rerank":
                ids, docs = [corpus_ids[row] for row, _ in hits], [texts[row] for row, _ in hits]
                record = {"query_id": query_id, "query": query, "corpus_ids": ids, "documents": docs}
            else:
                results = [{"corpus_id": corpus_ids[row], "index": row, "score": score} for row, score in hits]
                record = {"query_id": query_id, "results": results}
            out.write(json_line(record) + "\n")


def _check_index_flags(args: SearchArgs) -> None:
    """The flags that go with --index, and those that go without it."""
    if args.index is None:
        if args.corpus is None:
            raise InputError("give --corpus, the documents to search (or --index, a bert index directory)")
        for flag, value in (
            ("--nprobe", args.nprobe),
            ("--ef_search", args.ef_search),
            ("--rescore_multiplier", args.rescore_multiplier),
        ):
            if value is not None:
                raise InputError(f"{flag} tunes a search through --index; give --index=DIR, or drop {flag}")
        return
    if args.corpus_embeddings is not None or args.corpus_prompt_name is not None:
        raise InputError("--index holds the corpus vectors; drop --corpus_embeddings and --corpus_prompt_name")
    if args.output_format == "rerank" and args.corpus is None:
        raise InputError("--output_format=rerank writes the documents' texts: give --corpus, the indexed corpus file")
    if args.output_format != "rerank" and args.corpus is not None:
        raise InputError(
            "--corpus is read with --index only for --output_format=rerank (the ids are the index's); drop --corpus"
        )


def _open_index(args: SearchArgs) -> VectorIndex:
    """The --index directory, checked against the query model: the digest of the model that embedded its vectors
    must be --model's."""
    assert args.index is not None
    index = open_index(args.index, f"--index={args.index}")
    digest = model_digest(args.model, args.backend)
    if index.manifest["model_digest"] != digest:
        raise InputError(
            f"--index={args.index} holds vectors of the model with weights {str(index.manifest['model_digest'])[:12]}, "
            f"--model={args.model} has weights {digest[:12]}; search with the model that embedded the corpus"
        )
    return index


def _search_index(
    args: SearchArgs, index: VectorIndex, queries: list[tuple[str, str]], vectors: np.ndarray
) -> dict[str, Any]:
    if not is_binary(index.precision) and vectors.shape[1] != index.manifest["dims"]:
        raise InputError(
            f"--index={args.index} holds {index.manifest['dims']}-dimensional vectors, the queries {vectors.shape[1]}; "
            "search with the --dimensions the corpus was embedded with"
        )
    found = index.search(vectors, args.top_k, args.nprobe, args.ef_search, args.rescore_multiplier)
    rows = {row for hits in found for row, _ in hits}
    texts = _texts(args, rows) if args.output_format == "rerank" else {}
    _write(args, queries, found, index.ids(rows), texts)
    documents = int(index.manifest["rows"])
    logger.info("searched %s (%d documents) for %d queries with %s", args.index, documents, len(queries), args.model)
    if args.output_file is not None:
        found_what = (
            f"the top {args.top_k} of {documents} documents ({index.index_type} index) for {len(queries)} queries"
        )
        print_result("search", found_what, f"written to {args.output_file}")
    return {"queries": len(queries), "documents": documents, "output_file": args.output_file}
