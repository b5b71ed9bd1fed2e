"""Shared task helpers: pair truncation, padding, the original's step arithmetic, column and label flags."""

import numpy as np
import pytest

from bert.errors import InputError
from bert.tasks.common import column_spec, label_list_flag, num_train_steps, num_warmup_steps, pad_2d, truncate_seq_pair


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
