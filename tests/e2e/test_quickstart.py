"""The README's first command, shortened: every step runs on the built-in data and prints its results."""

import json

import pytest

from bert.cli import main
from conftest import assert_same_weights, read_results, read_weights


def test_quickstart_runs_every_step_on_builtin_data(tmp_path, capsys):
    out = tmp_path / "qs"
    assert main(["quickstart", f"--output_dir={out}", "--pretrain_steps=4", "--num_train_epochs=0.1"]) == 0
    printed = capsys.readouterr().out
    assert printed.count("***** Eval results") == 3
    for line in (
        "masked_lm_accuracy = ",
        "eval_accuracy = ",
        "bert create-pretraining-data --input_file=",
        "bert pretrain --bert_config_file=tiny",
        "bert classify --data_dir=",
    ):
        assert line in printed
    manifest = json.loads((out / "pretraining_data" / "manifest.json").read_text())
    assert manifest["max_seq_length"] == 64
    # The exported model is the last checkpoint's.
    assert_same_weights(read_weights(out / "pretrain" / "checkpoint-4"), read_weights(out / "pretrain" / "model"))
    assert "global_step = 4" in (out / "pretrain" / "eval_results.txt").read_text()
    # The printed accuracies are those of the runs' eval_results.txt, and so is the printed gain.
    printed_accuracy = [float(line.split(" = ")[1]) for line in printed.splitlines() if "  eval_accuracy = " in line]
    accuracy = []
    for run in ("classify", "classify_random_init"):
        results = read_results(out / run / "eval_results.txt")
        assert results["global_step"] == "6"  # int(2000 / 32 * 0.1)
        accuracy.append(float(results["eval_accuracy"]))
    assert printed_accuracy == pytest.approx(accuracy, abs=1e-6)
    assert f"Pre-training changed dev accuracy by {printed_accuracy[0] - printed_accuracy[1]:+.3f}" in printed
    # the fine-tuned model starts from the pre-trained weights, the other one does not
    assert json.loads((out / "classify" / "args.json").read_text())["args"]["init_checkpoint"].endswith("model")
