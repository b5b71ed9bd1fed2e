"""`bert swag` end to end on a tiny random model and the hand-written SWAG fixtures, and bad input."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from bert.cli import main as cli_main
from bert.commands.swag import SwagArgs, run_swag
from conftest import FIXTURES, check_curves, save_tiny_model, shared_path

SWAG = FIXTURES / "tasks" / "swag"


@pytest.fixture(scope="module")
def model_files(tmp_path_factory):
    """(config file, vocab file, init checkpoint): a random tiny model with the uncased vocab."""
    vocab = shared_path("data", "vocab", "uncased.txt")
    return save_tiny_model(
        tmp_path_factory.mktemp("tiny"), vocab, True, attention_probs_dropout_prob=0.1, max_position_embeddings=64
    )


def args_for(model_files, data_dir, output_dir, **kw) -> SwagArgs:
    config, vocab, init = model_files
    base = dict(
        data_dir=str(data_dir),
        output_dir=str(output_dir),
        vocab_file=str(vocab),
        bert_config_file=str(config),
        init_checkpoint=str(init),
        max_seq_length=64,
        device="cpu",
    )
    return SwagArgs(**{**base, **kw})


def read_tsv(output_dir: Path) -> np.ndarray:
    lines = (output_dir / "test_results.tsv").read_text().splitlines()
    return np.array([[float(x) for x in line.split("\t")] for line in lines])


def test_swag_on_the_fixtures(model_files, tmp_path):
    out = tmp_path / "out"
    flags = dict(do_train=True, do_eval=True, do_predict=True, train_batch_size=2, num_train_epochs=2.0)
    result = run_swag(args_for(model_files, SWAG, out, learning_rate=1e-3, **flags))
    assert result["global_step"] == 4  # int(4 examples / 2 x 2 epochs)
    lines = (out / "eval_results.txt").read_text().splitlines()
    results = dict(line.split(" = ") for line in lines)
    assert set(results) == {"eval_accuracy", "eval_loss", "global_step", "loss"} and lines == sorted(lines)
    assert results["global_step"] == "4" and float(results["eval_accuracy"]) in (0.0, 0.5, 1.0)
    assert set(check_curves(out)["runs"][0]["eval"]) == {"eval_accuracy", "eval_loss"}
    # test_results.tsv: one line per test example, the four endings' probabilities.
    probs = read_tsv(out)
    assert probs.shape == (2, 4)
    np.testing.assert_allclose(probs.sum(1), 1.0, atol=1e-5)

    from bert.modeling import BertForMultipleChoice

    model = BertForMultipleChoice.from_pretrained(out / "model")
    assert model.classifier.out_features == 1

    # Predictions of padding to max_seq_length, in input order, equal the grouped, dynamically padded ones.
    fixed = tmp_path / "fixed"
    trained = dict(init_checkpoint=str(out / "model"), do_predict=True)
    run_swag(args_for(model_files, SWAG, fixed, **trained, pad_to_max_seq_length=True, group_by_length=False))
    again = tmp_path / "again"
    run_swag(args_for(model_files, SWAG, again, **trained, predict_batch_size=1))
    np.testing.assert_allclose(read_tsv(fixed), read_tsv(again), atol=1e-5)
    np.testing.assert_allclose(read_tsv(again), probs, atol=1e-5)


def test_bad_swag_input(model_files, tmp_path, capsys):
    config, vocab, init = model_files
    out = tmp_path / "out"
    data = tmp_path / "data"
    shutil.copytree(SWAG, data)
    rows = (data / "val.csv").read_text().splitlines()
    (data / "val.csv").write_text("\n".join([rows[0], rows[1][: rows[1].rindex(",")] + ",7"]) + "\n")
    argv = [f"--data_dir={data}", f"--vocab_file={vocab}", f"--bert_config_file={config}"]
    argv += [f"--init_checkpoint={init}", f"--output_dir={out}", "--do_eval", "--device=cpu", "--max_seq_length=64"]
    code = cli_main(["swag", *argv])
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("bert swag: error:")]
    assert code == 2 and len(err) == 1 and "val.csv:2: label '7'" in err[0], err
    assert not out.exists()
