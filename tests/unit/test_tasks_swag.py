"""bert.tasks.swag: the swagaf CSV layout, four sequences per example, truncation, errors, accuracy."""

from __future__ import annotations

import numpy as np
import pytest

from bert.errors import InputError
from bert.tasks.swag import (
    NUM_CHOICES,
    SwagExample,
    convert_swag_examples_to_features,
    read_swag_examples,
    swag_features_to_arrays,
    swag_metrics,
)
from bert.tokenization import FullTokenizer
from conftest import FIXTURES

SWAG = FIXTURES / "tasks" / "swag"
HEADER = ",video-id,fold-ind,startphrase,sent1,sent2,gold-source,ending0,ending1,ending2,ending3,label\n"
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "the", "dog", "runs", ".", "it", "stops", "barks", "is", "a"]


@pytest.fixture(scope="module")
def tokenizer():
    return FullTokenizer({t: i for i, t in enumerate(VOCAB)}, do_lower_case=True)


def test_read_fixture_files():
    train = read_swag_examples(SWAG / "train.csv")
    assert len(train) == 4
    assert train[0] == SwagExample(
        swag_id="101",
        context_sentence="The man lifts the lid of the pot.",
        start_ending="He",
        endings=[
            "stirs the soup, then tastes it.",  # a quoted field with a comma
            "throws the pot out of the window.",
            "sings to the lid.",
            "swims across the kitchen.",
        ],
        label=0,
    )
    assert [e.label for e in train] == [0, 2, 3, 0]
    assert train[2].start_ending == "The owner"
    assert [e.label for e in read_swag_examples(SWAG / "val.csv")] == [1, 0]
    test = read_swag_examples(SWAG / "test.csv")  # no label column
    assert [e.label for e in test] == [None, None]
    assert test[1].endings[3] == "eats the keys, slowly."


def test_features_of_one_example(tokenizer):
    example = SwagExample("7", "The dog runs.", "It", ["stops.", "barks", "is a dog", "runs"], label=2)
    (f,) = convert_swag_examples_to_features([example], 12, tokenizer)
    assert f.example_id == "7" and f.label == 2
    assert len(f.input_ids) == len(f.input_mask) == len(f.segment_ids) == NUM_CHOICES
    # [CLS] sent1 [SEP] sent2 ending [SEP]
    assert tokenizer.convert_ids_to_tokens(f.input_ids[0][:10]) == [
        "[CLS]", "the", "dog", "runs", ".", "[SEP]", "it", "stops", ".", "[SEP]",
    ]  # fmt: skip
    assert f.input_ids[0][10:] == [0, 0]
    assert f.segment_ids[0] == [0] * 6 + [1] * 4 + [0] * 2
    assert f.input_mask[0] == [1] * 10 + [0] * 2
    assert tokenizer.convert_ids_to_tokens(f.input_ids[2][:11]) == [
        "[CLS]", "the", "dog", "runs", ".", "[SEP]", "it", "is", "a", "dog", "[SEP]",
    ]  # fmt: skip
    assert all(len(ids) == 12 for ids in f.input_ids)


def test_each_choice_truncates_its_own_copy(tokenizer):
    example = SwagExample("8", "the dog runs .", "it", ["is a dog", "stops", "barks", ""], label=0)
    (f,) = convert_swag_examples_to_features([example], 9, tokenizer)
    # Budget 6. Choice 0: 4 + 4 -> pop the ending (equal), then the context (4 > 3) -> 3 + 3.
    assert tokenizer.convert_ids_to_tokens(f.input_ids[0]) == [
        "[CLS]", "the", "dog", "runs", "[SEP]", "it", "is", "a", "[SEP]",
    ]  # fmt: skip
    # Choice 1 fits (4 + 2) and keeps the whole context: choice 0 did not shorten a shared list.
    assert tokenizer.convert_ids_to_tokens(f.input_ids[1][:9]) == [
        "[CLS]", "the", "dog", "runs", ".", "[SEP]", "it", "stops", "[SEP]",
    ]  # fmt: skip
    assert f.segment_ids[0] == [0] * 5 + [1] * 4
    assert tokenizer.convert_ids_to_tokens(f.input_ids[3][:8]) == [
        "[CLS]", "the", "dog", "runs", ".", "[SEP]", "it", "[SEP]",
    ]  # fmt: skip


def test_arrays_and_unpadded_features(tokenizer):
    examples = read_swag_examples(SWAG / "train.csv")
    padded = convert_swag_examples_to_features(examples, 32, tokenizer)
    unpadded = convert_swag_examples_to_features(examples, 32, tokenizer, pad=False)
    arrays = swag_features_to_arrays(unpadded, pad_to=32)
    assert arrays["input_ids"].shape == (4, NUM_CHOICES, 32)
    np.testing.assert_array_equal(arrays["input_ids"], [f.input_ids for f in padded])
    np.testing.assert_array_equal(arrays["segment_ids"], [f.segment_ids for f in padded])
    np.testing.assert_array_equal(arrays["input_mask"], [f.input_mask for f in padded])
    np.testing.assert_array_equal(arrays["labels"], [0, 2, 3, 0])
    dynamic = swag_features_to_arrays(unpadded)
    assert dynamic["input_ids"].shape[2] == max(len(s) for f in unpadded for s in f.input_ids) < 32
    test = convert_swag_examples_to_features(read_swag_examples(SWAG / "test.csv"), 32, tokenizer)
    assert [f.label for f in test] == [0, 0]  # placeholder


def test_accuracy():
    logits = np.array([[0.1, 0.9, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 2.0]])
    assert swag_metrics(logits, [1, 0, 2]) == {"accuracy": pytest.approx(2 / 3)}


def test_bad_input(tmp_path):
    path = tmp_path / "train.csv"
    path.write_text(HEADER.replace(",ending3", ""), encoding="utf-8")
    with pytest.raises(InputError, match=r"train.csv:1: the header has no column ending3"):
        read_swag_examples(path)
    row = '0,v,1,s,"A man, walking.",He,gold,a,b,c,d,{label}\n'
    # The quoted field of the first row spans two lines: the bad row is on line 4.
    path.write_text(HEADER + row.format(label=1).replace("walking", "walk-\ning") + "1,v,2,s,x\n", encoding="utf-8")
    with pytest.raises(InputError) as e:
        read_swag_examples(path)
    assert str(e.value).startswith(f"{path}:4: expected 12 comma-separated columns, found 5")
    for bad in ("4", "-1", "x", ""):
        path.write_text(HEADER + row.format(label=0) + row.format(label=bad), encoding="utf-8")
        with pytest.raises(InputError, match=rf"train.csv:3: label '{bad}' is not an ending index 0..3"):
            read_swag_examples(path)
    with pytest.raises(InputError, match=r"test.csv:1: no 'label' column; training and evaluation need"):
        read_swag_examples(SWAG / "test.csv", has_label=True)
    path.write_text("", encoding="utf-8")
    with pytest.raises(InputError, match="train.csv is empty"):
        read_swag_examples(path)
    path.write_text(HEADER, encoding="utf-8")
    with pytest.raises(InputError, match="train.csv has a header line but no examples"):
        read_swag_examples(path)
