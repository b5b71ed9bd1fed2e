"""bert.tasks.squad: reading SQuAD, doc-stride features and n-best post-processing (`run_squad.py`).

Hand-made examples use a tiny vocabulary in which every test word is one piece, so window offsets and
logit positions can be worked out by hand; the real dev sets check the reader and an "oracle" run end to
end (gold positions as logits -> predictions.json -> official v1.1 score).
"""

import collections
import copy
import gzip
import json
import logging
import math

import numpy as np
import pytest

from bert.errors import InputError
from bert.tasks import squad
from bert.tasks.squad import (
    FIRST_UNIQUE_ID,
    NO_NON_NULL_SCORE_DIFF,
    DocSpan,
    RawResult,
    SquadExample,
    convert_examples_to_features,
    get_final_text,
    read_squad_examples,
    squad_examples_from_json,
    write_predictions,
)
from bert.tasks.squad_evaluate import evaluate_v1
from bert.tokenization import FullTokenizer
from conftest import shared_path

SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def tiny_tokenizer(words, do_lower_case=True):
    vocab = {t: i for i, t in enumerate(SPECIAL + sorted(set(words)))}
    return FullTokenizer(vocab, do_lower_case=do_lower_case)


def load_gz(path):
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return json.load(f)


def write_json(tmp_path, obj, name="data.json"):
    path = tmp_path / name
    path.write_text(json.dumps(obj), encoding="utf-8")
    return path


def one_paragraph(context, qas, title="T"):
    return {"version": "1.1", "data": [{"title": title, "paragraphs": [{"context": context, "qas": qas}]}]}


def numbered_example(n, qas_id="q", start=None, end=None):
    """A context of n one-piece words a0 .. a{n-1} and the one-piece question "q"."""
    words = [f"a{i}" for i in range(n)]
    ex = SquadExample(qas_id=qas_id, question_text="q", doc_tokens=words)
    if start is not None:
        ex.start_position, ex.end_position = start, end
        ex.orig_answer_text = " ".join(words[start : end + 1])
    return ex, tiny_tokenizer(words + ["q"])


# --------------------------------------------------------------------------------------------------
# read_squad_examples


def test_dev_v11_questions_per_article():
    path = shared_path("data", "squad", "dev-v1.1.json.gz")
    data = load_gz(path)["data"]
    examples = read_squad_examples(path, is_training=False)
    assert len(data) == 48 and len(examples) == 10570
    expected = [qa["id"] for article in data for p in article["paragraphs"] for qa in p["qas"]]
    assert [e.qas_id for e in examples] == expected
    article_of = {qa["id"]: a for a, art in enumerate(data) for p in art["paragraphs"] for qa in p["qas"]}
    counts = collections.Counter(article_of[e.qas_id] for e in examples)
    assert [counts[a] for a in range(len(data))] == [sum(len(p["qas"]) for p in art["paragraphs"]) for art in data]
    first = examples[0]
    context = data[0]["paragraphs"][0]["context"]
    assert first.doc_tokens == context.split() and first.question_text == data[0]["paragraphs"][0]["qas"][0]["question"]
    assert first.start_position is None and first.orig_answer_text is None and not first.is_impossible


def _first_answer_only(dataset):
    dataset = copy.deepcopy(dataset)
    for article in dataset["data"]:
        for p in article["paragraphs"]:
            for qa in p["qas"]:
                qa["answers"] = qa["answers"][:1]
    return dataset


def test_dev_v20_is_impossible_counts():
    path = shared_path("data", "squad", "dev-v2.0.json.gz")
    dataset = load_gz(path)
    # Prediction mode reads no answers and keeps every question.
    assert len(read_squad_examples(path, is_training=False, version_2_with_negative=True)) == 11873
    first = {"data": dataset["data"][:1]}
    gold = [qa for p in first["data"][0]["paragraphs"] for qa in p["qas"]]
    n_impossible = sum(qa["is_impossible"] for qa in gold)
    assert 0 < n_impossible < len(gold)
    # Dev files have several answers per question; training mode needs one.
    with pytest.raises(InputError, match="exactly 1 answer"):
        squad_examples_from_json(first, is_training=True, version_2_with_negative=True)
    examples = squad_examples_from_json(_first_answer_only(first), is_training=True, version_2_with_negative=True)
    impossible = [e for e in examples if e.is_impossible]
    assert len(impossible) == n_impossible
    assert all(e.start_position == e.end_position == -1 and e.orig_answer_text == "" for e in impossible)
    possible = [e for e in examples if not e.is_impossible]
    assert all(0 <= e.start_position <= e.end_position < len(e.doc_tokens) for e in possible)
    # The positions span the answer text (run_squad.py's check before keeping a training example).
    for e in possible:
        assert " ".join(e.orig_answer_text.split()) in " ".join(e.doc_tokens[e.start_position : e.end_position + 1])
    # Over the whole file, impossible questions are never skipped.
    all_examples = squad_examples_from_json(_first_answer_only(dataset), is_training=True, version_2_with_negative=True)
    assert sum(e.is_impossible for e in all_examples) == 5945


def test_whitespace_rule_and_answer_words(tmp_path):
    # U+202F splits words; U+00A0 (also a Unicode space) does not, as in the original.
    context = "  Foo\u202fbar baz\u00a0qux\tend."
    qas = [
        {"id": "q1", "question": "?", "answers": [{"text": "Foo\u202fbar", "answer_start": 2}]},
        {"id": "q2", "question": "?", "answers": [{"text": "end.", "answer_start": 18}]},
        # The answer text is normalised with str.split(), which does split on U+00A0, so "baz qux" is not
        # found in the word "baz\u00a0qux": skipped, as the original does.
        {"id": "q3", "question": "?", "answers": [{"text": "baz\u00a0qux", "answer_start": 10}]},
    ]
    path = write_json(tmp_path, one_paragraph(context, qas))
    ex1, ex2 = read_squad_examples(path, is_training=True)
    assert ex1.doc_tokens == ["Foo", "bar", "baz\u00a0qux", "end."]
    assert (ex1.start_position, ex1.end_position, ex1.orig_answer_text) == (0, 1, "Foo\u202fbar")
    assert (ex2.qas_id, ex2.start_position, ex2.end_position) == ("q2", 3, 3)
    # An answer starting on the leading whitespace maps to word -1 and cannot be recovered: skipped.
    qas = [{"id": "q2", "question": "?", "answers": [{"text": " Foo", "answer_start": 1}]}]
    assert read_squad_examples(write_json(tmp_path, one_paragraph(context, qas)), is_training=True) == []


def test_unrecoverable_answer_is_skipped_with_warning(tmp_path, caplog):
    context = "The cat sat on the mat."
    qas = [
        {"id": "ok", "question": "Who sat?", "answers": [{"text": "cat", "answer_start": 4}]},
        {"id": "bad", "question": "Where?", "answers": [{"text": "rug", "answer_start": 19}]},
        # Whitespace in the answer is normalised before the comparison.
        {"id": "ws", "question": "What?", "answers": [{"text": "cat  sat", "answer_start": 4}]},
    ]
    path = write_json(tmp_path, one_paragraph(context, qas))
    with caplog.at_level(logging.WARNING, logger="bert.tasks.squad"):
        examples = read_squad_examples(path, is_training=True)
    assert [e.qas_id for e in examples] == ["ok", "ws"]
    assert "Could not find answer: 'mat.' vs. 'rug'" in caplog.text
    assert "skipped 1 of 3 questions" in caplog.text
    # Prediction mode keeps every question and ignores the answers.
    assert len(read_squad_examples(path, is_training=False)) == 3


def test_v2_impossible_and_prediction_mode(tmp_path):
    qas = [
        {"id": "p", "question": "?", "is_impossible": False, "answers": [{"text": "b", "answer_start": 2}]},
        {"id": "i", "question": "?", "is_impossible": True, "answers": []},
    ]
    path = write_json(tmp_path, one_paragraph("a b c", qas))
    p, i = read_squad_examples(path, is_training=True, version_2_with_negative=True)
    assert (p.start_position, p.end_position, p.is_impossible) == (1, 1, False)
    assert (i.start_position, i.end_position, i.orig_answer_text, i.is_impossible) == (-1, -1, "", True)
    # As the original, prediction mode does not read is_impossible.
    assert [e.is_impossible for e in read_squad_examples(path, False, True)] == [False, False]


@pytest.mark.parametrize(
    "mutate, training, match",
    [
        (lambda d: d.pop("data"), False, r'no "data" list'),
        (lambda d: d["data"][0].pop("paragraphs"), False, r"article 0 \('T'\) has no \"paragraphs\""),
        (lambda d: d["data"][0]["paragraphs"][0].pop("context"), False, r'paragraph 0 has no "context"'),
        (lambda d: d["data"][0]["paragraphs"][0].pop("qas"), False, r'paragraph 0 has no "qas"'),
        (lambda d: d["data"][0]["paragraphs"][0]["qas"][0].pop("id"), False, r'question 0 has no string "id"'),
        (lambda d: d["data"][0]["paragraphs"][0]["qas"][0].pop("question"), False, r'question q1 has no "question"'),
        (lambda d: d["data"][0]["paragraphs"][0]["qas"][0].pop("answers"), True, r'question q1 has no "answers"'),
        (
            lambda d: d["data"][0]["paragraphs"][0]["qas"][0]["answers"][0].update(answer_start=99),
            True,
            r"question q1: answer_start 99",
        ),
        (
            lambda d: d["data"][0]["paragraphs"][0]["qas"][0]["answers"][0].pop("answer_start"),
            True,
            r'question q1: the answer has no integer "answer_start"',
        ),
        (
            lambda d: d["data"][0]["paragraphs"][0]["qas"][0]["answers"][0].pop("text"),
            True,
            r'question q1: the answer has no "text" string',
        ),
    ],
)
def test_missing_fields_are_input_errors(tmp_path, mutate, training, match):
    data = one_paragraph("a b c", [{"id": "q1", "question": "?", "answers": [{"text": "b", "answer_start": 2}]}])
    mutate(data)
    path = write_json(tmp_path, data)
    with pytest.raises(InputError, match=match) as info:
        read_squad_examples(path, is_training=training)
    assert str(path) in str(info.value) and "\n" not in str(info.value)


def test_missing_is_impossible_in_v2_training(tmp_path):
    path = write_json(tmp_path, one_paragraph("a b", [{"id": "q1", "question": "?", "answers": []}]))
    with pytest.raises(InputError, match=r'q1 has no boolean "is_impossible"'):
        read_squad_examples(path, is_training=True, version_2_with_negative=True)


def test_missing_or_bad_file(tmp_path):
    with pytest.raises(InputError, match="nope.json: no such file"):
        read_squad_examples(tmp_path / "nope.json", is_training=False)
    bad = tmp_path / "bad.json"
    bad.write_text("{not json", encoding="utf-8")
    with pytest.raises(InputError, match=r"bad\.json:1: not valid JSON \(.*column 2\); fix the file") as info:
        read_squad_examples(bad, is_training=False)
    assert str(bad) in str(info.value)


# --------------------------------------------------------------------------------------------------
# convert_examples_to_features


def test_doc_stride_windows_and_max_context():
    ex, tok = numbered_example(20)
    # max_tokens_for_doc = 14 - 1 - 3 = 10; windows start 0, 4, 8, 12 (the last one is 8 pieces long).
    feats = convert_examples_to_features(
        [ex], tok, max_seq_length=14, doc_stride=4, max_query_length=8, is_training=False
    )
    assert [f.doc_span_index for f in feats] == [0, 1, 2, 3]
    assert [f.unique_id for f in feats] == [FIRST_UNIQUE_ID + i for i in range(4)]
    assert all(f.example_index == 0 for f in feats)
    starts = [f.token_to_orig_map[3] for f in feats]
    lengths = [len(f.token_to_orig_map) for f in feats]
    assert starts == [0, 4, 8, 12] and lengths == [10, 10, 10, 8]
    assert squad.doc_spans_for(20, 10, 4) == [DocSpan(0, 10), DocSpan(4, 10), DocSpan(8, 10), DocSpan(12, 8)]

    f0, f1 = feats[0], feats[1]
    assert f0.tokens == ["[CLS]", "q", "[SEP]"] + [f"a{i}" for i in range(10)] + ["[SEP]"]
    assert f0.segment_ids == [0, 0, 0] + [1] * 11
    # Word 6: window 0 has min(6, 3) = 3 pieces of context, window 1 min(2, 7) = 2 -> window 0.
    # Word 7: window 0 min(7, 2) = 2, window 1 min(3, 6) = 3 -> window 1.
    assert f0.token_is_max_context[3 + 6] is True and f1.token_is_max_context[3 + 2] is False
    assert f0.token_is_max_context[3 + 7] is False and f1.token_is_max_context[3 + 3] is True
    # Every word is max-context in exactly one window.
    owners = collections.Counter(
        f.token_to_orig_map[pos] for f in feats for pos, is_max in f.token_is_max_context.items() if is_max
    )
    assert owners == collections.Counter(range(20))


def test_max_context_length_bonus():
    # Windows of 300 pieces, stride 200, over 320 pieces: [0, 300) and [200, 320) (120 long). Piece 250 has
    # min(250, 49) = 49 pieces of context in the first and min(50, 69) = 50 in the second, but the length
    # bonus 0.01 * 300 = 3.0 vs 1.2 gives the first the higher score (52.0 vs 51.2).
    spans = squad.doc_spans_for(320, 300, 200)
    assert spans == [DocSpan(0, 300), DocSpan(200, 120)]
    assert squad._check_is_max_context(spans, 0, 250) and not squad._check_is_max_context(spans, 1, 250)
    # One piece further the second window has 2 more pieces of context and wins.
    assert squad._check_is_max_context(spans, 1, 251) and not squad._check_is_max_context(spans, 0, 251)
    ex, tok = numbered_example(320)
    f0, f1 = convert_examples_to_features([ex], tok, 304, 200, 64, is_training=False)
    assert f0.token_to_orig_map[3 + 250] == 250 and f0.token_is_max_context[3 + 250] is True
    assert f1.token_to_orig_map[3 + 50] == 250 and f1.token_is_max_context[3 + 50] is False
    # Equal scores (piece 3: min(3, 2) + 0.06 in both windows): the first window wins.
    tied = [DocSpan(0, 6), DocSpan(1, 6)]
    assert squad._check_is_max_context(tied, 0, 3) and not squad._check_is_max_context(tied, 1, 3)


def test_improve_answer_span_1895_1943():
    context = "The leader was John Smith (1895-1943)."
    words = ["the", "leader", "was", "john", "smith", "(", "1895", "-", "1943", ")", ".", "what", "year", "born", "?"]
    tok = tiny_tokenizer(words)
    ex = SquadExample("q", "What year was John Smith born?", context.split(" "), "1895", 5, 5)
    (feat,) = convert_examples_to_features([ex], tok, 64, 16, 16, is_training=True)
    assert feat.tokens[feat.start_position : feat.end_position + 1] == ["1895"]
    # Without the improvement the span would be the whole word "(1895-1943)." = 6 pieces.
    doc = tok.tokenize(context)
    assert squad._improve_answer_span(doc, 5, 10, tok, "1895") == (6, 6)
    assert squad._improve_answer_span(doc, 5, 10, tok, "1895-1943") == (6, 8)
    # No sub-span spells the answer: the input span is kept.
    assert squad._improve_answer_span(doc, 5, 10, tok, "1896") == (5, 10)


def test_training_labels_inside_and_outside_windows():
    ex, tok = numbered_example(20, start=9, end=10)
    feats = convert_examples_to_features([ex], tok, 14, 4, 8, is_training=True)
    # Windows [0,10), [4,14), [8,18), [12,20): the answer (pieces 9-10) is whole only in windows 1 and 2.
    labels = [(f.start_position, f.end_position) for f in feats]
    assert labels == [(0, 0), (3 + 5, 3 + 6), (3 + 1, 3 + 2), (0, 0)]
    for f, (s, e) in zip(feats, labels):
        if s:
            assert f.tokens[s : e + 1] == ["a9", "a10"]
    # v2 impossible questions: (0, 0) in every window.
    imp = SquadExample("i", "q", ex.doc_tokens, "", -1, -1, is_impossible=True)
    assert {(f.start_position, f.end_position) for f in convert_examples_to_features([imp], tok, 14, 4, 8, True)} == {
        (0, 0)
    }
    # Prediction mode: no labels.
    assert all(f.start_position is None for f in convert_examples_to_features([ex], tok, 14, 4, 8, False))


def test_query_truncation_padding_and_unpadded_features():
    words = ["a", "b", "c", "d", "x", "y"]
    tok = tiny_tokenizer(words)
    examples = [SquadExample("q1", "a b c d", ["x", "y"]), SquadExample("q2", "a", ["x", "y", "x"])]
    padded = convert_examples_to_features(examples, tok, 12, 4, max_query_length=2, is_training=False)
    assert padded[0].tokens == ["[CLS]", "a", "b", "[SEP]", "x", "y", "[SEP]"]
    assert padded[0].input_ids == tok.convert_tokens_to_ids(padded[0].tokens) + [0] * 5
    assert padded[0].input_mask == [1] * 7 + [0] * 5 and padded[0].segment_ids == [0] * 4 + [1] * 3 + [0] * 5
    assert [(f.unique_id, f.example_index) for f in padded] == [(FIRST_UNIQUE_ID, 0), (FIRST_UNIQUE_ID + 1, 1)]
    unpadded = convert_examples_to_features(examples, tok, 12, 4, 2, is_training=False, pad_to_max_length=False)
    for p, u in zip(padded, unpadded):
        n = len(u.tokens)
        assert u.unique_id == p.unique_id and u.tokens == p.tokens and u.token_to_orig_map == p.token_to_orig_map
        assert (u.input_ids, u.input_mask, u.segment_ids) == (p.input_ids[:n], p.input_mask[:n], p.segment_ids[:n])
    seen = []
    assert convert_examples_to_features(examples, tok, 12, 4, 2, False, output_fn=seen.append) is None
    assert seen == padded
    with pytest.raises(InputError, match="max_query_length"):
        convert_examples_to_features(examples, tok, 5, 4, 2, False)
    with pytest.raises(InputError, match="doc_stride=0 must be at least 1"):
        convert_examples_to_features(examples, tok, 12, 0, 2, False)
    with pytest.raises(InputError, match="doc_stride=0 must be at least 1"):
        squad.doc_spans_for(10, 4, 0)


def test_features_of_the_first_20_examples_are_logged(caplog):
    ex, tok = numbered_example(3, start=1, end=1)
    impossible = SquadExample("i", "q", ex.doc_tokens, "", -1, -1, is_impossible=True)
    examples = [ex, impossible] + [ex] * 19  # one feature each
    with caplog.at_level(logging.INFO, logger="bert.tasks.squad"):
        convert_examples_to_features(examples, tok, 8, 4, 2, is_training=True)
    lines = [r.getMessage() for r in caplog.records if r.name == "bert.tasks.squad"]
    # The original's lines, field by field; ids: [CLS]=2, [SEP]=3, a0..a2=5..7, q=8.
    assert lines[:13] == [
        "*** Example ***",
        f"unique_id: {FIRST_UNIQUE_ID}",
        "example_index: 0",
        "doc_span_index: 0",
        "tokens: [CLS] q [SEP] a0 a1 a2 [SEP]",
        "token_to_orig_map: 3:0 4:1 5:2",
        "token_is_max_context: 3:True 4:True 5:True",
        "input_ids: 2 8 3 5 6 7 3 0",
        "input_mask: 1 1 1 1 1 1 1 0",
        "segment_ids: 0 0 0 1 1 1 1 0",
        "start_position: 4",
        "end_position: 4",
        "answer: a1",
    ]
    assert lines[13:24] == ["*** Example ***", f"unique_id: {FIRST_UNIQUE_ID + 1}"] + lines[15:23] + [
        "impossible example"
    ]
    # Only the first 20 examples: the 21st feature is not logged.
    assert lines.count("*** Example ***") == 20 and lines[-12] == f"unique_id: {FIRST_UNIQUE_ID + 19}"
    caplog.clear()
    convert_examples_to_features(examples, tok, 8, 4, 2, is_training=False)
    assert caplog.records == []  # the default WARNING level logs nothing


# --------------------------------------------------------------------------------------------------
# get_final_text


def test_get_final_text_cases(caplog):
    # The original's own example: the possessive is dropped from the span.
    assert get_final_text("steve smith", "Steve Smith's", True) == "Steve Smith"
    assert get_final_text("Steve Smith", "Steve Smith's", False) == "Steve Smith"
    # Punctuation split off by the tokenizer is projected back through the character alignment.
    assert get_final_text("1895", "(1895-1943).", True) == "1895"
    assert get_final_text("1895 - 1943", "(1895-1943).", True) == "1895-1943"
    # A precomposed accent is stripped to one character: the lengths agree, the accent is kept.
    assert get_final_text("cafe", "Caf\u00e9.", True) == "Caf\u00e9"
    with caplog.at_level(logging.INFO, logger="bert.tasks.squad"):
        # A decomposed accent loses its combining mark: lengths differ -> the whole original text.
        assert get_final_text("cafe", "Cafe\u0301.", True, verbose_logging=True) == "Cafe\u0301."
        assert "Length not equal after stripping spaces" in caplog.text
        # A zero-width space (a control character to the tokenizer) is removed: same fallback.
        assert get_final_text("ab", "a\u200bb!", True, verbose_logging=True) == "a\u200bb!"
        # Not found (cased prediction against uncased tokenization): the original text.
        assert get_final_text("Steve", "Steve Smith's", True, verbose_logging=True) == "Steve Smith's"
        assert "Unable to find text: 'Steve' in 'Steve Smith's'" in caplog.text
    caplog.clear()
    get_final_text("Steve", "Steve Smith's", True)
    assert caplog.text == ""

    # A prediction that starts or ends on a space has no character to map to.
    with caplog.at_level(logging.INFO, logger="bert.tasks.squad"):
        assert get_final_text(" b", "a b", True, verbose_logging=True) == "a b"
        assert caplog.messages == ["Couldn't map start position"]
        caplog.clear()
        assert get_final_text("a ", "a b", True, verbose_logging=True) == "a b"
        assert caplog.messages == ["Couldn't map end position"]


# --------------------------------------------------------------------------------------------------
# write_predictions

FOX = "The quick brown fox jumps over the lazy dog."
FOX_WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", ".", "who", "?"]


def fox_setup(qas_id="fox"):
    tok = tiny_tokenizer(FOX_WORDS)
    ex = SquadExample(qas_id, "Who jumps?", FOX.split(" "))
    (feat,) = convert_examples_to_features([ex], tok, 20, 8, 8, is_training=False)
    # [CLS] who jumps ? [SEP] the quick brown fox jumps over the lazy dog . [SEP] + 4 padding
    assert feat.tokens[6] == "quick" and feat.tokens[12] == "lazy" and feat.tokens[13] == "dog"
    return ex, feat


def logits(n, values, base=0.0):
    out = [base] * n
    for i, v in values.items():
        out[i] = v
    return out


def run_predictions(tmp_path, examples, features, results, v2=False, **kw):
    args = dict(n_best_size=3, max_answer_length=30, do_lower_case=True, null_score_diff_threshold=0.0)
    args.update(kw)
    files = [tmp_path / "predictions.json", tmp_path / "nbest_predictions.json", tmp_path / "null_odds.json"]
    preds = write_predictions(
        examples,
        features,
        results,
        args["n_best_size"],
        args["max_answer_length"],
        args["do_lower_case"],
        *files,
        version_2_with_negative=v2,
        null_score_diff_threshold=args["null_score_diff_threshold"],
    )
    loaded = [json.loads(f.read_text(encoding="utf-8")) if f.exists() else None for f in files]
    return preds, *loaded


def test_nbest_order_probabilities_and_file_format(tmp_path):
    ex, feat = fox_setup()
    # Best starts: 2 ("jumps" in the question, invalid), 6 "quick", 12 "lazy"; best ends: 15 ([SEP],
    # invalid), 8 "fox", 13 "dog". Valid pairs: (6, 8) = 10, (6, 13) = 8, (12, 13) = 7; (12, 8) is reversed.
    start = logits(20, {2: 10.0, 6: 5.0, 12: 4.0}, base=-1.0)
    end = logits(20, {15: 9.0, 8: 5.0, 13: 3.0}, base=-1.0)
    preds, pred_file, nbest_file, odds_file = run_predictions(
        tmp_path, [ex], [feat], [RawResult(feat.unique_id, start, end)]
    )
    assert preds == {"fox": "quick brown fox"} and pred_file == preds and odds_file is None
    nbest = nbest_file["fox"]
    # "dog." is projected back to "dog" by get_final_text.
    assert [e["text"] for e in nbest] == ["quick brown fox", "quick brown fox jumps over the lazy dog", "lazy dog"]
    z = math.exp(0) + math.exp(-2) + math.exp(-3)
    assert [e["probability"] for e in nbest] == pytest.approx([1 / z, math.exp(-2) / z, math.exp(-3) / z], abs=1e-12)
    assert [(e["start_logit"], e["end_logit"]) for e in nbest] == [(5.0, 5.0), (5.0, 3.0), (4.0, 3.0)]
    assert list(nbest[0]) == ["text", "probability", "start_logit", "end_logit"]
    text = (tmp_path / "nbest_predictions.json").read_text(encoding="utf-8")
    assert text == json.dumps(nbest_file, indent=4) + "\n"
    assert (tmp_path / "predictions.json").read_text(encoding="utf-8") == '{\n    "fox": "quick brown fox"\n}\n'

    # float32 arrays (what a model returns) give the same lists, as plain floats.
    arrays = [RawResult(feat.unique_id, np.array(start, np.float32), np.array(end, np.float32))]
    assert run_predictions(tmp_path, [ex], [feat], arrays)[2] == nbest_file

    # max_answer_length 3 drops the 8-piece span.
    preds, _, nbest_file, _ = run_predictions(
        tmp_path, [ex], [feat], [RawResult(feat.unique_id, start, end)], max_answer_length=3
    )
    assert [e["text"] for e in nbest_file["fox"]] == ["quick brown fox", "lazy dog"]


def test_duplicate_final_texts_are_merged(tmp_path):
    # "Cafe\u0301." (decomposed accent) cannot be aligned with its pieces `cafe .`, so every span inside
    # it falls back to the whole word: the spans (4, 5), (4, 4), (5, 5) all give the same text, and the
    # spans (3, 5) and (3, 4) both give "x Cafe\u0301.". Only the first (best) of each is kept; the span
    # (3, 3) is the word "x" alone.
    tok = tiny_tokenizer(["cafe", ".", "x", "q"])
    ex = SquadExample("c", "q", ["x", "Cafe\u0301."])
    (feat,) = convert_examples_to_features([ex], tok, 8, 8, 2, is_training=False)
    assert feat.tokens == ["[CLS]", "q", "[SEP]", "x", "cafe", ".", "[SEP]"]
    start = logits(8, {4: 5.0, 5: 4.0, 3: 1.0}, -9.0)
    end = logits(8, {5: 5.0, 4: 4.0, 3: 1.0}, -9.0)
    preds, _, nbest_file, _ = run_predictions(tmp_path, [ex], [feat], [RawResult(feat.unique_id, start, end)])
    nbest = [(e["text"], e["start_logit"], e["end_logit"]) for e in nbest_file["c"]]
    assert nbest == [("Cafe\u0301.", 5.0, 5.0), ("x Cafe\u0301.", 1.0, 5.0), ("x", 1.0, 1.0)]
    assert preds == {"c": "Cafe\u0301."}


def test_verbose_logging_explains_unprojected_answers(caplog):
    # The decomposed accent of "Cafe\u0301." defeats the character alignment (see above); with
    # verbose_logging the post-processing says why, once per span whose text falls back to the whole word.
    tok = tiny_tokenizer(["cafe", ".", "x", "q"])
    ex = SquadExample("c", "q", ["x", "Cafe\u0301."])
    (feat,) = convert_examples_to_features([ex], tok, 8, 8, 2, is_training=False)
    result = RawResult(feat.unique_id, logits(8, {4: 5.0}, -9.0), logits(8, {5: 5.0}, -9.0))
    with caplog.at_level(logging.INFO, logger="bert.tasks.squad"):
        quiet = squad.compute_predictions([ex], [feat], [result], 1, 30, True)
        assert caplog.messages == []
        loud = squad.compute_predictions([ex], [feat], [result], 1, 30, True, verbose_logging=True)
    assert caplog.messages == ["Length not equal after stripping spaces: 'Cafe\u0301.' vs 'cafe.'"]
    assert quiet == loud and loud.predictions == {"c": "Cafe\u0301."}


def test_max_context_filter_checks_the_start_only(tmp_path):
    ex, tok = numbered_example(20)
    feats = convert_examples_to_features([ex], tok, 14, 4, 8, is_training=False)
    f0, f1 = feats[:2]
    # In window 0, word 7 (position 10) is not max-context: spans starting there are dropped, even with
    # the best scores; the same span from window 1 (positions 6-7) is kept. Spans from word 5 (max-context
    # in window 0) to words 7 or 8 are kept though their ends are not max-context there.
    results = [
        RawResult(f0.unique_id, logits(14, {10: 9.0, 8: 3.0}, -9.0), logits(14, {11: 9.0, 10: 3.0}, -9.0)),
        RawResult(f1.unique_id, logits(14, {6: 2.0}, -9.0), logits(14, {7: 2.0}, -9.0)),
    ] + [RawResult(f.unique_id, [-9.0] * 14, [-9.0] * 14) for f in feats[2:]]
    preds, _, nbest_file, _ = run_predictions(tmp_path, [ex], feats, results, n_best_size=3)
    texts = [(e["text"], e["start_logit"], e["end_logit"]) for e in nbest_file["q"]]
    assert texts == [("a5 a6 a7 a8", 3.0, 9.0), ("a5 a6 a7", 3.0, 3.0), ("a7 a8", 2.0, 2.0)]
    assert preds["q"] == "a5 a6 a7 a8"


def test_v2_null_decision_and_null_odds(tmp_path):
    ex, feat = fox_setup()
    start = logits(20, {0: 3.0, 6: 5.0}, -5.0)
    end = logits(20, {0: 3.0, 8: 5.0}, -5.0)
    result = [RawResult(feat.unique_id, start, end)]
    # score_null = 6, best non-null = 10: diff = -4.
    preds, _, nbest_file, odds = run_predictions(
        tmp_path, [ex], [feat], result, v2=True, null_score_diff_threshold=-5.0
    )
    assert preds == {"fox": ""} and odds == {"fox": -4.0}
    preds, _, _, odds = run_predictions(tmp_path, [ex], [feat], result, v2=True, null_score_diff_threshold=-3.0)
    assert preds == {"fox": "quick brown fox"} and odds == {"fox": -4.0}
    preds, *_ = run_predictions(tmp_path, [ex], [feat], result, v2=True, null_score_diff_threshold=-4.0)
    assert preds == {"fox": "quick brown fox"}  # strictly greater than the threshold to answer ""
    texts = [e["text"] for e in nbest_file["fox"]]
    assert texts[0] == "quick brown fox" and texts.count("") == 1


def test_v2_null_answer_wins(tmp_path):
    ex, feat = fox_setup()
    # The null score 6 + 6 = 12 beats the only valid span (6, 8) "quick brown fox", 5 + 5 = 10. The best
    # logits of all are at padding positions (18, 19), which are never a span.
    start = logits(20, {0: 6.0, 6: 5.0, 18: 9.0}, -5.0)
    end = logits(20, {0: 6.0, 8: 5.0, 19: 9.0}, -5.0)
    result = [RawResult(feat.unique_id, start, end)]
    preds, pred_file, nbest_file, odds = run_predictions(tmp_path, [ex], [feat], result, v2=True)
    assert preds == pred_file == {"fox": ""} and odds == {"fox": 2.0}
    z = 1 + math.exp(-2)
    assert nbest_file["fox"] == [
        {"text": "", "probability": pytest.approx(1 / z, abs=1e-12), "start_logit": 6.0, "end_logit": 6.0},
        {
            "text": "quick brown fox",
            "probability": pytest.approx(math.exp(-2) / z, abs=1e-12),
            "start_logit": 5.0,
            "end_logit": 5.0,
        },
    ]
    # A threshold of 2.0 is not exceeded: the best span answers, with the same null_odds.
    preds, _, _, odds = run_predictions(tmp_path, [ex], [feat], result, v2=True, null_score_diff_threshold=2.0)
    assert preds == {"fox": "quick brown fox"} and odds == {"fox": 2.0}
    # v1.1 has no null candidate: the span is the whole n-best list.
    (tmp_path / "v1").mkdir()
    preds, _, nbest_file, odds = run_predictions(tmp_path / "v1", [ex], [feat], result)
    assert preds == {"fox": "quick brown fox"} and [e["text"] for e in nbest_file["fox"]] == ["quick brown fox"]
    assert odds is None


def test_v2_null_score_is_the_minimum_over_windows(tmp_path):
    ex, tok = numbered_example(20)
    feats = convert_examples_to_features([ex], tok, 14, 4, 8, is_training=False)
    nulls = [4.0, 1.0, 3.0, 2.0]  # start[0] = end[0] = null / 2: the minimum is window 1's 1.0
    results = [
        RawResult(f.unique_id, logits(14, {0: n / 2, 9: 1.0}, -9.0), logits(14, {0: n / 2, 9: 1.0}, -9.0))
        for f, n in zip(feats, nulls)
    ]
    preds, _, nbest_file, odds = run_predictions(tmp_path, [ex], feats, results, v2=True)
    # Best non-null: word 6 in window 0 (position 9, max-context there), score 2.0; diff = 1.0 - 2.0.
    assert odds == {"q": -1.0} and preds == {"q": "a6"}
    null = [e for e in nbest_file["q"] if e["text"] == ""]
    assert len(null) == 1 and (null[0]["start_logit"], null[0]["end_logit"]) == (0.5, 0.5)


def test_v2_without_non_null_answer_does_not_crash(tmp_path):
    ex, feat = fox_setup()
    # n_best_size 1: the best start and end are both [CLS], so no span is valid and the n-best list holds
    # only the null answer; the original dereferences None here.
    start = logits(20, {0: 9.0, 6: 5.0}, -5.0)
    end = logits(20, {0: 9.0, 8: 5.0}, -5.0)
    preds, _, nbest_file, odds = run_predictions(
        tmp_path, [ex], [feat], [RawResult(feat.unique_id, start, end)], v2=True, n_best_size=1
    )
    assert preds == {"fox": ""} and odds == {"fox": NO_NON_NULL_SCORE_DIFF}
    assert nbest_file["fox"] == [{"text": "", "probability": 1.0, "start_logit": 9.0, "end_logit": 9.0}]
    # No valid span at all (the best positions are in the question), with a negative threshold.
    start = logits(20, {1: 9.0}, -5.0)
    preds, *_ = run_predictions(
        tmp_path, [ex], [feat], [RawResult(feat.unique_id, start, start)], v2=True, null_score_diff_threshold=-100.0
    )
    assert preds == {"fox": ""}


@pytest.mark.parametrize("v2", [False, True])
def test_every_question_gets_one_prediction(tmp_path, v2):
    tok = tiny_tokenizer(FOX_WORDS)
    examples = [
        SquadExample("a", "Who jumps?", FOX.split(" ")),
        SquadExample("empty-context", "Who?", []),  # no features at all
        SquadExample("b", "Who?", FOX.split(" ")),
    ]
    feats = convert_examples_to_features(examples, tok, 20, 8, 8, is_training=False)
    assert sorted({f.example_index for f in feats}) == [0, 2]
    # In-question logits only for "b": no valid span ("empty" in v1.1, "" in v2.0).
    results = [RawResult(feats[0].unique_id, logits(20, {6: 5.0}), logits(20, {8: 5.0}))]
    results.append(RawResult(feats[1].unique_id, logits(20, {1: 5.0}, -1.0), logits(20, {2: 5.0}, -1.0)))
    preds, pred_file, nbest_file, odds = run_predictions(tmp_path, examples, feats, results, v2=v2, n_best_size=1)
    assert list(preds) == list(pred_file) == list(nbest_file) == ["a", "empty-context", "b"]
    assert preds["a"] == "quick brown fox"
    if v2:
        assert preds["empty-context"] == preds["b"] == "" and list(odds) == ["a", "empty-context", "b"]
    else:
        assert preds["empty-context"] == preds["b"] == "empty" and odds is None
        assert nbest_file["b"] == [{"text": "empty", "probability": 1.0, "start_logit": 0.0, "end_logit": 0.0}]


def test_missing_result_is_an_error():
    ex, feat = fox_setup()
    with pytest.raises(ValueError, match=f"no RawResult for feature {feat.unique_id}"):
        squad.compute_predictions([ex], [feat], [], 3, 30, True)


# --------------------------------------------------------------------------------------------------
# End to end on the real dev set, with "oracle" logits


def test_oracle_logits_recover_dev_v11_answers(tmp_path):
    data = load_gz(shared_path("data", "squad", "dev-v1.1.json.gz"))
    tok = FullTokenizer(shared_path("data", "vocab", "uncased.txt"), do_lower_case=True)
    paragraphs, n = [], 0
    for p in data["data"][1]["paragraphs"]:
        paragraphs.append(p)
        n += len(p["qas"])
        if n >= 30:
            break
    subset = {"data": [{"title": data["data"][1]["title"], "paragraphs": paragraphs}]}
    # Gold positions from the first answer, read as training data.
    examples = squad_examples_from_json(_first_answer_only(subset), is_training=True)
    # Short windows (max_tokens_for_doc <= 61) so that most paragraphs are split.
    feats = convert_examples_to_features(examples, tok, 96, 32, 32, is_training=True)
    assert len(feats) > 2 * len(examples)
    results = []
    for f in feats:
        start, end = [0.0] * 96, [0.0] * 96
        if f.start_position:  # the window holds the whole answer
            start[f.start_position] = end[f.end_position] = 10.0
        results.append(RawResult(f.unique_id, start, end))
    preds = write_predictions(examples, feats, results, 20, 30, True, tmp_path / "p.json", tmp_path / "n.json", None)
    assert len(preds) == n
    scores = evaluate_v1(subset["data"], json.loads((tmp_path / "p.json").read_text(encoding="utf-8")))
    print(f"oracle on {n} dev v1.1 questions: {scores}")
    assert scores["exact_match"] >= 95.0 and scores["f1"] >= 97.0
