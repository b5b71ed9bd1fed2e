"""bert.tasks.ner: CoNLL-2003 reading, first-sub-token alignment, windows, predictions back to words."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from bert.errors import InputError
from bert.metrics import ner_metrics
from bert.tasks.ner import (
    CONLL2003_LABELS,
    IGNORE_INDEX,
    NerExample,
    convert_ner_examples_to_features,
    labels_from_examples,
    ner_features_to_arrays,
    read_conll,
    read_prediction_file,
    word_predictions,
    write_conll_predictions,
)
from bert.tokenization import FullTokenizer
from conftest import shared_path

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "john", "jo", "##han", "##son", "lives", "in", "new", "york", "."]
SENTENCE = NerExample(
    guid="hand-0",
    words=["John", "Johanson", "lives", "in", "New", "York", "."],
    labels=["B-PER", "I-PER", "O", "O", "B-LOC", "I-LOC", "O"],
)


@pytest.fixture(scope="module")
def tokenizer():
    return FullTokenizer({t: i for i, t in enumerate(VOCAB)}, do_lower_case=True)


def one_hot_logits(features, num_labels):
    """Logits [F, S, L] that predict each feature's gold label wherever it has one."""
    arrays = ner_features_to_arrays(features)
    labels = arrays["label_ids"]
    logits = np.zeros((*labels.shape, num_labels), dtype=np.float32)
    rows, cols = np.nonzero(labels != IGNORE_INDEX)
    logits[rows, cols, labels[rows, cols]] = 5.0
    return logits


# --------------------------------------------------------------------------------------------------
# Hand cases


def test_first_subtoken_alignment(tokenizer, caplog):
    with caplog.at_level(logging.INFO, logger="bert.tasks.ner"):
        (f,) = convert_ner_examples_to_features([SENTENCE], CONLL2003_LABELS, 14, tokenizer)
    # [CLS] john jo ##han ##son lives in new york . [SEP] + 3 padding
    assert tokenizer.convert_ids_to_tokens(f.input_ids[:11]) == [
        "[CLS]", "john", "jo", "##han", "##son", "lives", "in", "new", "york", ".", "[SEP]",
    ]  # fmt: skip
    assert f.input_ids[11:] == [0, 0, 0]
    assert f.input_mask == [1] * 11 + [0] * 3
    assert f.segment_ids == [0] * 14
    # O=0, B-PER=3, I-PER=4, B-LOC=7, I-LOC=8; -100 on later pieces, specials and padding.
    assert f.label_ids == [-100, 3, 4, -100, -100, 0, 0, 7, 8, 0, -100, -100, -100, -100]
    assert f.word_index == [-1, 0, 1, -1, -1, 2, 3, 4, 5, 6, -1, -1, -1, -1]
    assert f.example_index == 0
    messages = [r.getMessage() for r in caplog.records]
    assert "tokens: [CLS] john jo ##han ##son lives in new york . [SEP]" in messages
    assert "label_ids: -100 3 4 -100 -100 0 0 7 8 0 -100 -100 -100 -100" in messages


def test_long_sentences_are_split_at_word_boundaries(tokenizer):
    features = convert_ner_examples_to_features([SENTENCE], CONLL2003_LABELS, 6, tokenizer)
    # 4 pieces per window: [John Johanson] [lives in New York] [.]
    assert [[w for w in f.word_index if w >= 0] for f in features] == [[0, 1], [2, 3, 4, 5], [6]]
    assert tokenizer.convert_ids_to_tokens(features[0].input_ids) == ["[CLS]", "john", "jo", "##han", "##son", "[SEP]"]
    assert all(len(f.input_ids) == 6 for f in features)
    assert [f.example_index for f in features] == [0, 0, 0]
    # A word longer than a window keeps its first pieces, and its label.
    features = convert_ner_examples_to_features([SENTENCE], CONLL2003_LABELS, 4, tokenizer)
    assert tokenizer.convert_ids_to_tokens(features[1].input_ids) == ["[CLS]", "jo", "##han", "[SEP]"]
    assert features[1].label_ids == [-100, 4, -100, -100]
    assert sorted(w for f in features for w in f.word_index if w >= 0) == list(range(7))


@pytest.mark.parametrize("max_seq_length", [4, 6, 9, 64])
def test_round_trip_of_word_labels(tokenizer, max_seq_length):
    other = NerExample("hand-1", ["in", "York", "John"], ["O", "B-LOC", "B-PER"])
    examples = [SENTENCE, other]
    for pad in (True, False):
        features = convert_ner_examples_to_features(examples, CONLL2003_LABELS, max_seq_length, tokenizer, pad=pad)
        logits = one_hot_logits(features, len(CONLL2003_LABELS))
        assert word_predictions(examples, features, logits, CONLL2003_LABELS) == [SENTENCE.labels, other.labels]
        ids = logits.argmax(-1)  # predicted ids work as well as logits
        assert word_predictions(examples, features, ids, CONLL2003_LABELS) == [SENTENCE.labels, other.labels]


def test_unpadded_features_match_padded(tokenizer):
    padded = convert_ner_examples_to_features([SENTENCE], CONLL2003_LABELS, 16, tokenizer)
    unpadded = convert_ner_examples_to_features([SENTENCE], CONLL2003_LABELS, 16, tokenizer, pad=False)
    assert len(unpadded[0].input_ids) == 11
    arrays = ner_features_to_arrays(unpadded, pad_to=16)
    np.testing.assert_array_equal(arrays["input_ids"], [padded[0].input_ids])
    np.testing.assert_array_equal(arrays["label_ids"], [padded[0].label_ids])
    np.testing.assert_array_equal(arrays["input_mask"], [padded[0].input_mask])


def test_predictions_pick_the_first_subtoken(tokenizer):
    (f,) = convert_ner_examples_to_features([SENTENCE], CONLL2003_LABELS, 14, tokenizer)
    ids = np.zeros((1, 14), dtype=np.int64)  # "O" everywhere
    ids[0, 2] = 4  # Johanson's first piece: I-PER
    ids[0, 3] = 3  # its second piece says B-PER: ignored
    assert word_predictions([SENTENCE], [f], ids, CONLL2003_LABELS)[0] == ["O", "I-PER", "O", "O", "O", "O", "O"]


def test_conversion_errors(tokenizer):
    bad = NerExample("s-3", ["John"], ["B-PERSON"])
    with pytest.raises(InputError, match=r"sentence s-3: label 'B-PERSON' is not one of \['O', 'B-MISC'"):
        convert_ner_examples_to_features([bad], CONLL2003_LABELS, 8, tokenizer)
    with pytest.raises(InputError, match="--max_seq_length=2"):
        convert_ner_examples_to_features([SENTENCE], CONLL2003_LABELS, 2, tokenizer)


# --------------------------------------------------------------------------------------------------
# Reading


def test_read_conll_layout(tmp_path):
    path = tmp_path / "mini.txt"
    path.write_text(
        "-DOCSTART- -X- -X- O\n\nEU NNP B-NP B-ORG\nrejects VBZ B-VP O\n\n\nPeter NNP B-NP B-PER\n"
        "-DOCSTART- -X- -X- O\nBlackburn NNP I-NP I-PER\n",
        encoding="utf-8",
    )
    examples = read_conll(path)
    assert examples == [
        NerExample("mini-0", ["EU", "rejects"], ["B-ORG", "O"]),
        NerExample("mini-1", ["Peter"], ["B-PER"]),  # a -DOCSTART- line also ends a sentence
        NerExample("mini-2", ["Blackburn"], ["I-PER"]),  # no blank line needed at the end
    ]
    assert labels_from_examples(examples) == ["O", "B-ORG", "B-PER", "I-PER"]
    two = tmp_path / "two.txt"
    two.write_text("Paris B-LOC\n\nis O\n", encoding="utf-8")
    assert [e.labels for e in read_conll(two, set_type="dev", num_columns=None)] == [["B-LOC"], ["O"]]
    assert read_conll(two, set_type="dev", num_columns=None)[1].guid == "dev-1"


def test_read_conll_errors(tmp_path):
    path = tmp_path / "bad.txt"
    path.write_text("EU NNP B-NP B-ORG\nrejects VBZ O\n", encoding="utf-8")
    with pytest.raises(InputError) as e:
        read_conll(path)
    assert str(e.value).startswith(
        f"{path}:2: expected 4 whitespace-separated columns (token POS chunk NER for CoNLL-2003), found 3"
    )
    path.write_text("EU NNP B-NP B-ORG\n\nrejects VBZ B-VP B-ORGANISATION\n", encoding="utf-8")
    with pytest.raises(InputError, match=r"bad.txt:3: label 'B-ORGANISATION' is not one of"):
        read_conll(path, label_list=CONLL2003_LABELS)
    path.write_text("-DOCSTART- -X- -X- O\n\n", encoding="utf-8")
    with pytest.raises(InputError, match="bad.txt holds no sentences"):
        read_conll(path)
    with pytest.raises(InputError, match="missing.txt: no such file"):
        read_conll(tmp_path / "missing.txt")


def test_real_conll2003():
    counts = {"train": 14041, "valid": 3250, "test": 3453}
    for name, count in counts.items():
        examples = read_conll(shared_path("data", "conll2003", f"{name}.txt"), label_list=CONLL2003_LABELS)
        assert len(examples) == count, name
        assert set(labels_from_examples(examples)) == set(CONLL2003_LABELS)
    assert examples[0].guid == "test-0" and len(examples[0].words) == len(examples[0].labels)


def test_real_conll2003_slice_round_trip():
    vocab = shared_path("data", "vocab", "cased.txt")
    examples = read_conll(shared_path("data", "conll2003", "valid.txt"))[:300]
    tokenizer = FullTokenizer(vocab, do_lower_case=False)
    features = convert_ner_examples_to_features(examples, CONLL2003_LABELS, 24, tokenizer)
    assert len(features) > len(examples)  # some sentences needed more than one window
    # Every word is labelled exactly once, on its first piece.
    starts = [(f.example_index, w) for f in features for w in f.word_index if w >= 0]
    assert len(starts) == len(set(starts)) == sum(len(e.words) for e in examples)
    for f in features[:50]:
        for p, w in enumerate(f.word_index):
            if w >= 0:
                word = examples[f.example_index].words[w]
                assert f.input_ids[p] == tokenizer.convert_tokens_to_ids(tokenizer.tokenize(word)[:1])[0]
    logits = one_hot_logits(features, len(CONLL2003_LABELS))
    assert word_predictions(examples, features, logits, CONLL2003_LABELS) == [e.labels for e in examples]


# --------------------------------------------------------------------------------------------------
# Writing predictions, scored as conlleval


def test_written_predictions_score_as_conlleval(tmp_path):
    examples = [
        NerExample("t-0", ["John", "Smith", "visited", "Paris"], ["B-PER", "I-PER", "O", "B-LOC"]),
        NerExample("t-1", ["Reuters", "reported"], ["B-ORG", "O"]),
    ]
    predictions = [["B-PER", "I-PER", "O", "B-ORG"], ["B-ORG", "O"]]
    path = tmp_path / "predictions.txt"
    write_conll_predictions(path, examples, predictions)
    assert path.read_text() == (
        "John B-PER B-PER\nSmith I-PER I-PER\nvisited O O\nParis B-LOC B-ORG\n\nReuters B-ORG B-ORG\nreported O O\n\n"
    )
    gold, pred = read_prediction_file(path)
    assert gold == [e.labels for e in examples] and pred == predictions
    m = ner_metrics(gold, pred)
    # Gold chunks PER, LOC, ORG; predicted PER, ORG, ORG; correct PER and the second ORG.
    assert (m["num_gold"], m["num_pred"], m["num_correct"]) == (3, 3, 2)
    assert m["precision"] == pytest.approx(2 / 3) and m["recall"] == pytest.approx(2 / 3)
    assert m["f1"] == pytest.approx(2 / 3)
    assert m["accuracy"] == pytest.approx(5 / 6)
    assert m["per_type"]["ORG"]["precision"] == 0.5 and m["per_type"]["ORG"]["recall"] == 1.0
    assert m["per_type"]["LOC"]["f1"] == 0.0 and m["per_type"]["PER"]["f1"] == 1.0
    with pytest.raises(ValueError, match="sentence t-1: 1 predictions for 2 words"):
        write_conll_predictions(path, examples, [predictions[0], ["O"]])
