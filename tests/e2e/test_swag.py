"""`bert swag` end to end on a tiny random model and the hand-written SWAG fixtures, and bad input."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from bert.commands.swag import SwagArgs, run_swag
from bert.tasks.swag import convert_swag_examples_to_features, read_swag_examples, swag_features_to_arrays
from bert.tokenization import FullTokenizer
from conftest import (
    FIXTURES,
    args_for,
    check_curves,
    cli_error,
    model_flags,
    read_results,
    read_tsv,
)

SWAG = FIXTURES / "tasks" / "swag"


# conftest's model_files: the uncased vocab, attention dropout on.
TINY_MODEL = dict(attention_probs_dropout_prob=0.1, max_position_embeddings=64)


def swag_args(model_files, output_dir, **flags) -> SwagArgs:
    return args_for(SwagArgs, model_files, output_dir, **{"data_dir": str(SWAG), "max_seq_length": 64, **flags})


def test_swag_on_the_fixtures(model_files, tmp_path):
    out = tmp_path / "out"
    flags = dict(do_train=True, do_eval=True, do_predict=True, train_batch_size=2, num_train_epochs=2.0)
    result = run_swag(swag_args(model_files, out, learning_rate=1e-3, **flags))
    assert result["global_step"] == 4  # int(4 examples / 2 x 2 epochs)
    results = read_results(out / "eval_results.txt")
    assert set(results) == {"eval_accuracy", "eval_loss", "global_step", "loss"}
    assert results["global_step"] == "4" and float(results["eval_accuracy"]) in (0.0, 0.5, 1.0)
    assert set(check_curves(out)["runs"][0]["eval"]) == {"eval_accuracy", "eval_loss"}
    # test_results.tsv: one line per test example, the four endings' probabilities.
    probs = read_tsv(out / "test_results.tsv")
    assert probs.shape == (2, 4)
    np.testing.assert_allclose(probs.sum(1), 1.0, atol=1e-5)

    from bert.modeling import BertForMultipleChoice

    model = BertForMultipleChoice.from_pretrained(out / "model")
    assert model.classifier.out_features == 1
    # The dev metrics and the test probabilities are those of the saved model's choice logits.
    logits, labels = _choice_logits(model, "val.csv", out / "model" / "vocab.txt")
    assert float(results["eval_accuracy"]) == np.mean(logits.argmax(1) == labels)
    cross_entropy = np.log(np.exp(logits).sum(1)) - logits[np.arange(len(labels)), labels]
    assert float(results["eval_loss"]) == pytest.approx(cross_entropy.mean(), rel=1e-4)
    test, _ = _choice_logits(model, "test.csv", out / "model" / "vocab.txt")
    np.testing.assert_allclose(probs, np.exp(test) / np.exp(test).sum(1, keepdims=True), atol=1e-5)
    assert (probs.argmax(1) == test.argmax(1)).all()

    # Predictions of padding to max_seq_length, in input order, equal the grouped, dynamically padded ones.
    fixed = tmp_path / "fixed"
    trained = dict(init_checkpoint=str(out / "model"), do_predict=True)
    run_swag(swag_args(model_files, fixed, **trained, pad_to_max_seq_length=True, group_by_length=False))
    again = tmp_path / "again"
    run_swag(swag_args(model_files, again, **trained, predict_batch_size=1))
    np.testing.assert_allclose(read_tsv(fixed / "test_results.tsv"), read_tsv(again / "test_results.tsv"), atol=1e-5)
    np.testing.assert_allclose(read_tsv(again / "test_results.tsv"), probs, atol=1e-5)


def _choice_logits(model, name: str, vocab: Path) -> tuple[np.ndarray, np.ndarray]:
    """The model's [N, 4] float64 logits on a SWAG fixture file, one example at a time, and the labels."""
    examples = read_swag_examples(SWAG / name, has_label=name != "test.csv")
    features = convert_swag_examples_to_features(examples, 64, FullTokenizer(vocab), pad=False)
    model.eval()
    logits = []
    with torch.no_grad():
        for f in features:
            a = {k: torch.from_numpy(v) for k, v in swag_features_to_arrays([f]).items()}
            logits.append(model(a["input_ids"], a["input_mask"], a["segment_ids"]).logits[0].double())
    return torch.stack(logits).numpy(), np.array([f.label for f in features])


def test_bad_swag_input(model_files, tmp_path, capsys):
    out = tmp_path / "out"
    data = tmp_path / "data"
    shutil.copytree(SWAG, data)
    rows = (data / "val.csv").read_text().splitlines()
    (data / "val.csv").write_text("\n".join([rows[0], rows[1][: rows[1].rindex(",")] + ",7"]) + "\n")
    err = cli_error(
        capsys, "swag", f"--data_dir={data}", *model_flags(model_files, out), "--do_eval", "--max_seq_length=64"
    )
    assert "val.csv:2: label '7'" in err
    assert not out.exists()
