"""The library of `bert extract-features` (`bert.extract_features`): reading the input lines as the original's
extract_features.py does, the features, the layer list, and the output of each batch padded to its own
longest line equal to one line at a time. The command against the original's output is in
tests/e2e/test_extract_features.py."""

from __future__ import annotations

import pytest
import torch

from bert.errors import InputError
from bert.extract_features import convert_examples_to_features, extract, parse_layers, read_examples
from bert.modeling import BertModel
from bert.tokenization import FullTokenizer

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "a", "b", "c", "d", "|||"]


def test_read_examples_splits_pairs_on_the_last_separator(tmp_path):
    path = tmp_path / "input.txt"
    path.write_bytes(b"  one line  \nleft ||| right\na ||| b ||| c\n\nno|||spaces\nbad \xff byte\n")
    with pytest.raises(InputError, match=r"input\.txt:6: bytes that are not valid UTF-8 at column 5"):
        read_examples(path)
    examples = read_examples(path, "ignore")
    assert [(e.unique_id, e.text_a, e.text_b) for e in examples] == [
        (0, "one line", None),
        (1, "left", "right"),
        (2, "a ||| b", "c"),  # the original's greedy first group
        (3, "", None),  # an empty line is an example too
        (4, "no|||spaces", None),
        (5, "bad  byte", None),  # undecodable bytes dropped on request, as convert_to_unicode does
    ]
    with pytest.raises(InputError, match=r"input file \S*missing\.txt does not exist; pass --input_file"):
        read_examples(tmp_path / "missing.txt")


def test_features_are_cls_a_sep_b_sep_truncated_to_max_seq_length(tmp_path):
    tokenizer = FullTokenizer({t: i for i, t in enumerate(VOCAB)}, do_lower_case=True)
    path = tmp_path / "input.txt"
    path.write_text("a b c d a b c d\na b c ||| d d\na b c d ||| a\n")
    single, pair, long_pair = convert_examples_to_features(read_examples(path), 6, tokenizer)
    assert single.tokens == ["[CLS]", "a", "b", "c", "d", "[SEP]"]  # cut to 6 with its two specials
    assert single.input_type_ids == [0] * 6 and single.input_mask == [1] * 6
    assert pair.tokens == ["[CLS]", "a", "b", "[SEP]", "d", "[SEP]"]  # the longer side loses tokens first
    assert pair.input_type_ids == [0, 0, 0, 0, 1, 1]
    assert long_pair.tokens == ["[CLS]", "a", "b", "[SEP]", "a", "[SEP]"]
    assert long_pair.input_ids == [2, 4, 5, 3, 4, 3] and long_pair.unique_id == 2


def test_parse_layers():
    assert parse_layers("-1,-2,-3,-4", 4) == [-1, -2, -3, -4]
    assert parse_layers("0, 3,", 4) == [0, 3]
    for bad, message in (("4", "layer 4 does not exist in a 4-layer model; use values from -4 to 3"),
                         ("-5", "layer -5 does not exist"), ("x", "comma-separated integers"),
                         (",", "--layers is empty")):  # fmt: skip
        with pytest.raises(InputError, match=message):
            parse_layers(bad, 4)


def test_batches_padded_to_their_longest_line_equal_one_line_at_a_time(tiny_config, tmp_path):
    tokenizer = FullTokenizer({t: i for i, t in enumerate(VOCAB)}, do_lower_case=True)
    path = tmp_path / "input.txt"
    path.write_text("a\na b c d a b c\nb ||| c d\nd d\n")
    features = convert_examples_to_features(read_examples(path), 16, tokenizer)
    model = BertModel(tiny_config).eval()
    batched = list(extract(model, features, [-1, 0], 3, torch.device("cpu")))
    single = list(extract(model, features, [-1, 0], 1, torch.device("cpu")))
    assert [o["linex_index"] for o in batched] == [0, 1, 2, 3]
    for a, b, f in zip(batched, single, features):
        assert [t["token"] for t in a["features"]] == f.tokens  # real tokens only, no padding
        for ta, tb in zip(a["features"], b["features"]):
            assert [layer["index"] for layer in ta["layers"]] == [-1, 0]
            for la, lb in zip(ta["layers"], tb["layers"]):
                assert len(la["values"]) == 32
                assert max(abs(x - y) for x, y in zip(la["values"], lb["values"])) <= 2e-6
    # Values are those of the encoder layers, rounded to 6 decimals.
    with torch.no_grad():
        out = model(torch.tensor([features[1].input_ids]))
    expected = out.all_encoder_layers[-1][0, 2].tolist()
    got = single[1]["features"][2]["layers"][0]["values"]
    assert got == pytest.approx(expected, abs=5e-7 + 1e-7) and all(round(x, 6) == x for x in got)
