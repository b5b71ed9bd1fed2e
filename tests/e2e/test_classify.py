"""`bert classify` end to end on a tiny random model: MRPC with the README flags (step arithmetic, the
original's output files), STS-B regression, own files, dynamic padding equal to padding to
max_seq_length, evaluation during training with the best checkpoint and early stopping, resuming a
finished run, and bad input (exit 2, one line, nothing written)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from bert.commands.classify import ClassifyArgs, run_classify
from bert.metrics import f1_binary
from conftest import (
    args_for,
    assert_model_card,
    assert_same_weights,
    check_curves,
    cli_error,
    glue_slice,
    model_flags,
    read_metrics,
    read_results,
    read_tsv,
    read_weights,
    shared_path,
    write_tiny_config,
)

README_FLAGS = dict(
    do_train=True,
    do_eval=True,
    do_predict=True,
    max_seq_length=128,
    train_batch_size=32,
    learning_rate=2e-5,
    num_train_epochs=3.0,
)
ORIGINAL_KEYS = {"eval_accuracy", "eval_loss", "global_step", "loss"}


def mrpc_args(model_files, data_dir, output_dir, **flags) -> ClassifyArgs:
    return args_for(ClassifyArgs, model_files, output_dir, **{"task_name": "MRPC", "data_dir": str(data_dir), **flags})


def check_mrpc_outputs(out: Path, steps: int, n_dev: int) -> dict[str, str]:
    results = read_results(out / "eval_results.txt")
    assert set(results) == ORIGINAL_KEYS | {"eval_f1"}
    assert results["global_step"] == str(steps)
    probs = read_tsv(out / "test_results.tsv")
    assert probs.shape == (1725, 2)  # one line per test example, no header
    np.testing.assert_allclose(probs.sum(1), 1.0, atol=1e-5)
    saved = json.loads((out / "eval_results.json").read_text())  # the same results at full precision
    assert saved.keys() == results.keys() and saved["global_step"] == steps
    assert all(str(np.float32(saved[k])) == results[k] for k in results if k != "global_step")
    assert "***** Running training *****" in (out / "log.txt").read_text()
    assert json.loads((out / "args.json").read_text())["command"] == "classify"
    assert read_metrics(out)[-1]["step"] == steps
    # eval_accuracy is the share of dev predictions equal to the gold label: a multiple of 1/n_dev.
    assert float(results["eval_accuracy"]) * n_dev == pytest.approx(round(float(results["eval_accuracy"]) * n_dev))
    # The dev set has batches of 8: the Estimator's `loss` is the mean of equal batches' means.
    if n_dev % 8 == 0:
        assert abs(float(results["loss"]) - float(results["eval_loss"])) < 1e-5
    return results


def test_the_readme_flags_give_343_steps_on_mrpc(model_files, tmp_path):
    """The README's MRPC command: 3668 examples, batch 32, 3 epochs -> global_step = 343, warmup 34; computed
    (with every file read and checked) before anything is written or trained."""
    from bert.distributed import DistContext
    from bert.finetune import _FinetuneRun
    from bert.tasks.classification import ClassificationTask

    args = mrpc_args(model_files, shared_path("data", "glue", "MRPC"), tmp_path / "out", **README_FLAGS)
    run = _FinetuneRun(args, ClassificationTask(args), DistContext(torch.device("cpu")))
    assert (run.total_steps, run.warmup_steps) == (343, 34)
    assert len(run.train_examples) == 3668 and len(run.dev_examples) == 408 and len(run.test_examples) == 1725
    assert not (tmp_path / "out").exists()


def test_the_short_form_flags_keep_the_head_of_each_split(model_files, tmp_path):
    """--max_train_examples and --max_eval_examples (the README's shortened recipes): the first N examples of
    the training split, the first M of dev and test, and the steps of N examples."""
    from bert.distributed import DistContext
    from bert.finetune import _FinetuneRun
    from bert.tasks.classification import ClassificationTask

    flags = {**README_FLAGS, "max_train_examples": 320, "max_eval_examples": 100}
    args = mrpc_args(model_files, shared_path("data", "glue", "MRPC"), tmp_path / "out", **flags)
    run = _FinetuneRun(args, ClassificationTask(args), DistContext(torch.device("cpu")))
    full = ClassificationTask(args)
    full.setup(None, True)
    assert [e.guid for e in run.train_examples] == [e.guid for e in full.read_examples("train")[:320]]
    assert [e.guid for e in run.dev_examples] == [e.guid for e in full.read_examples("dev")[:100]]
    assert len(run.test_examples) == 100
    assert run.total_steps == 30  # int(320 / 32 x 3)


def test_mrpc_end_to_end_then_rerun(model_files, tmp_path):
    """The README's MRPC command on the whole data, cut to 5 steps (0.05 epochs): the original's files, then a
    rerun that resumes the finished training and repeats no step."""
    mrpc = shared_path("data", "glue", "MRPC")
    out = tmp_path / "out"
    flags = {**README_FLAGS, "num_train_epochs": 0.05}
    result = run_classify(mrpc_args(model_files, mrpc, out, **flags))
    steps = int(3668 / 32 * 0.05)
    assert result["num_train_steps"] == result["global_step"] == steps == 5
    results = check_mrpc_outputs(out, steps, 408)
    assert_model_card(out, "classify", "text-classification", "--task_name=MRPC", "--num_train_epochs=0.05")

    # The dev metrics are those of the model saved in model/: recompute them from its logits.
    from bert.modeling import BertForSequenceClassification

    model = BertForSequenceClassification.from_pretrained(out / "model")
    assert model.num_labels == 2 and model.config.extra["id2label"] == {"0": "0", "1": "1"}
    assert json.loads((out / "model" / "tokenizer_config.json").read_text())["do_lower_case"] is True
    vocab = out / "model" / "vocab.txt"
    logits, gold = _logits(model, mrpc, "dev", vocab), _dev_gold(mrpc)
    preds = logits.argmax(1)
    assert float(results["eval_f1"]) == pytest.approx(f1_binary(preds, gold), abs=1e-6)
    assert float(results["eval_accuracy"]) == pytest.approx(np.mean(preds == gold), abs=1e-6)
    cross_entropy = np.log(np.exp(logits).sum(1)) - logits[np.arange(len(gold)), gold]
    assert float(results["eval_loss"]) == pytest.approx(cross_entropy.mean(), rel=1e-4)
    # test_results.tsv holds the softmax of the model's test logits, in input order.
    test = _logits(model, mrpc, "test", vocab, limit=40)
    probs = np.exp(test) / np.exp(test).sum(1, keepdims=True)
    np.testing.assert_allclose(read_tsv(out / "test_results.tsv")[:40], probs, atol=1e-5)

    # A second run with the same output_dir resumes the finished training: no step is repeated.
    ckpt = out / f"checkpoint-{steps}"
    stamp = (ckpt / "training_state.pt").stat().st_mtime_ns
    metrics = (out / "metrics.jsonl").read_text()
    eval_txt, test_tsv = (out / "eval_results.txt").read_text(), (out / "test_results.tsv").read_text()
    again = run_classify(mrpc_args(model_files, mrpc, out, **flags))
    assert "train" not in again and again["global_step"] == steps
    assert (ckpt / "training_state.pt").stat().st_mtime_ns == stamp
    assert (out / "metrics.jsonl").read_text() == metrics
    assert (out / "eval_results.txt").read_text() == eval_txt
    assert (out / "test_results.tsv").read_text() == test_tsv


def _dev_gold(data: Path) -> np.ndarray:
    rows = (data / "dev.tsv").read_text(encoding="utf-8-sig").splitlines()[1:]
    return np.array([int(r.split("\t")[0]) for r in rows])


def _logits(model, data: Path, split: str, vocab: Path, limit: int | None = None, task: str = "mrpc") -> np.ndarray:
    """[N, num_labels] float64 logits of `model` on the first `limit` examples of a GLUE task's dev or test set,
    one example at a time, unpadded."""
    from bert.tasks import get_processor
    from bert.tasks.glue import convert_examples_to_features
    from bert.tokenization import FullTokenizer

    tok = FullTokenizer(vocab, do_lower_case=True)
    processor = get_processor(task)
    examples = (processor.get_dev_examples if split == "dev" else processor.get_test_examples)(data)[:limit]
    feats = convert_examples_to_features(examples, processor.get_labels(), 128, tok, pad=False)
    model.eval()
    with torch.no_grad():
        logits = [model(torch.tensor([f.input_ids]), None, torch.tensor([f.segment_ids])).logits[0] for f in feats]
    return torch.stack(logits).double().numpy()


def test_dynamic_padding_equals_padding_to_max_seq_length(model_files, tmp_path):
    """Length-grouped, dynamically padded batches give the predictions of the original's fixed padding,
    in evaluation and prediction and, without dropout, in training too; so do accumulated micro-batches."""
    config, vocab, init = model_files
    no_dropout = write_tiny_config(tmp_path / "no_dropout.json", hidden_dropout_prob=0.0, classifier_dropout=0.0)
    data = glue_slice(shared_path("data", "glue", "MRPC"), tmp_path / "data", train=48, dev=24, test=30)
    runs = {}
    variants = (
        ("dynamic", {}),
        ("fixed", {"pad_to_max_seq_length": True}),
        ("accumulated", {"gradient_accumulation_steps": 2}),  # two micro-batches of 8, each its own padding
    )
    for name, padding in variants:
        out = tmp_path / name
        run_classify(
            mrpc_args(
                (no_dropout, vocab, init),
                data,
                out,
                do_train=True,
                do_eval=True,
                do_predict=True,
                train_batch_size=16,
                num_train_epochs=1.0,
                eval_batch_size=7,
                predict_batch_size=9,
                learning_rate=1e-3,
                log_every=1,
                **({"group_by_length": False} | padding),
            )
        )
        runs[name] = out
    losses = {k: [m["loss"] for m in read_metrics(v)] for k, v in runs.items()}
    assert len(losses["dynamic"]) == 3
    np.testing.assert_allclose(losses["dynamic"], losses["fixed"], rtol=1e-4)
    np.testing.assert_allclose(losses["dynamic"], losses["accumulated"], rtol=1e-4)
    for name in ("fixed", "accumulated"):
        np.testing.assert_allclose(
            read_tsv(runs["dynamic"] / "test_results.tsv"), read_tsv(runs[name] / "test_results.tsv"), atol=1e-5
        )

    # Evaluation alone, with the trained model: grouped + dynamic vs sequential + fixed padding.
    probs = {}
    for name, padding in (("grouped", {}), ("fixed", {"pad_to_max_seq_length": True, "group_by_length": False})):
        out = tmp_path / f"eval-{name}"
        result = run_classify(
            mrpc_args((config, vocab, runs["dynamic"] / "model"), data, out, do_eval=True, do_predict=True, **padding)
        )
        probs[name] = read_tsv(out / "test_results.tsv")
        assert result["eval"]["global_step"] == 0
    np.testing.assert_allclose(probs["grouped"], probs["fixed"], atol=1e-5)
    assert (probs["grouped"].argmax(1) == probs["fixed"].argmax(1)).all()


def test_resuming_from_a_middle_checkpoint_is_exact(model_files, tmp_path):
    """A run restarted from its step-2 checkpoint (as after a crash) ends with the uninterrupted run's weights:
    the same batches (length-grouped), the same dropout (RNG states restored), the same optimizer state."""
    data = glue_slice(shared_path("data", "glue", "MRPC"), tmp_path / "data", train=64, dev=8)
    flags = dict(do_train=True, train_batch_size=8, num_train_epochs=0.5, save_checkpoints_steps=2)
    full, resumed = tmp_path / "full", tmp_path / "resumed"
    run_classify(mrpc_args(model_files, data, full, keep_checkpoint_max=0, log_every=1, **flags))
    assert (full / "checkpoint-2").is_dir()
    resumed.mkdir()
    shutil.copytree(full / "checkpoint-2", resumed / "checkpoint-2")
    result = run_classify(mrpc_args(model_files, data, resumed, log_every=1, **flags))
    assert result["global_step"] == 4
    assert_same_weights(read_weights(full / "model"), read_weights(resumed / "model"))
    assert [m["loss"] for m in read_metrics(resumed)] == [m["loss"] for m in read_metrics(full)][2:]


def test_stsb_trains_as_regression(model_files, tmp_path):
    data = glue_slice(shared_path("data", "glue", "STS-B"), tmp_path / "data", train=96, dev=40, test=30)
    out = tmp_path / "out"
    result = run_classify(
        mrpc_args(
            model_files,
            data,
            out,
            task_name="STS-B",
            do_train=True,
            do_eval=True,
            do_predict=True,
            train_batch_size=16,
            num_train_epochs=1.0,
            learning_rate=1e-3,
        )
    )
    results = read_results(out / "eval_results.txt")
    assert set(results) == {"eval_corr", "eval_loss", "eval_pearson", "eval_spearman", "global_step", "loss"}
    assert results["global_step"] == "6"
    scores = read_tsv(out / "test_results.tsv")
    assert scores.shape == (30, 1)
    from bert.modeling import BertForSequenceClassification

    model = BertForSequenceClassification.from_pretrained(out / "model")
    assert model.num_labels == 1
    # eval_loss is the mean squared error of the saved model's dev scores; test_results.tsv holds its test scores.
    vocab = out / "model" / "vocab.txt"
    dev = _logits(model, data, "dev", vocab, task="sts-b")[:, 0]
    gold = np.array([float(line.split("\t")[-1]) for line in (data / "dev.tsv").read_text().splitlines()[1:]])
    assert result["eval"]["eval_loss"] == pytest.approx(np.mean((dev - gold) ** 2), rel=1e-4)
    np.testing.assert_allclose(scores[:, 0], _logits(model, data, "test", vocab, task="sts-b")[:, 0], atol=1e-5)


def test_generic_task_reads_own_files_and_keeps_its_labels(model_files, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    words = ["good", "bad", "fine", "awful", "great", "poor"]
    rows = [f"id{i}\tthe film was {words[i % 6]}\t{'pos' if i % 2 == 0 else 'neg'}" for i in range(48)]
    (data / "train.tsv").write_text("id\ttext\tsentiment\n" + "\n".join(rows[:32]) + "\n")
    (data / "dev.tsv").write_text("id\ttext\tsentiment\n" + "\n".join(rows[32:]) + "\n")
    flags = dict(task_name="generic", text_a_column="text", label_column="sentiment", has_header=True)
    out = tmp_path / "out"
    run_classify(
        mrpc_args(
            model_files,
            data,
            out,
            do_train=True,
            do_eval=True,
            train_batch_size=8,
            num_train_epochs=1.0,
            learning_rate=1e-3,
            **flags,
        )
    )
    saved = json.loads((out / "model" / "config.json").read_text())
    assert saved["id2label"] == {"0": "neg", "1": "pos"}  # sorted labels of the training file
    first = read_results(out / "eval_results.txt")
    assert set(first) == ORIGINAL_KEYS and first["global_step"] == "4"
    # Evaluation alone reads the labels saved with the model: no training file needed.
    (data / "train.tsv").unlink()
    run_classify(mrpc_args(model_files, data, out, do_eval=True, **flags))
    again = read_results(out / "eval_results.txt")
    assert again == first


def test_eval_every_steps_keeps_the_best_checkpoint_and_stops_early(model_files, tmp_path):
    data = glue_slice(shared_path("data", "glue", "MRPC"), tmp_path / "data", train=96, dev=24)
    out = tmp_path / "out"
    flags = dict(
        do_train=True,
        do_eval=True,
        train_batch_size=8,
        num_train_epochs=1.0,  # 12 steps
        learning_rate=1e-9,  # predictions never change, so the first evaluation stays the best
        eval_every_steps=2,
        early_stopping_patience=2,
        metric_for_best_model="eval_accuracy",
    )
    result = run_classify(mrpc_args(model_files, data, out, **flags))
    history = json.loads((out / "eval_history.json").read_text())
    assert [e["step"] for e in history["evaluations"]] == [2, 4, 6]
    assert history["best_step"] == 2 and history["stopped_at"] == 6
    assert result["global_step"] == 2 and read_results(out / "eval_results.txt")["global_step"] == "2"
    assert json.loads((out / "model" / "finetune_state.json").read_text())["global_step"] == 2
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-6"]
    evals = [m for m in read_metrics(out) if "eval_accuracy" in m]
    assert [e["step"] for e in evals] == [2, 4, 6]
    # The curves: the evaluations over steps (the final one, of the best step 2, is not drawn twice).
    assert check_curves(out)["runs"][0]["eval"]["eval_accuracy"]["steps"] == [2, 4, 6]
    # A rerun sees the early stop and trains no further.
    again = run_classify(mrpc_args(model_files, data, out, **flags))
    assert "train" not in again and again["global_step"] == 2
    assert not (out / "checkpoint-8").exists()


def test_bad_input_fails_before_writing(model_files, tmp_path, capsys):
    config, vocab, init = model_files
    mrpc = shared_path("data", "glue", "MRPC")
    out = tmp_path / "out"
    common = model_flags(model_files, out)

    def data_with(name: str, text: str, base: Path = mrpc) -> str:
        d = tmp_path / f"data-{len(list(tmp_path.iterdir()))}"
        glue_slice(base, d, train=20, dev=10, test=10)
        (d / name).write_text(text, encoding="utf-8")
        return str(d)

    header = "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n"
    short_row = data_with("train.tsv", header + "1\t2\tonly three\n")
    bad_label = data_with("dev.tsv", header + "7\t1\t2\ta\tb\n")
    empty = data_with("train.tsv", "")
    no_header = data_with("test.tsv", "0\t1\t2\ta\tb\n")
    cases = {
        "no do_*": (["--task_name=MRPC", f"--data_dir={mrpc}"], "do_train"),
        "missing columns": (["--task_name=MRPC", "--do_train", f"--data_dir={short_row}"], "train.tsv:2: expected"),
        "label not in list": (["--task_name=MRPC", "--do_eval", f"--data_dir={bad_label}"], "label '7'"),
        "empty file": (["--task_name=MRPC", "--do_train", f"--data_dir={empty}"], "is empty"),
        "test.tsv without header": (["--task_name=MRPC", "--do_predict", f"--data_dir={no_header}"], "header line"),
        "unknown task": (["--task_name=nope", "--do_train", f"--data_dir={mrpc}"], "Task not found"),
        "too long": (["--task_name=MRPC", "--do_train", f"--data_dir={mrpc}", "--max_seq_length=512"], "512"),
        "casing": (["--task_name=MRPC", "--do_train", f"--data_dir={mrpc}", "--do_lower_case=false"], "do_lower_case"),
        "tpu": (["--task_name=MRPC", "--do_train", f"--data_dir={mrpc}", "--use_tpu=true"], "use_tpu"),
        "column flag": (["--task_name=MRPC", "--do_train", f"--data_dir={mrpc}", "--label_column=0"], "generic"),
    }
    for name, (argv, expected) in cases.items():
        err = cli_error(capsys, "classify", *argv, *common)
        assert expected in err, (name, err)
        assert not out.exists(), f"{name}: {out} was written"

    small = tmp_path / "small_vocab_config.json"
    small.write_text(config.read_text().replace("30522", "1000"))
    argv = ["--task_name=MRPC", "--do_train", f"--data_dir={mrpc}", *common, f"--bert_config_file={small}"]
    err = cli_error(capsys, "classify", *argv)
    assert "vocab_size" in err and not out.exists()
