"""The README's first command, shortened: every step runs on the built-in data; the terminal shows
progress bars, one warning (the random-init twin) and the result table; the files hold the rest."""

import json
import re

from bert.cli import main


def test_quickstart_runs_every_step_on_builtin_data(tmp_path, capsys):
    out = tmp_path / "qs"
    assert main(["quickstart", f"--output_dir={out}", "--pretrain_steps=4", "--num_train_epochs=0.1"]) == 0
    captured = capsys.readouterr()
    printed = captured.out
    # The table: both fine-tuned models' dev metrics side by side, then the time of every stage.
    header = re.search(r"^ +pre-trained +random init$", printed, flags=re.M)
    assert header, printed
    row = re.search(r"^  eval_accuracy +(\d\.\d{3}) +(\d\.\d{3})$", printed, flags=re.M)
    results = {
        run: json.loads((out / run / "eval_results.json").read_text()) for run in ("classify", "classify_random_init")
    }
    assert row and float(row.group(1)) == round(results["classify"]["eval_accuracy"], 3)
    assert float(row.group(2)) == round(results["classify_random_init"]["eval_accuracy"], 3)
    for stage in ("create-pretraining-data: ", "pretrain: 4 steps", "classify: pre-trained", "classify: random init"):
        assert re.search(rf"^  {re.escape(stage)}.* +\d+ s$", printed, flags=re.M), stage
    for line in (
        "bert create-pretraining-data --input_file=",
        "bert pretrain --bert_config_file=tiny",
        "bert classify --",
    ):
        assert line in printed
    assert len(printed.splitlines()) <= 30
    # Terminal: no INFO lines (no "*** Example ***" dumps); the only warning is the random-init twin's.
    assert "INFO" not in captured.err and "*** Example ***" not in captured.err
    assert [line for line in captured.err.splitlines() if line.startswith("WARNING")] == [
        "WARNING: no --init_checkpoint: the model starts from random weights"
    ]
    # Files: the whole log (the example dumps of every step), per-step logs, results and curves.
    log = (out / "log.txt").read_text()
    assert log.count("*** Example ***") >= 5 + 5 + 5 and "Wrote 14168 total instances" in log
    assert "*** Example ***" in (out / "pretraining_data.log.txt").read_text()
    assert "***** Running training *****" in (out / "classify" / "log.txt").read_text()
    manifest = json.loads((out / "pretraining_data" / "manifest.json").read_text())
    assert manifest["max_seq_length"] == 64
    assert (out / "pretrain" / "model" / "model.safetensors").is_file()
    assert "global_step = 4" in (out / "pretrain" / "eval_results.txt").read_text()
    for run in ("classify", "classify_random_init"):
        assert results[run]["global_step"] == 6  # int(2000 / 32 * 0.1)
        assert (out / run / "curves.png").is_file()
    # the comparison plot draws both fine-tuning runs, under the table's names
    drawn = json.loads((out / "curves.json").read_text())
    assert [r["label"] for r in drawn["runs"]] == ["pre-trained", "random init"]
    # the fine-tuned model starts from the pre-trained weights, the other one does not
    assert json.loads((out / "classify" / "args.json").read_text())["args"]["init_checkpoint"].endswith("model")
