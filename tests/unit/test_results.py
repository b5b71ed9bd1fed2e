"""The original's result files, written by one writer for every command."""

import json

import numpy as np
import pytest

from bert.formats.results import write_results, write_test_results


def test_write_results_float32_like_the_estimator(tmp_path):
    results = {"loss": 0.505248, "eval_loss": np.float32(0.5052481), "global_step": 343, "eval_accuracy": 0.845588}
    path = write_results(tmp_path / "out", results)
    assert path.read_text() == ("eval_accuracy = 0.845588\neval_loss = 0.5052481\nglobal_step = 343\nloss = 0.505248\n")
    saved = json.loads((tmp_path / "out" / "eval_results.json").read_text())
    assert saved["global_step"] == 343 and saved["eval_loss"] == pytest.approx(0.5052481)
    assert list(saved) == sorted(saved)


def test_write_results_as_the_official_squad_script_prints(tmp_path):
    write_results(tmp_path, {"exact_match": 81.2, "f1": 88.56789012345}, as_float32=False)
    assert (tmp_path / "eval_results.txt").read_text() == "exact_match = 81.2\nf1 = 88.56789012345\n"
    write_results(tmp_path, {"test_f1": 0.5}, name="test_results")
    assert (tmp_path / "test_results.txt").read_text() == "test_f1 = 0.5\n"


def test_write_test_results(tmp_path):
    path = tmp_path / "test_results.tsv"
    probs = np.array([[1 / 3, 2 / 3], [0.1, 0.9], [1.0, 0.0]])  # float64 in, float32 str() out
    write_test_results(path, probs, num_examples=3)
    assert path.read_text() == "0.33333334\t0.6666667\n0.1\t0.9\n1.0\t0.0\n"
    write_test_results(path, [2.5, 4.0])  # one value per example (regression)
    assert path.read_text() == "2.5\n4.0\n"
    with pytest.raises(ValueError, match="3 rows of probabilities for 4 test examples"):
        write_test_results(path, probs, num_examples=4)
