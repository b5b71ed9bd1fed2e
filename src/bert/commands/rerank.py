"""`bert rerank`: documents sorted by relevance to a query, one JSON line in, one out
(`bert.inference.Predictor.rank`).

A cross-encoder (a sequence-classification model with one output, such as `bert train-reranker`'s or a
sentence-transformers CrossEncoder) scores each (query, document) pair: the sigmoid of its logit, as
sentence-transformers' `CrossEncoder.predict` and TEI's /rerank. Any embedding model scores the cosine
similarity of the query's and the document's vectors. Input is read in chunks, so memory does not grow
with its length.
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass, field
from typing import Any

from bert.errors import InputError
from bert.flags import InferenceArgs
from bert.outputs import claim
from bert.request_rules import TOP_K_MINIMUM, best_first
from bert.utils import (
    count_lines,
    iter_lines,
    json_line,
    output_file_or_stdout,
    parse_json_line,
    print_result,
    progress,
    readable_input,
)

logger = logging.getLogger(__name__)


@dataclass
class RerankArgs(InferenceArgs):
    """Rerank documents for queries: per input line {"query": str, "documents": [str, ...]}, one output line
    [{"index", "score", "text"}, ...], best first (index: the document's place in "documents"). The ids of
    `bert search --output_format=rerank` are kept: with "corpus_ids" (one per document) each result has its
    "corpus_id"; with "query_id" the line is {"query_id", "results": [...]}, as `bert search`'s results."""

    model: str = field(
        metadata={
            "model": True,
            "help": "A cross-encoder (one-output sequence classifier) or an embedding model directory.",
        }
    )
    input_file: str | None = field(
        default=None, metadata={"help": 'JSON lines {"query", "documents": [...]} (.gz accepted); stdin if unset.'}
    )
    output_file: str | None = field(default=None, metadata={"help": "Output JSON-lines file; stdout if unset."})
    top_k: int | None = field(
        default=None, metadata={"help": "Keep the k best documents per query; default: all.", "min": TOP_K_MINIMUM}
    )
    raw_scores: bool = field(
        default=False, metadata={"help": "A cross-encoder's logits instead of their sigmoid (0 to 1)."}
    )


def _read_record(line: str, name: str, number: int) -> tuple[str, list[str], dict[str, Any]]:
    """(query, documents, the record's ids: "query_id" and "corpus_ids" where it has them)."""
    record = None
    try:
        record = parse_json_line(line)
    except ValueError:
        pass  # refused below, as any line that is not an object
    except InputError as e:
        raise InputError(f"{name} line {number}: {e}") from None
    if not isinstance(record, dict):
        raise InputError(f'{name} line {number}: expected a JSON object {{"query": ..., "documents": [...]}}')
    query, documents = record.get("query"), record.get("documents")
    if not isinstance(query, str) or not query.strip():
        raise InputError(f'{name} line {number}: field "query" must be a non-empty string')
    if not isinstance(documents, list) or not documents or not all(isinstance(d, str) for d in documents):
        raise InputError(f'{name} line {number}: field "documents" must be a non-empty list of strings')
    empty = next((i for i, d in enumerate(documents) if not d.strip()), None)
    if empty is not None:
        raise InputError(f"{name} line {number}: document {empty} is empty; give it some text or leave it out")
    ids = {k: record[k] for k in ("query_id", "corpus_ids") if k in record}
    corpus_ids = ids.get("corpus_ids")
    if corpus_ids is not None and (not isinstance(corpus_ids, list) or len(corpus_ids) != len(documents)):
        raise InputError(
            f'{name} line {number}: field "corpus_ids" must be a list of one id per document ({len(documents)})'
        )
    return query, documents, ids


def run_rerank(args: RerankArgs) -> dict[str, Any]:
    """Rerank every input line; returns {"lines", "documents", "output_file"}."""
    inputs = {"--input_file": args.input_file, "--model": args.model}
    with claim("rerank", files={"--output_file": args.output_file}, inputs=inputs):
        return _run(args)


def _run(args: RerankArgs) -> dict[str, Any]:
    settings = args.predictor_settings()
    # Imported here, not at the top, so that bert.cli reports a flag error before torch loads.
    from bert.inference import LONGER_ADVICE, Predictor

    predictor = Predictor.from_pretrained(args.model, max_seq_length=args.max_seq_length, **settings)
    if args.raw_scores and not predictor.is_cross_encoder:
        raise InputError(f"--raw_scores applies to cross-encoders; --model={args.model} scores by cosine similarity")
    name = args.input_file or "<stdin>"
    lines = documents = 0
    scorer = _Scorer(predictor, args.raw_scores)
    with readable_input(args.input_file) as path:
        total = count_lines(path)
        desc = "rerank" if args.input_file is not None else None
        with (
            output_file_or_stdout(args.output_file) as out,
            progress(total=total, unit="line", desc=desc, disable=desc is None) as bar,
            predictor.counting_truncations(LONGER_ADVICE),
        ):
            numbered = enumerate(iter_lines(path, "utf-8-sig", "strict", hint=None, name=name), start=1)
            for block in iter(lambda: list(itertools.islice(numbered, BLOCK_LINES)), []):
                records = [_read_record(line, name, number) for number, line in block]
                for (_, docs, ids), scores in zip(records, scorer.scores([(q, d) for q, d, _ in records])):
                    order = best_first(scores, args.top_k)
                    corpus_ids = ids.get("corpus_ids")
                    results: Any = [
                        {
                            **({"corpus_id": corpus_ids[i]} if corpus_ids else {}),
                            "index": i,
                            "score": scores[i],
                            "text": docs[i],
                        }
                        for i in order
                    ]
                    if "query_id" in ids:
                        results = {"query_id": ids["query_id"], "results": results}
                    out.write(json_line(results) + "\n")
                    documents += len(docs)
                lines += len(block)
                bar.update(len(block))
    logger.info("reranked %d documents for %d queries with %s", documents, lines, args.model)
    if args.output_file is not None:  # on stdout the lines themselves are the result
        print_result("rerank", f"{documents} documents ranked for {lines} queries", f"written to {args.output_file}")
    return {"lines": lines, "documents": documents, "output_file": args.output_file}


# Lines read and scored together: an embedding model embeds the distinct texts of a block in one call.
BLOCK_LINES = 64


class _Scorer:
    """Each line's document scores, as `Predictor.run_rank` gives them: a cross-encoder's per pair; an embedding
    model's as the cosine of vectors computed once per distinct text (`UnitVectorCache`, across lines), not once
    per pair."""

    def __init__(self, predictor: Any, raw_scores: bool) -> None:
        from bert.inference import UnitVectorCache  # torch's side: not imported before a flag error is reported

        self.predictor = predictor
        self.raw_scores = raw_scores
        self.vectors = None if predictor.is_cross_encoder else UnitVectorCache(predictor)

    def scores(self, records: list[tuple[str, list[str]]]) -> list[list[float]]:
        prepared = [self.predictor.prepare_rank(query, docs) for query, docs in records]  # each line's errors
        if self.vectors is None:
            return [self.predictor.run_rank(p, raw_scores=self.raw_scores) for p in prepared]
        return [[float(d @ query) for d in documents] for query, *documents in self.vectors(prepared)]
