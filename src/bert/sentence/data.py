"""Training and evaluation data for sentence-embedding models and rerankers (no torch).

Training files (`--train_file`), one example a line:
- JSON lines: a list of texts `["anchor", "positive", "negative", ...]`, a list of two texts and a number
  `["text", "text", 0.8]` (a scored pair), or an object with `anchor` (or `query`), `positive` and optional
  `negative` / `negatives` (a text or a list), or with `sentence1`, `sentence2` and `score`;
- TSV: the same columns, tab separated: two or more texts, or two texts and a number (scored pairs when the
  first line's third and last column spells a number). A first line naming its columns (`sentence1`,
  `sentence2`, `score` as GLUE's STS-B, or `anchor`, `positive`, `negative...`) is a header: the columns
  are then taken by name, the others ignored;
- a BEIR directory (`corpus.jsonl`, `queries.jsonl`, `qrels/<split>.tsv`): one (query, document) pair for
  every qrels line with a positive score; a document's text is its title and text joined by a space.

Every line must have the same shape; files are UTF-8, a byte-order mark ignored; a score must be a finite
number and a BEIR `text` or `title` a string, or the line is refused. Evaluation files (`--eval_file`):
scored pairs (STS) or a BEIR directory whose `--eval_split` qrels are searched in the documents that split
names.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bert.errors import InputError
from bert.utils import as_number, finite_number, head, iter_lines, parse_json_line

PAIRS, TUPLES, SCORED, TEXTS = "pairs", "tuples", "scored pairs", "texts"  # TEXTS: one column


@dataclass
class TrainingData:
    """Examples as columns of texts: `columns[0]` the anchors, `columns[1]` the positives (or second texts),
    `columns[2:]` hard negatives; `scores` for scored pairs."""

    source: str
    columns: list[list[str]]
    scores: list[float] | None = None

    @property
    def kind(self) -> str:
        if self.scores is not None:
            return SCORED
        return {1: TEXTS, 2: PAIRS}.get(len(self.columns), TUPLES)

    def __len__(self) -> int:
        return len(self.columns[0])

    def example(self, i: int) -> list[str]:
        return [c[i] for c in self.columns]

    def head(self, limit: int) -> TrainingData:
        """The first `limit` examples (`bert.utils.head`: 0 keeps all)."""
        scores = None if self.scores is None else head(self.scores, limit)
        return TrainingData(self.source, [head(c, limit) for c in self.columns], scores)


@dataclass
class Corpus:
    """A BEIR directory's split: queries, documents and the relevant documents of each query."""

    source: str
    queries: dict[str, str]  # id -> text, the queries of the split
    documents: dict[str, str]  # id -> text ("title text")
    qrels: dict[str, dict[str, float]] = field(default_factory=dict)  # query id -> {document id: score > 0}

    def head(self, limit: int) -> Corpus:
        """The first `limit` queries (`bert.utils.head`: 0 keeps all), searched among the same documents: fewer
        queries, the same task."""
        kept = head(list(self.queries), limit)
        return Corpus(self.source, {q: self.queries[q] for q in kept}, self.documents, {q: self.qrels[q] for q in kept})


def _line_error(path: str, n: int, what: str) -> InputError:
    return InputError(f"{path}:{n}: {what}")


def _lines(path: str) -> Iterator[tuple[int, str]]:
    """(line number, line) of a UTF-8 file, a byte-order mark dropped (a header must be recognised after it)."""
    return enumerate(iter_lines(path, "utf-8-sig", hint=None), 1)


def _json(line: str, path: str, n: int) -> Any:
    try:
        return parse_json_line(line)
    except json.JSONDecodeError as e:
        raise _line_error(path, n, f"not valid JSON ({e.msg})") from None
    except InputError as e:
        raise _line_error(path, n, str(e)) from None


def _json_example(obj, path: str, n: int) -> tuple[list[str], float | None]:
    where = f"{path}:{n}"
    if isinstance(obj, list):
        # A JSON number third (NaN and 1e999 too, refused by finite_number) makes a scored pair.
        if len(obj) == 3 and isinstance(obj[2], (int, float)) and not isinstance(obj[2], bool):
            texts, score = obj[:2], finite_number(obj[2], where)
        else:
            texts, score = obj, None
    elif isinstance(obj, dict):
        if "sentence1" in obj or "score" in obj:
            texts = [obj.get("sentence1"), obj.get("sentence2")]
            score = obj.get("score")
            if isinstance(score, str) or as_number(score) is None:
                raise _line_error(path, n, 'a scored pair needs "sentence1", "sentence2" and a numeric "score"')
            score = finite_number(score, where)
        else:
            negatives = obj.get("negatives", obj.get("negative", []))
            negatives = [negatives] if isinstance(negatives, str) else negatives
            if not isinstance(negatives, list):
                raise _line_error(path, n, '"negatives" must be a text or a list of texts')
            texts, score = [obj.get("anchor", obj.get("query")), obj.get("positive"), *negatives], None
    else:
        raise _line_error(path, n, "expected a JSON list or object")
    if len(texts) < 2 or not all(isinstance(t, str) and t.strip() for t in texts):
        raise _line_error(
            path,
            n,
            'expected two or more non-empty texts (["anchor", "positive", ...], {"anchor", "positive"}, or '
            '{"sentence1", "sentence2", "score"})',
        )
    return texts, score


def _tsv_rows(path: str) -> tuple[list[tuple[int, list[str]]], dict[str, int] | None]:
    rows = [(n, line.rstrip("\r").split("\t")) for n, line in _lines(path) if line.strip()]
    if not rows:
        raise InputError(f"{path}: no examples; give one example a line")
    header = rows[0][1]
    names = {name.strip().lower(): i for i, name in enumerate(header)}
    if {"sentence1", "sentence2"} <= names.keys() or {"anchor", "positive"} <= names.keys():
        return rows[1:], names
    return rows, None


def _tsv_examples(path: str) -> list[tuple[int, list[str], float | None]]:
    rows, names = _tsv_rows(path)
    out = []
    if names is not None:
        text_cols = [names[k] for k in ("sentence1", "sentence2") if k in names]
        if not text_cols:
            text_cols = [names["anchor"], names["positive"]]
            text_cols += [i for name, i in sorted(names.items(), key=lambda x: x[1]) if name.startswith("negative")]
        score_col = names.get("score")
        for n, cells in rows:
            if len(cells) <= max(text_cols + [score_col or 0]):
                raise _line_error(path, n, f"{len(cells)} columns, fewer than the header names")
            score = None if score_col is None else finite_number(cells[score_col], f"{path}:{n}")
            out.append((n, [cells[i] for i in text_cols], score))
        return out
    # The first line sets the layout, as a header would: two texts and a number make the file scored pairs, and
    # every line must then be one. A "nan" (or a text) where a score belongs is refused on its line, never
    # taken for a text that turns the whole file into triples.
    first_n, first = rows[0]
    if not (len(first) == 3 and as_number(first[2]) is not None):
        return [(n, cells, None) for n, cells in rows]
    for n, cells in rows:
        if len(cells) != 3 or as_number(cells[2]) is None:
            raise _line_error(
                path,
                n,
                f"not a scored pair (text, text, score) as line {first_n} is; give every line a score, or name the "
                "columns of texts in a header (anchor, positive, negative)",
            )
        out.append((n, cells[:2], finite_number(cells[2], f"{path}:{n}")))
    return out


def read_training_data(path: str, split: str = "train") -> TrainingData:
    """The examples of a training file or BEIR directory (see the module docstring); `split` names the
    qrels file of a BEIR directory."""
    p = Path(path)
    if p.is_dir():
        corpus = read_beir(path, split)
        anchors, positives = [], []
        for qid, docs in corpus.qrels.items():
            for did in docs:
                anchors.append(corpus.queries[qid])
                positives.append(corpus.documents[did])
        return TrainingData(path, [anchors, positives])
    if not p.is_file():
        raise InputError(f"{path}: no such file or directory; pass a .jsonl or .tsv file, or a BEIR directory")
    if path.endswith((".jsonl", ".jsonl.gz", ".json")):
        examples = []
        for n, line in _lines(path):
            if line.strip():
                examples.append((n, *_json_example(_json(line, path, n), path, n)))
    elif path.endswith((".tsv", ".tsv.gz", ".txt")):
        examples = _tsv_examples(path)
    else:
        raise InputError(f"{path}: unknown file type; name it .jsonl or .tsv (or pass a BEIR directory)")
    if not examples:
        raise InputError(f"{path}: no examples; give one example a line")
    first_n, first, first_score = examples[0]
    width, scored = len(first), first_score is not None
    for n, texts, score in examples:
        if len(texts) != width or (score is not None) != scored:
            raise _line_error(
                path,
                n,
                f"{len(texts)} texts{' and a score' if score is not None else ''}, but line {first_n} has "
                f"{width}{' and a score' if scored else ''}; every example must have the same shape",
            )
        if not all(t.strip() for t in texts):
            raise _line_error(path, n, "an empty text; remove the line or fill it in")
    columns = [[texts[c] for _, texts, _ in examples] for c in range(width)]
    scores = [float(s) for _, _, s in examples] if scored else None  # type: ignore[arg-type]
    return TrainingData(path, columns, scores)


def _read_jsonl_texts(path: Path, with_title: bool) -> dict[str, str]:
    if not path.is_file():
        raise InputError(f"{path} is missing; a BEIR directory holds corpus.jsonl, queries.jsonl and qrels/")
    out = {}
    first_line: dict[str, int] = {}
    for n, line in _lines(str(path)):
        if not line.strip():
            continue
        obj = _json(line, str(path), n)
        key = obj.get("_id") if isinstance(obj, dict) else None
        if not isinstance(obj, dict) or isinstance(key, bool) or not isinstance(key, (str, int)) or "text" not in obj:
            raise _line_error(str(path), n, 'expected {"_id": ..., "text": ...}')
        # Two records of one id (7 and "7" are one id to the qrels) leave no way to tell which text is meant.
        if first_line.setdefault(str(key), n) != n:
            raise _line_error(
                str(path), n, f"_id {str(key)!r} again (first on line {first_line[str(key)]}); ids are unique"
            )
        # A number, null or list is no text (it was once trained on as its str()).
        text, title = obj["text"], obj.get("title") if with_title else None
        if not isinstance(text, str):
            raise _line_error(str(path), n, f'"text" must be a string, not {_json_type(text)}')
        if title is not None and not isinstance(title, str):
            raise _line_error(str(path), n, f'"title" must be a string, not {_json_type(title)}')
        out[str(key)] = f"{title} {text}".strip() if title else text
    return out


def _json_type(value: Any) -> str:
    return {type(None): "null", bool: "a boolean", list: "a list", dict: "an object"}.get(type(value), "a number")


def read_beir(path: str, split: str) -> Corpus:
    """A BEIR directory's `split`: its queries, every document its qrels name, and the qrels (score > 0)."""
    base = Path(path)
    qrels_file = base / "qrels" / f"{split}.tsv"
    if not qrels_file.is_file():
        raise InputError(f"{qrels_file} is missing; pass a BEIR directory with qrels/{split}.tsv")
    qrels: dict[str, dict[str, float]] = {}
    named: set[str] = set()
    for n, line in _lines(str(qrels_file)):
        cells = line.rstrip("\r").split("\t")
        if n == 1 and cells[0] == "query-id" or not line.strip():
            continue
        if len(cells) != 3:
            raise _line_error(str(qrels_file), n, "expected query-id <tab> corpus-id <tab> score")
        score = finite_number(cells[2], f"{qrels_file}:{n}")
        named.add(cells[1])
        if score > 0:
            qrels.setdefault(cells[0], {})[cells[1]] = score
    queries = _read_jsonl_texts(base / "queries.jsonl", with_title=False)
    documents = _read_jsonl_texts(base / "corpus.jsonl", with_title=True)
    for qid, docs in qrels.items():
        if qid not in queries:
            raise InputError(f"{qrels_file}: query {qid} is not in {base / 'queries.jsonl'}")
    # Every document the qrels name is kept (a score-0 one is still a document of the split), so each must exist.
    for did in sorted(named):
        if did not in documents:
            raise InputError(f"{qrels_file}: document {did} is not in {base / 'corpus.jsonl'}")
    if not qrels:
        raise InputError(f"{qrels_file}: no query has a relevant document (score > 0)")
    return Corpus(
        path,
        {q: queries[q] for q in qrels},
        {d: documents[d] for d in sorted(named)},
        qrels,
    )


def unique_texts(columns: Sequence[Sequence[str]]) -> tuple[list[str], list[np.ndarray]]:
    """The distinct texts of `columns` and, per column, each row's index into them (every text is
    tokenized once)."""
    index: dict[str, int] = {}
    ids = [np.array([index.setdefault(t, len(index)) for t in col], dtype=np.int64) for col in columns]
    return list(index), ids
