"""bert.distillation: the teacher-output cache, the digests, the soft-label losses, students from a teacher's layers."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from bert.distillation import cached_teacher_outputs, data_digest, weights_digest
from bert.errors import InputError


class Counting:
    """A compute function that records its calls and returns rows of a fixed random array."""

    def __init__(self, rows: np.ndarray):
        self.rows = rows
        self.calls: list[tuple[int, int]] = []
        self.grad_enabled: list[bool] = []

    def __call__(self, start: int, stop: int) -> np.ndarray:
        self.calls.append((start, stop))
        self.grad_enabled.append(torch.is_grad_enabled() or not torch.is_inference_mode_enabled())
        return self.rows[start:stop]


def _rows(n: int = 10, shape: tuple[int, ...] = (3,)) -> np.ndarray:
    return np.random.default_rng(0).standard_normal((n, *shape)).astype(np.float32)


def test_cache_computes_once_and_returns_compute_output(tmp_path):
    rows = _rows(10, (4, 3))
    first = Counting(rows)
    out = cached_teacher_outputs(tmp_path / "cache", {"teacher": "t", "data": "d"}, 10, (4, 3), first, batch_rows=4)
    assert first.calls == [(0, 4), (4, 8), (8, 10)]
    assert first.grad_enabled == [False, False, False]  # every chunk under torch.inference_mode
    assert isinstance(out, np.memmap) and out.dtype == np.float32 and not out.flags.writeable
    np.testing.assert_array_equal(out, rows)
    second = Counting(rows)
    again = cached_teacher_outputs(tmp_path / "cache", {"data": "d", "teacher": "t"}, 10, (4, 3), second, batch_rows=4)
    assert second.calls == []  # same key (in any order): read back, the teacher does not run
    np.testing.assert_array_equal(again, rows)
    manifest = json.loads(next((tmp_path / "cache").glob("*.json")).read_text())
    assert manifest == {"key": {"data": "d", "teacher": "t"}, "rows": 10, "shape": [4, 3], "dtype": "float32"}


def test_cache_recomputes_for_another_key_or_shape(tmp_path):
    rows = _rows()
    cached_teacher_outputs(tmp_path, {"teacher": "a"}, 10, (3,), Counting(rows))
    other = Counting(rows * 2)
    out = cached_teacher_outputs(tmp_path, {"teacher": "b"}, 10, (3,), other)
    assert other.calls == [(0, 10)]
    np.testing.assert_array_equal(out, rows * 2)
    fewer = Counting(rows)
    out = cached_teacher_outputs(tmp_path, {"teacher": "a"}, 6, (3,), fewer)  # same key, other row count
    assert fewer.calls == [(0, 6)]
    np.testing.assert_array_equal(out, rows[:6])


def test_cache_ignores_killed_and_truncated_files(tmp_path):
    rows = _rows()
    cached_teacher_outputs(tmp_path, {"teacher": "a"}, 10, (3,), Counting(rows))
    (array,) = tmp_path.glob("*.npy")
    # A run killed while writing leaves a temporary file; one cut short leaves a truncated array.
    leftover = tmp_path / f".{array.name}.abcd1234.tmp"
    leftover.write_bytes(b"\x93NUMPY partial")
    array.write_bytes(array.read_bytes()[:100])
    again = Counting(rows)
    out = cached_teacher_outputs(tmp_path, {"teacher": "a"}, 10, (3,), again)
    assert again.calls == [(0, 10)]
    np.testing.assert_array_equal(out, rows)
    assert not leftover.exists()
    # A killed run between the rename and the manifest: no manifest, so the array is not trusted.
    next(tmp_path.glob("*.json")).unlink()
    third = Counting(rows)
    cached_teacher_outputs(tmp_path, {"teacher": "a"}, 10, (3,), third)
    assert third.calls == [(0, 10)]


def test_cache_interrupted_compute_leaves_nothing_under_the_final_name(tmp_path):
    def failing(start: int, stop: int) -> np.ndarray:
        if start >= 4:
            raise KeyboardInterrupt
        return _rows()[start:stop]

    with pytest.raises(KeyboardInterrupt):
        cached_teacher_outputs(tmp_path, {"teacher": "a"}, 10, (3,), failing, batch_rows=4)
    assert list(tmp_path.iterdir()) == []


def test_cache_rejects_non_finite_teacher_outputs(tmp_path):
    rows = _rows()
    rows[7, 1] = np.nan
    with pytest.raises(InputError, match=r"my-teacher: .*row 7 is not a finite number"):
        cached_teacher_outputs(tmp_path, {"teacher": "a"}, 10, (3,), Counting(rows), batch_rows=4, desc="my-teacher")
    assert not list(tmp_path.glob("*.npy"))


def test_data_digest_frames_parts(tmp_path):
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("xy")
    b.write_text("xy")
    assert data_digest(a, 1) == data_digest(b, 1)  # files by content, not name
    assert data_digest(a, 1) != data_digest(a, 2)
    assert data_digest("ab", "c") != data_digest("a", "bc")
    assert data_digest({"x": 1, "y": [1, 2]}) == data_digest({"y": [1, 2], "x": 1})
    a.write_text("xz")
    assert data_digest(a, 1) != data_digest(b, 1)


def test_weights_digest_is_the_saved_one_or_the_tensors(tmp_path, tiny_config):
    from bert.checkpoint import read_checkpoint, save_pretrained, tensors_digest
    from bert.modeling import BertModel

    torch.manual_seed(0)
    model = BertModel(tiny_config)
    save_pretrained(model, tmp_path / "m")
    digest = weights_digest(tmp_path / "m")
    assert digest == tensors_digest(read_checkpoint(tmp_path / "m").state_dict)
    torch.save(model.state_dict(), tmp_path / "m.bin")
    assert len(weights_digest(tmp_path / "m.bin")) == 64
    with torch.no_grad():
        model.embeddings.word_embeddings.weight[0, 0] += 1
    save_pretrained(model, tmp_path / "m2")
    assert weights_digest(tmp_path / "m2") != digest
