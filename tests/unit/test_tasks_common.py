"""Shared task helpers (`bert.tasks.common`): the feature-name rename, softmax, pair truncation, padding, the
original's step arithmetic, column and label flags."""

import numpy as np
import pytest

from bert.errors import InputError
from bert.tasks.common import (
    column_spec,
    label_list_flag,
    model_inputs,
    num_train_steps,
    num_warmup_steps,
    pad_2d,
    softmax,
    truncate_seq_pair,
)


def test_truncate_seq_pair_pops_the_longer_side_b_on_ties():
    a, b = ["a"] * 9, ["b"] * 2
    truncate_seq_pair(a, b, 6)
    assert (len(a), len(b)) == (4, 2)
    a, b = list("aaaa"), list("bbbb")
    truncate_seq_pair(a, b, 5)  # 4/4 -> B pops, 4/3 -> A pops, 3/3 -> B pops
    assert (a, b) == (list("aaa"), list("bb"))


def test_pad_2d_pads_right_and_refuses_overlong_rows():
    out = pad_2d([[1, 2, 3], [4]], value=-1)
    assert out.tolist() == [[1, 2, 3], [4, -1, -1]] and out.dtype == np.int64
    assert pad_2d([[1]], length=3).tolist() == [[1, 0, 0]]
    with pytest.raises(ValueError, match="more than the padded length 2"):
        pad_2d([[1, 2, 3]], length=2)


def test_step_arithmetic():
    assert num_train_steps(3668, 32, 3.0) == 343  # README: global_step = 343
    assert num_warmup_steps(343, 0.1) == 34
    assert num_train_steps(100, 32, 1.0) == 3  # truncation, not rounding up
    assert num_train_steps(10, 4, 2.5) == 6


def test_column_and_label_flags():
    assert column_spec("2") == 2 and column_spec("-1") == -1 and column_spec("sentence") == "sentence"
    assert column_spec(None) is None
    assert label_list_flag(" neg, pos ") == ["neg", "pos"] and label_list_flag(None) is None
    with pytest.raises(InputError, match="distinct, non-empty"):
        label_list_flag("a,a")
    with pytest.raises(InputError, match="distinct, non-empty"):
        label_list_flag("a,,b")


def test_model_inputs_renames_the_originals_feature_names():
    ids, mask, types, labels = (np.full((1, 2), i) for i in range(4))
    got = model_inputs({"input_ids": ids, "input_mask": mask, "segment_ids": types, "label_ids": labels})
    assert list(got) == ["input_ids", "attention_mask", "token_type_ids", "label_ids"]
    assert got["attention_mask"] is mask and got["token_type_ids"] is types and got["label_ids"] is labels


def test_softmax_in_float64_returned_as_float32():
    probs = softmax(np.array([[0.0, np.log(3.0)], [1000.0, 1000.0]], dtype=np.float32))  # no overflow at 1000
    assert probs.dtype == np.float32
    np.testing.assert_allclose(probs, [[0.25, 0.75], [0.5, 0.5]], rtol=1e-7)
    assert softmax(np.zeros((2, 3, 4))).shape == (2, 3, 4)
