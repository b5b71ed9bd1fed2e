"""Property tests of the readers: on any input, a reader parses it correctly or raises `InputError`.

Each reader gets well-formed files it must parse exactly (the generated content comes back), and the same
files damaged at random (bytes flipped, inserted, cut off, deleted) or made of arbitrary bytes or JSON
values, where the only allowed outcomes are a parse and `InputError` (never another exception: that would
reach the user as a traceback). Readers: delimited files (TSV, CSV) and JSON lines, CoNLL, SQuAD JSON,
TFRecord, plain and gzipped text, the WordPiece vocab and the model config, and the sentence-training files
(scored pairs as TSV and JSON lines, with or without a byte-order mark and a header; BEIR directories), whose
non-finite scores and non-text fields must be refused on their line.
"""

from __future__ import annotations

import gzip
import io
import json
import math
from pathlib import Path

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis", reason="the property tests need hypothesis (pip install '.[test]')")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from bert.config import BertConfig  # noqa: E402
from bert.errors import InputError  # noqa: E402
from bert.formats.tfrecord import TFRecordWriter, read_examples  # noqa: E402
from bert.sentence.data import read_beir, read_training_data  # noqa: E402
from bert.tasks.generic import GenericProcessor  # noqa: E402
from bert.tasks.glue import MrpcProcessor, read_rows  # noqa: E402
from bert.tasks.ner import read_conll  # noqa: E402
from bert.tasks.squad import read_squad_examples  # noqa: E402
from bert.tasks.squad_evaluate import evaluate_v1, evaluate_v2  # noqa: E402
from bert.tokenization import FullTokenizer, load_vocab, read_texts  # noqa: E402
from bert.utils import iter_lines, load_json_file  # noqa: E402

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

# Text without the characters that structure the files (tab, newline, carriage return, quotes).
plain = st.text(
    st.characters(
        blacklist_categories=("Cs", "Cc", "Zl", "Zp"), blacklist_characters='\t\r\n"\x0b\x0c\x1c\x1d\x1e\x85'
    ),
    min_size=1,
    max_size=12,
).filter(lambda s: s.strip() == s and s != "")


@st.composite
def damaged(draw, data: bytes) -> bytes:
    """`data` with a few random edits: a byte flipped, bytes inserted or deleted, or the end cut off."""
    out = bytearray(data)
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["flip", "insert", "delete", "cut"]))
        i = draw(st.integers(0, max(len(out) - 1, 0)))
        if kind == "flip" and out:
            out[i] ^= 1 << draw(st.integers(0, 7))
        elif kind == "insert":
            out[i:i] = draw(st.binary(min_size=1, max_size=4))
        elif kind == "delete" and out:
            del out[i : i + draw(st.integers(1, 4))]
        elif kind == "cut":
            del out[i:]
    return bytes(out)


def parses_or_input_error(read, *args, **kwargs):
    """Call the reader; `InputError` is an allowed outcome (returns None), any other exception fails."""
    try:
        return read(*args, **kwargs)
    except InputError as e:
        assert "\n" not in str(e), f"an error message spans lines: {e}"
        return None


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("readers")


# ------------------------------------------------------------------------------------- delimited files
rows_strategy = st.lists(st.tuples(plain, plain, st.sampled_from(["pos", "neg", "neutral"])), min_size=1, max_size=8)


@SETTINGS
@given(rows=rows_strategy, data=st.data())
def test_tsv_and_csv(work, rows, data):
    for suffix, sep in ((".tsv", "\t"), (".csv", ",")):
        if suffix == ".csv":
            rows = [tuple(f'"{c}"' if "," in c else c for c in row) for row in rows]
        text = "".join(sep.join(row) + "\n" for row in rows)
        path = work / f"train{suffix}"
        path.write_bytes(text.encode("utf-8"))
        processor = GenericProcessor(text_a_column=0, text_b_column=1, label_column=2, train_file=path.name)
        examples = processor.get_train_examples(work)
        unquote = (lambda c: c.strip('"')) if suffix == ".csv" else (lambda c: c)
        assert [(e.text_a, e.text_b, e.label) for e in examples] == [tuple(map(unquote, r)) for r in rows]
        path.write_bytes(data.draw(damaged(text.encode("utf-8"))))
        processor = GenericProcessor(text_a_column=0, text_b_column=1, label_column=2, train_file=path.name)
        parses_or_input_error(processor.get_train_examples, work)
        parses_or_input_error(lambda: list(read_rows(path, sep, None if suffix == ".tsv" else '"')))


@SETTINGS
@given(raw=st.binary(max_size=300))
def test_glue_task_files_from_arbitrary_bytes(work, raw):
    for name in ("train.tsv", "dev.tsv", "test.tsv"):
        (work / name).write_bytes(raw)
    processor = MrpcProcessor()
    for read in (processor.get_train_examples, processor.get_dev_examples, processor.get_test_examples):
        parses_or_input_error(read, work)


@SETTINGS
@given(records=st.lists(st.tuples(plain, st.sampled_from(["a", "b"])), min_size=1, max_size=6), data=st.data())
def test_json_lines(work, records, data):
    text = "".join(json.dumps({"text": t, "label": label}) + "\n" for t, label in records)
    path = work / "train.jsonl"
    path.write_bytes(text.encode("utf-8"))
    processor = GenericProcessor(text_a_column="text", label_column="label", train_file="train.jsonl")
    assert [(e.text_a, e.label) for e in processor.get_train_examples(work)] == records
    path.write_bytes(data.draw(damaged(text.encode("utf-8"))))
    processor = GenericProcessor(text_a_column="text", label_column="label", train_file="train.jsonl")
    parses_or_input_error(processor.get_train_examples, work)


# ----------------------------------------------------------------------------------------------- CoNLL
@SETTINGS
@given(
    sentences=st.lists(
        st.lists(
            st.tuples(plain.filter(lambda w: " " not in w and w != "-DOCSTART-"), st.sampled_from(["O", "B-PER"])),
            min_size=1,
            max_size=5,
        ),
        min_size=1,
        max_size=4,
    ),
    data=st.data(),
)
def test_conll(work, sentences, data):
    sentences = [[(w.split()[0], label) for w, label in s if w.split()] for s in sentences]
    sentences = [s for s in sentences if s]
    if not sentences:
        return
    text = "-DOCSTART- -X- -X- O\n\n" + "".join(
        "".join(f"{w} NN O {label}\n" for w, label in s) + "\n" for s in sentences
    )
    path = work / "train.txt"
    path.write_bytes(text.encode("utf-8"))
    examples = read_conll(path, "train")
    assert [list(zip(e.words, e.labels)) for e in examples] == sentences
    path.write_bytes(data.draw(damaged(text.encode("utf-8"))))
    parses_or_input_error(read_conll, path, "train")
    parses_or_input_error(read_conll, path, "train", num_columns=None, label_list=["O", "B-PER"])


# ------------------------------------------------------------------------------------------- SQuAD JSON
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(
        ["data", "paragraphs", "qas", "id", "question", "context", "answers", "text", "answer_start",
         "is_impossible", "title", "version", "x"]), inner, max_size=4),
    max_leaves=12,
)  # fmt: skip


def _squad(questions: list[tuple[str, str]]) -> dict:
    context = "the cat sat on the mat"
    qas = [
        {"id": qid, "question": q, "answers": [{"text": "cat", "answer_start": 4}], "is_impossible": False}
        for qid, q in questions
    ]
    return {"version": "1.1", "data": [{"title": "t", "paragraphs": [{"context": context, "qas": qas}]}]}


@SETTINGS
@given(
    questions=st.lists(st.tuples(plain, plain), min_size=1, max_size=4, unique_by=lambda q: q[0]),
    data=st.data(),
)
def test_squad_json(work, questions, data):
    path = work / "dev.json"
    raw = json.dumps(_squad(questions)).encode("utf-8")
    path.write_bytes(raw)
    for training in (False, True):
        examples = read_squad_examples(path, is_training=training, version_2_with_negative=training)
        assert [(e.qas_id, e.question_text) for e in examples] == questions
        if training:
            assert all(e.orig_answer_text == "cat" and e.start_position == 1 for e in examples)
    path.write_bytes(data.draw(damaged(raw)))
    for training in (False, True):
        parses_or_input_error(read_squad_examples, path, training, training)


@SETTINGS
@given(dataset=json_values, preds=json_values)
def test_squad_structures_and_evaluation(work, dataset, preds):
    path = work / "any.json"
    path.write_text(json.dumps({"version": "2.0", "data": dataset}))
    for training in (False, True):
        parses_or_input_error(read_squad_examples, path, training, training)
    if isinstance(preds, dict) and all(isinstance(v, str) for v in preds.values()):
        parses_or_input_error(evaluate_v1, dataset, preds, warn=lambda m: None)
        parses_or_input_error(evaluate_v2, dataset, preds, None, 1.0)


# --------------------------------------------------------------------------------------------- TFRecord
@SETTINGS
@given(
    records=st.lists(
        st.dictionaries(
            st.sampled_from(["input_ids", "input_mask", "masked_lm_weights"]),
            st.lists(st.integers(0, 2**31), min_size=1, max_size=5),
            min_size=1,
        ),
        min_size=1,
        max_size=4,
    ),
    data=st.data(),
)
def test_tfrecord(work, records, data):
    path = work / "data.tfrecord"
    with TFRecordWriter(path) as w:
        for r in records:
            w.write_example({k: np.array(v, dtype=np.int64) for k, v in r.items()})
    back = list(read_examples(path))
    assert [{k: v.tolist() for k, v in b.items()} for b in back] == records
    path.write_bytes(data.draw(damaged(path.read_bytes())))
    parses_or_input_error(lambda: list(read_examples(path)))
    parses_or_input_error(lambda: list(read_examples(path, verify_crc=False)))


# ----------------------------------------------------------------------------------- plain and gzipped text
@SETTINGS
@given(lines=st.lists(plain, min_size=1, max_size=8), data=st.data())
def test_text_and_gzip(work, lines, data):
    text = "".join(line + "\n" for line in lines).encode("utf-8")
    path = work / "corpus.txt.gz"
    path.write_bytes(gzip.compress(text))
    assert list(iter_lines(str(path))) == lines
    assert list(read_texts(io.BytesIO(text), "stdin")) == lines
    path.write_bytes(data.draw(damaged(gzip.compress(text))))
    parses_or_input_error(lambda: list(iter_lines(str(path))))
    json_gz = work / "dev.json.gz"
    json_gz.write_bytes(data.draw(damaged(gzip.compress(json.dumps({"data": lines}).encode()))))
    parses_or_input_error(load_json_file, json_gz, "SQuAD file")
    raw = data.draw(damaged(text))
    parses_or_input_error(lambda: list(read_texts(io.BytesIO(raw), "stdin")))


# ---------------------------------------------------------------------------------------- vocab, config
@SETTINGS
# "[UNK]" heads the file: a second one would be a duplicate, which maps to its later line (load_vocab's rule).
@given(tokens=st.lists(plain.filter(lambda t: t != "[UNK]"), min_size=1, max_size=10, unique=True), data=st.data())
def test_vocab(work, tokens, data):
    path = work / "vocab.txt"
    raw = ("\n".join(["[UNK]", *tokens]) + "\n").encode("utf-8")
    path.write_bytes(raw)
    assert list(load_vocab(path)) == ["[UNK]", *tokens]
    path.write_bytes(data.draw(st.one_of(damaged(raw), st.binary(max_size=60))))
    tokenizer = parses_or_input_error(FullTokenizer, path)
    if tokenizer is not None:
        parses_or_input_error(tokenizer.convert_tokens_to_ids, tokenizer.tokenize("the unknown words here"))
        parses_or_input_error(tokenizer.encode, "the unknown words here")


CONFIG = {"vocab_size": 99, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
          "intermediate_size": 37, "max_position_embeddings": 64, "type_vocab_size": 2}  # fmt: skip


@SETTINGS
@given(
    data=st.data(), extra=st.dictionaries(st.sampled_from(sorted(CONFIG) + ["hidden_act", "model_type"]), json_values)
)
def test_config(work, data, extra):
    path = work / "bert_config.json"
    raw = json.dumps(CONFIG).encode("utf-8")
    path.write_bytes(raw)
    config = BertConfig.from_json_file(path)
    assert {k: getattr(config, k) for k in CONFIG} == CONFIG
    path.write_bytes(data.draw(st.one_of(damaged(raw), st.binary(max_size=60))))
    parses_or_input_error(BertConfig.from_json_file, path)
    path.write_text(json.dumps({**CONFIG, **extra}))
    parses_or_input_error(BertConfig.from_json_file, path)


# ------------------------------------------------------------------------------- sentence-training files
@SETTINGS
@given(
    rows=st.lists(st.tuples(plain, plain, st.floats(width=64)), min_size=1, max_size=6),
    bom=st.booleans(),
    header=st.booleans(),
    data=st.data(),
)
def test_sentence_scored_pairs(work, rows, bom, header, data):
    """Scored pairs parse exactly (a BOM before a header changes nothing); a NaN or infinite score is one error
    naming its line, never a file read as triples."""
    bad = next((i for i, (_, _, score) in enumerate(rows) if not math.isfinite(score)), None)
    for suffix in (".tsv", ".jsonl"):
        if suffix == ".tsv":
            top = "sentence1\tsentence2\tscore\n" if header else ""
            text = top + "".join(f"{a}\t{b}\t{score!r}\n" for a, b, score in rows)
        else:
            top = ""
            text = "".join(json.dumps([a, b, score]) + "\n" for a, b, score in rows)
        path = work / f"scored{suffix}"
        raw = (("\ufeff" if bom else "") + text).encode("utf-8")
        path.write_bytes(raw)
        if bad is None:
            got = read_training_data(str(path))
            assert got.columns == [[a for a, _, _ in rows], [b for _, b, _ in rows]]
            assert got.scores == [score for _, _, score in rows]
        else:
            with pytest.raises(InputError, match=rf"{path.name}:{bad + 1 + bool(top)}: score .* not a finite number"):
                read_training_data(str(path))
        path.write_bytes(data.draw(st.one_of(damaged(raw), st.binary(max_size=200))))
        parses_or_input_error(read_training_data, str(path))


beir_texts = st.one_of(plain, st.integers(), st.none(), st.lists(plain, max_size=2), st.floats())


@SETTINGS
@given(queries=st.lists(beir_texts, min_size=1, max_size=5), titles=st.lists(beir_texts, min_size=1, max_size=5),
       data=st.data())  # fmt: skip
def test_beir_directory(work, queries, titles, data):
    """BEIR queries and documents whose text or title is not a string are refused on their line."""
    base = work / "beir"
    (base / "qrels").mkdir(parents=True, exist_ok=True)
    qrels = "query-id\tcorpus-id\tscore\n" + "".join(f"q{i}\td{i % len(titles)}\t1\n" for i in range(len(queries)))
    (base / "qrels" / "train.tsv").write_text(qrels)
    (base / "queries.jsonl").write_text("".join(json.dumps({"_id": f"q{i}", "text": t}) + "\n" for i, t in
                                                enumerate(queries)))  # fmt: skip
    corpus = "".join(json.dumps({"_id": f"d{i}", "title": t, "text": "x"}) + "\n" for i, t in enumerate(titles))
    (base / "corpus.jsonl").write_text(corpus)
    bad_query = next((i for i, t in enumerate(queries) if not isinstance(t, str)), None)
    bad_title = next((i for i, t in enumerate(titles) if t is not None and not isinstance(t, str)), None)
    if bad_query is not None:
        with pytest.raises(InputError, match=rf"queries.jsonl:{bad_query + 1}: \"text\" must be a string"):
            read_beir(str(base), "train")
    elif bad_title is not None:
        with pytest.raises(InputError, match=rf"corpus.jsonl:{bad_title + 1}: \"title\" must be a string"):
            read_beir(str(base), "train")
    else:
        corpus_read = read_beir(str(base), "train")
        assert corpus_read.queries == {f"q{i}": t for i, t in enumerate(queries)}
        named = titles[: len(queries)]  # the split holds the documents its qrels name: d0 .. d(queries - 1)
        assert all(corpus_read.documents[f"d{i}"] == (f"{t} x" if t else "x") for i, t in enumerate(named))
    (base / "corpus.jsonl").write_bytes(data.draw(st.one_of(damaged(corpus.encode()), st.binary(max_size=200))))
    parses_or_input_error(read_training_data, str(base))
