"""The README's first command, shortened: every step runs on the built-in data and prints its results."""

import json

from bert.cli import main


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
    assert (out / "pretrain" / "model" / "model.safetensors").is_file()
    assert "global_step = 4" in (out / "pretrain" / "eval_results.txt").read_text()
    for run in ("classify", "classify_random_init"):
        results = (out / run / "eval_results.txt").read_text()
        assert "eval_accuracy" in results and "global_step = 6" in results  # int(2000 / 32 * 0.1)
    # the fine-tuned model starts from the pre-trained weights, the other one does not
    assert json.loads((out / "classify" / "args.json").read_text())["args"]["init_checkpoint"].endswith("model")
