"""`bert classify --teacher`: knowledge distillation end to end on tiny models (`bert.distillation`).

The teacher is a tiny classifier with another vocabulary and casing than the student (the released cased
vocabulary, the student uncased) whose classifier bias makes it answer "1" for every input, so that what the
student learns from it is plain to see: with --distill_alpha=1 the student's labels are the teacher's alone.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from bert.commands.classify import ClassifyArgs, run_classify
from conftest import (
    args_for,
    assert_same_weights,
    cli_error,
    glue_slice,
    model_flags,
    read_metrics,
    read_results,
    read_tsv,
    read_weights,
    save_model_dir,
    shared_path,
    vocab_config,
    write_tiny_config,
)

FAST = dict(max_seq_length=32, train_batch_size=8, learning_rate=2e-3, eval_batch_size=16, predict_batch_size=16)


@pytest.fixture(scope="module")
def sst2(tmp_path_factory) -> Path:
    return glue_slice(shared_path("data", "glue", "SST-2"), tmp_path_factory.mktemp("sst2"), train=24, dev=16, test=40)


@pytest.fixture(scope="module")
def teacher(tmp_path_factory) -> Path:
    """A cased 2-label SST-2 classifier, as `bert classify` saves one, that prefers label "1" for every text."""
    from bert.modeling import BertForSequenceClassification

    vocab = shared_path("data", "vocab", "cased.txt")
    torch.manual_seed(1)
    model = BertForSequenceClassification(vocab_config(vocab, max_position_embeddings=64), num_labels=2)
    with torch.no_grad():
        model.classifier.bias.copy_(torch.tensor([-2.0, 2.0]))
    labels = {"id2label": {"0": "0", "1": "1"}, "label2id": {"0": 0, "1": 1}}
    directory = tmp_path_factory.mktemp("teacher") / "model"
    return save_model_dir(
        model,
        directory,
        vocab,
        do_lower_case=False,
        problem_type="single_label_classification",
        max_seq_length=32,
        **labels,
    )


def student_args(model_files, sst2: Path, out: Path, **flags) -> ClassifyArgs:
    base = dict(task_name="SST-2", data_dir=str(sst2), do_train=True, num_train_epochs=2.0, **FAST)
    return args_for(ClassifyArgs, model_files, out, **{**base, **flags})


def teacher_probability(out: Path) -> float:
    """The mean probability of label "1" (the teacher's answer) in a run's test_results.tsv."""
    return float(read_tsv(out / "test_results.tsv")[:, 1].mean())


def test_student_learns_the_teachers_labels(model_files, sst2, teacher, tmp_path):
    transfer = sst2 / "test.tsv"
    untrained = run_classify(student_args(model_files, sst2, tmp_path / "untrained", do_train=False, do_predict=True))
    assert untrained["global_step"] == 0
    plain = student_args(model_files, sst2, tmp_path / "plain", do_predict=True)
    run_classify(plain)
    distilled = student_args(
        model_files,
        sst2,
        tmp_path / "distilled",
        do_eval=True,
        do_predict=True,
        teacher=str(teacher),
        transfer_file=str(transfer),
        distill_alpha=1.0,
        temperature=2.0,
    )
    result = run_classify(distilled)
    out = tmp_path / "distilled"
    # Steps count the transfer examples: (24 train + 40 transfer) / 8 x 2 epochs.
    assert result["num_train_steps"] == result["global_step"] == 16
    assert (out / "model" / "model.safetensors").is_file()
    assert set(read_results(out / "eval_results.txt")) >= {"eval_accuracy", "eval_loss", "global_step"}
    assert all("kd_loss" in line for line in read_metrics(out) if "loss" in line)
    cached = list((out / "teacher_cache").glob("*.npy"))
    assert len(cached) == 1 and np.load(cached[0]).shape == (24 + 40, 2)
    # The teacher answers "1" everywhere; the distilled student moves there, the label-trained one does not.
    before, labels_only, after = (teacher_probability(tmp_path / n) for n in ("untrained", "plain", "distilled"))
    assert after > 0.8 > max(before, labels_only), (before, labels_only, after)
    # And answers as the teacher does nearly everywhere (an untrained head's argmax is one label for all rows on
    # this tiny model, the teacher's or not as its draw falls: no baseline).
    assert (read_tsv(out / "test_results.tsv").argmax(1) == 1).mean() >= 0.9


def test_max_train_examples_cuts_the_transfer_set_too(model_files, sst2, teacher, tmp_path):
    """--max_train_examples=N keeps the first N training and the first N transfer examples (the teacher
    labels only those)."""
    flags = dict(teacher=str(teacher), transfer_file=str(sst2 / "test.tsv"), max_train_examples=16)
    result = run_classify(student_args(model_files, sst2, tmp_path / "out", **flags))
    assert result["num_train_steps"] == 8  # (16 train + 16 transfer) / 8 x 2 epochs
    (cached,) = (tmp_path / "out" / "teacher_cache").glob("*.npy")
    assert np.load(cached).shape == (16 + 16, 2)


def test_cached_teacher_gives_the_same_student(model_files, sst2, teacher, tmp_path, caplog):
    cache = tmp_path / "cache"
    flags = dict(teacher=str(teacher), transfer_file=str(sst2 / "test.tsv"), teacher_cache_dir=str(cache))
    run_classify(student_args(model_files, sst2, tmp_path / "a", **flags))
    (array,) = cache.glob("*.npy")
    written = array.stat().st_mtime_ns
    caplog.clear()
    with caplog.at_level("INFO", logger="bert.distillation"):
        run_classify(student_args(model_files, sst2, tmp_path / "b", **flags))
    assert "64 cached outputs" in caplog.text and "computed" not in caplog.text
    assert array.stat().st_mtime_ns == written
    assert_same_weights(read_weights(tmp_path / "a" / "model"), read_weights(tmp_path / "b" / "model"))


def test_reduced_precision_teacher_is_cached_apart_and_close_to_float32(model_files, sst2, teacher, tmp_path):
    """--teacher_quantize=int8 and --teacher_dtype=bfloat16 run the teacher as `bert predict --quantize` and
    `--dtype` do: outputs near float32's, in cache files of their own (a float32 run's file is never reused)."""
    from bert.cpu_kernels import bf16_in_hardware
    from bert.inference import Predictor

    cache = tmp_path / "cache"
    flags = dict(teacher=str(teacher), transfer_file=str(sst2 / "test.tsv"), teacher_cache_dir=str(cache))
    run_classify(student_args(model_files, sst2, tmp_path / "f32", **flags))
    (full,) = cache.glob("*.npy")
    run_classify(student_args(model_files, sst2, tmp_path / "int8", teacher_quantize="int8", **flags))
    (int8,) = set(cache.glob("*.npy")) - {full}
    expected = Predictor.from_pretrained(teacher, device="cpu", quantize="int8").classification_logits(
        [(line.split("\t")[0], None) for line in (sst2 / "train.tsv").read_text().splitlines()[1:]]
    )
    # Dynamic int8 scales each batch's activations by its own range, so other batches differ in the 4th digit.
    got = np.load(int8)[: len(expected)]
    np.testing.assert_allclose(got, expected, atol=1e-3)
    assert np.abs(got - expected).max() < np.abs(got - np.load(full)[: len(expected)]).max()
    np.testing.assert_allclose(np.load(int8), np.load(full), atol=0.1)
    if bf16_in_hardware():  # elsewhere bfloat16 is emulated and only warned about
        run_classify(student_args(model_files, sst2, tmp_path / "bf16", teacher_dtype="bfloat16", **flags))
        (bf16,) = set(cache.glob("*.npy")) - {full, int8}
        np.testing.assert_allclose(np.load(bf16), np.load(full), atol=0.1)


def test_teacher_precision_flags_need_outputs_to_learn(model_files, sst2, teacher, tmp_path, capsys):
    data = [f"--data_dir={sst2}", "--task_name=sst-2", "--do_train", "--max_seq_length=32"]
    out = tmp_path / "out"
    flags = [*model_flags(model_files, out), *data]
    error = cli_error(capsys, "classify", *flags, "--teacher_quantize=int8")
    assert "--teacher_quantize=int8 needs --teacher=MODEL" in error
    error = cli_error(
        capsys, "classify", *flags, f"--teacher={teacher}", "--teacher_quantize=int8", "--teacher_dtype=bfloat16"
    )
    assert "--teacher_quantize=int8 and --teacher_dtype=bfloat16 are two ways to a faster model" in error
    no_init = [f for f in flags if not f.startswith(("--init_checkpoint", "--bert_config_file", "--vocab_file"))]
    layers_only = [f"--teacher={teacher}", "--init_from_teacher_layers=1", "--distill_alpha=0", "--do_lower_case=false"]
    error = cli_error(capsys, "classify", *no_init, *layers_only, "--teacher_dtype=bfloat16")
    assert "--teacher_dtype=bfloat16: no teacher output is learned here" in error
    assert not out.exists()


def test_resumed_distillation_equals_an_uninterrupted_one(model_files, sst2, teacher, tmp_path):
    flags = dict(teacher=str(teacher), transfer_file=str(sst2 / "test.tsv"), save_checkpoints_steps=6)
    run_classify(student_args(model_files, sst2, tmp_path / "whole", **flags))
    cut = tmp_path / "cut"
    run_classify(student_args(model_files, sst2, cut, keep_checkpoint_max=0, **flags))
    # A run killed after step 12 (checkpoints every 6 steps): the last checkpoint and model gone, the cache kept.
    shutil.rmtree(cut / "checkpoint-16")
    shutil.rmtree(cut / "model")
    run_classify(student_args(model_files, sst2, cut, keep_checkpoint_max=0, **flags))
    assert "resuming from" in (cut / "log.txt").read_text()
    assert_same_weights(read_weights(tmp_path / "whole" / "model"), read_weights(cut / "model"))


def test_student_from_teacher_layers(model_files, sst2, teacher, tmp_path):
    from bert.distributed import DistContext
    from bert.finetune import _FinetuneRun
    from bert.tasks.classification import ClassificationTask

    args = student_args(model_files, sst2, tmp_path / "s", init_checkpoint=None, bert_config_file=None)
    args.vocab_file, args.do_lower_case = None, False
    args.teacher, args.init_from_teacher_layers = str(teacher), "1"
    run = _FinetuneRun(args, ClassificationTask(args), DistContext(torch.device("cpu")))
    model, step, _ = run.load_model()
    assert step == 0 and model.config.num_hidden_layers == 1
    assert run.files.start.vocab_file == str(teacher / "vocab.txt")  # the teacher's vocabulary and casing
    teacher_state = read_weights(teacher)
    for name, tensor in model.state_dict().items():
        source = name.replace("encoder.layer.0.", "encoder.layer.1.")
        assert torch.equal(tensor, teacher_state[source]), name
    assert run.teacher is not None  # and it distils
    args.distill_alpha = 0.0
    assert _FinetuneRun(args, ClassificationTask(args), DistContext(torch.device("cpu"))).teacher is None  # layers only


def test_distillation_flag_errors(model_files, sst2, teacher, tmp_path, capsys):
    data = [f"--data_dir={sst2}", "--task_name=sst-2", "--do_train", "--max_seq_length=32"]
    out = tmp_path / "out"
    flags = [*model_flags(model_files, out), *data]
    error = cli_error(capsys, "classify", *flags, f"--transfer_file={sst2 / 'test.tsv'}", "--temperature=2")
    assert f"--transfer_file={sst2 / 'test.tsv'}, --temperature=2.0 need --teacher=MODEL" in error
    error = cli_error(capsys, "classify", *flags, f"--teacher={teacher}", "--init_from_teacher_layers=0,2")
    assert "--init_from_teacher_layers and --init_checkpoint" in error
    no_init = [f for f in flags if not f.startswith(("--init_checkpoint", "--bert_config_file", "--vocab_file"))]
    error = cli_error(capsys, "classify", *no_init, f"--teacher={teacher}", "--init_from_teacher_layers=0,2")
    assert "--init_from_teacher_layers=0,2: the teacher has 2 layers" in error
    error = cli_error(capsys, "classify", *flags, f"--teacher={tmp_path / 'nothing'}")
    assert f"--teacher={tmp_path / 'nothing'}: no such model directory or checkpoint" in error
    error = cli_error(capsys, "classify", *flags, f"--teacher={teacher}", f"--transfer_file={tmp_path / 'no.tsv'}")
    assert f"--transfer_file={tmp_path / 'no.tsv'}: no such file" in error
    error = cli_error(capsys, "classify", *flags, f"--teacher={teacher}", f"--transfer_file={sst2 / 'train.tsv'}")
    assert "expected the header line of the SST-2 test set" in error  # the test set's layout
    assert not out.exists()


def test_teacher_with_other_labels_is_refused(model_files, sst2, teacher, tmp_path, capsys):
    config = json.loads((teacher / "config.json").read_text())
    other = tmp_path / "other"
    shutil.copytree(teacher, other)
    config["id2label"] = {"0": "neg", "1": "pos"}
    (other / "config.json").write_text(json.dumps(config))
    flags = [*model_flags(model_files, tmp_path / "out"), f"--data_dir={sst2}", "--task_name=sst-2", "--do_train"]
    error = cli_error(capsys, "classify", *flags, f"--teacher={other}")
    assert f"--teacher={other} has the labels ['neg', 'pos'], the student's data ['0', '1']" in error


def test_each_window_gets_its_examples_teacher_logits(model_files, sst2, teacher, tmp_path):
    """With --long_document=windows a text is several features; each carries the teacher's logits of its whole
    example (as `bert predict` computes them), in the student's label order, and transfer windows no label."""
    from bert.distillation import LABELLED_KEY, TEACHER_KEY
    from bert.distributed import DistContext
    from bert.finetune import _FinetuneRun
    from bert.inference import Predictor
    from bert.tasks.classification import ClassificationTask
    from bert.tokenization import FullTokenizer

    args = student_args(
        model_files,
        sst2,
        tmp_path / "s",
        teacher=str(teacher),
        transfer_file=str(sst2 / "test.tsv"),
        long_document="windows",
        max_seq_length=12,
        doc_stride=4,
    )
    run = _FinetuneRun(args, ClassificationTask(args), DistContext(torch.device("cpu")))
    run.tokenizer = FullTokenizer(args.vocab_file, do_lower_case=True)
    train = run.features_of(run.train_examples)
    features, extra = run.distillation_inputs(train)
    n_transfer = len(features) - len(train)
    assert len(train) > 24 and n_transfer > 40  # long texts became several windows
    examples = run.train_examples + run.transfer_examples
    want = Predictor.from_pretrained(teacher, device="cpu").classification_logits(
        [(e.text_a, e.text_b) for e in examples]
    )
    got = extra(np.arange(len(features)))
    offsets = [0] * len(train) + [len(run.train_examples)] * n_transfer
    rows = [offset + f.example_index for offset, f in zip(offsets, features)]
    np.testing.assert_allclose(got[TEACHER_KEY], want[rows], atol=1e-5)
    np.testing.assert_array_equal(got[LABELLED_KEY], [1.0] * len(train) + [0.0] * n_transfer)


def test_regression_student_learns_the_teachers_scores(model_files, tmp_path):
    """STS-B: the teacher's score is the target (squared error); this teacher scores every pair 4.5."""
    from bert.modeling import BertForSequenceClassification

    stsb = glue_slice(shared_path("data", "glue", "STS-B"), tmp_path / "stsb", train=16, dev=8, test=24)
    _, vocab, _ = model_files
    torch.manual_seed(2)
    model = BertForSequenceClassification(vocab_config(vocab, max_position_embeddings=64), num_labels=1)
    with torch.no_grad():
        model.classifier.weight.zero_()
        model.classifier.bias.fill_(4.5)
    teacher = save_model_dir(model, tmp_path / "teacher", vocab, problem_type="regression", max_seq_length=32)
    flags = dict(task_name="STS-B", data_dir=str(stsb), do_train=True, do_predict=True, num_train_epochs=6.0, **FAST)
    run_classify(args_for(ClassifyArgs, model_files, tmp_path / "plain", **flags))
    distilled = dict(teacher=str(teacher), transfer_file=str(stsb / "test.tsv"), distill_alpha=1.0)
    run_classify(args_for(ClassifyArgs, model_files, tmp_path / "distilled", **flags, **distilled))
    plain, after = (read_tsv(tmp_path / n / "test_results.tsv").mean() for n in ("plain", "distilled"))
    assert abs(after - 4.5) < 1.0 < abs(plain - 4.5), (plain, after)


def test_no_distillation_weight_needs_a_transfer_set_or_layers(model_files, sst2, teacher, tmp_path, capsys):
    flags = [*model_flags(model_files, tmp_path / "out"), f"--data_dir={sst2}", "--task_name=sst-2", "--do_train"]
    error = cli_error(capsys, "classify", *flags, f"--teacher={teacher}", "--distill_alpha=0")
    assert f"--distill_alpha=0 without --transfer_file leaves --teacher={teacher} nothing to do" in error


def test_accumulated_micro_batches_give_the_distillation_loss_of_the_whole_batch(model_files, sst2, teacher, tmp_path):
    """Each micro-batch's share is divided by the global batch's count (the head's `loss_normalizers`), so two
    micro-batches of 8 (labelled and transfer examples mixed) give the loss and steps of one batch of 16."""
    config, vocab, init = model_files
    no_dropout = write_tiny_config(tmp_path / "no_dropout.json", 30522, hidden_dropout_prob=0.0, classifier_dropout=0.0)
    flags = dict(
        task_name="SST-2",
        data_dir=str(sst2),
        do_train=True,
        do_predict=True,
        train_batch_size=16,
        log_every=1,
        num_train_epochs=1.0,
        group_by_length=False,
        teacher=str(teacher),
        transfer_file=str(sst2 / "test.tsv"),
        teacher_cache_dir=str(tmp_path / "cache"),
        **{k: v for k, v in FAST.items() if k != "train_batch_size"},
    )
    runs = {}
    for name, accumulation in (("one", 1), ("two", 2)):
        runs[name] = tmp_path / name
        run_classify(
            args_for(
                ClassifyArgs, (no_dropout, vocab, init), runs[name], gradient_accumulation_steps=accumulation, **flags
            )
        )
    metrics = {k: read_metrics(v) for k, v in runs.items()}
    assert len(metrics["one"]) == 4  # (24 + 40) / 16
    for key in ("loss", "kd_loss"):
        np.testing.assert_allclose([m[key] for m in metrics["one"]], [m[key] for m in metrics["two"]], rtol=1e-4)
    np.testing.assert_allclose(
        read_tsv(runs["one"] / "test_results.tsv"), read_tsv(runs["two"] / "test_results.tsv"), atol=1e-5
    )


@pytest.mark.slow  # two torchrun processes and a reference run: about half a minute on two cores
def test_two_processes_distil_as_one(model_files, sst2, teacher, tmp_path):
    """Under torchrun rank 0 computes the teacher's cache and rank 1 reads it; the loss shares of the two ranks
    add up to the loss of one process's batch."""
    config, vocab, init = model_files
    no_dropout = write_tiny_config(tmp_path / "no_dropout.json", 30522, hidden_dropout_prob=0.0, classifier_dropout=0.0)
    flags = [
        f"--bert_config_file={no_dropout}", f"--vocab_file={vocab}", f"--init_checkpoint={init}", "--device=cpu",
        "--task_name=sst-2", f"--data_dir={sst2}", "--do_train", "--max_seq_length=32", "--train_batch_size=16",
        "--num_train_epochs=1", "--learning_rate=2e-3", "--log_every=1", "--group_by_length=false",
        f"--teacher={teacher}", f"--transfer_file={sst2 / 'test.tsv'}",
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    two = tmp_path / "two"
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    proc = subprocess.run(
        [*torchrun, "-m", "bert", "classify", *flags, f"--output_dir={two}"],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    one = tmp_path / "one"
    proc = subprocess.run(
        [sys.executable, "-m", "bert", "classify", *flags, f"--output_dir={one}"],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(list((two / "teacher_cache").glob("*.npy"))) == 1
    for key in ("loss", "kd_loss"):
        np.testing.assert_allclose([m[key] for m in read_metrics(two)], [m[key] for m in read_metrics(one)], atol=1e-5)
    wa, wb = read_weights(one / "model"), read_weights(two / "model")
    assert max(float((wa[k] - wb[k]).abs().max()) for k in wa) < 1e-5


def test_multi_label_student_learns_the_teachers_labels(model_files, tmp_path):
    """Multi-label: the teacher's sigmoid probabilities are the targets. Every training example is labelled "b";
    this teacher says "a" (and neither "b" nor "c") for every text, so with --distill_alpha=1 the student follows."""
    from bert.modeling import BertForSequenceClassification

    sentences = (shared_path("data", "glue", "SST-2") / "train.tsv").read_text().splitlines()[1:41]
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.tsv").write_text("".join(f"{s.split(chr(9))[0]}\tb\n" for s in sentences[:16]))
    (data / "test.tsv").write_text("".join(f"{s.split(chr(9))[0]}\t\n" for s in sentences[16:]))
    _, vocab, _ = model_files
    torch.manual_seed(3)
    model = BertForSequenceClassification(
        vocab_config(vocab, max_position_embeddings=64), num_labels=3, problem_type="multi_label_classification"
    )
    with torch.no_grad():
        model.classifier.bias.copy_(torch.tensor([3.0, -3.0, -3.0]))
    labels = {"id2label": {"0": "a", "1": "b", "2": "c"}, "label2id": {"a": 0, "b": 1, "c": 2}}
    teacher = save_model_dir(
        model, tmp_path / "teacher", vocab, problem_type="multi_label_classification", max_seq_length=32, **labels
    )
    flags = dict(
        task_name="generic", multi_label=True, labels="a,b,c", allow_empty_labels=True, data_dir=str(data),
        do_train=True, do_predict=True, num_train_epochs=3.0, **FAST,
    )  # fmt: skip
    run_classify(args_for(ClassifyArgs, model_files, tmp_path / "plain", **flags))
    distilled = dict(teacher=str(teacher), transfer_file=str(data / "test.tsv"), distill_alpha=1.0)
    run_classify(args_for(ClassifyArgs, model_files, tmp_path / "distilled", **flags, **distilled))
    plain, after = (read_tsv(tmp_path / n / "test_results.tsv").mean(0) for n in ("plain", "distilled"))
    assert plain[1] > plain[0], plain  # the labels say "b"
    assert after[0] > 0.7 > 0.3 > after[1], after  # the teacher says "a"
