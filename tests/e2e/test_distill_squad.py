"""`bert squad --teacher`: span distillation end to end on tiny models (`bert.distillation.SpanTeacher`).

The teacher is a tiny random `BertForQuestionAnswering` over the student's vocabulary (the released uncased one's
first 5,000 entries: its common words, at a sixth of the embedding's cost), saved as `bert squad` saves its model;
the student starts from its layers (`--init_from_teacher_layers`).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from bert.commands.squad import SquadArgs, run_squad
from conftest import (
    assert_same_weights,
    cli_error,
    read_metrics,
    read_weights,
    save_model_dir,
    shared_path,
    squad_slice,
    vocab_config,
)

SEQ, QUERY, STRIDE = 64, 16, 24  # several windows per question, a short run
TRAIN, TRANSFER = 8, 4  # questions


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("squad")
    squad_slice("1.1", 0, TRAIN, d / "train.json", training=True)
    squad_slice("1.1", TRAIN, TRANSFER, d / "transfer.json", training=False)  # answers kept: they must be ignored
    squad_slice("2.0", 0, TRAIN, d / "train-v2.json", training=True)  # unanswerable questions among them
    return d


@pytest.fixture(scope="module")
def vocab(tmp_path_factory) -> Path:
    lines = shared_path("data", "vocab", "uncased.txt").read_text(encoding="utf-8").splitlines(keepends=True)
    path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    path.write_text("".join(lines[:5000]), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def teacher(vocab, tmp_path_factory) -> Path:
    from bert.modeling import BertForQuestionAnswering

    torch.manual_seed(1)
    model = BertForQuestionAnswering(vocab_config(vocab, max_position_embeddings=SEQ))
    return save_model_dir(model, tmp_path_factory.mktemp("teacher") / "model", vocab, do_lower_case=True)


def student_args(data: Path, teacher: Path, out: Path, **flags) -> SquadArgs:
    base = dict(
        output_dir=str(out),
        vocab_file=str(teacher / "vocab.txt"),
        device="cpu",
        train_file=str(data / "train.json"),
        do_train=True,
        max_seq_length=SEQ,
        max_query_length=QUERY,
        doc_stride=STRIDE,
        train_batch_size=4,
        learning_rate=1e-3,
        num_train_epochs=1.0,
        teacher=str(teacher),
        init_from_teacher_layers="1",
        transfer_file=str(data / "transfer.json"),
        temperature=2.0,
    )
    return SquadArgs(**{**base, **flags})


def window_logits(teacher: Path, data: Path) -> np.ndarray:
    """The teacher's start/end logits [F, SEQ, 2] on the transfer file's windows, cut as the student cuts them."""
    from bert.inference import Predictor
    from bert.tasks.squad import convert_examples_to_features, read_squad_examples
    from bert.tokenization import FullTokenizer

    tokenizer = FullTokenizer(str(teacher / "vocab.txt"), do_lower_case=True)
    examples = read_squad_examples(data / "transfer.json", is_training=False)
    features = convert_examples_to_features(examples, tokenizer, SEQ, STRIDE, QUERY, False, pad_to_max_length=True)
    model = Predictor.from_pretrained(str(teacher), device="cpu").model
    with torch.no_grad():
        names = ("input_ids", "input_mask", "segment_ids")
        ids, mask, types = (torch.tensor([getattr(f, k) for f in features]) for k in names)
        logits = model(ids, mask, types).logits.numpy()
    return logits * np.array([f.input_mask for f in features], dtype=np.float32)[..., None]


def test_squad_student_learns_the_teachers_spans_once_cached(data, teacher, tmp_path, caplog, monkeypatch):
    from bert.checkpoint import read_checkpoint

    monkeypatch.setattr("bert.run_dir.try_plot", lambda *a, **k: None)  # curves are test_squad's; 2 s a run here

    cache = tmp_path / "cache"
    result = run_squad(student_args(data, teacher, tmp_path / "a", teacher_cache_dir=str(cache)))
    assert result["num_train_steps"] == (TRAIN + TRANSFER) // 4  # transfer questions count, as run_squad counts
    (array,) = cache.glob("*.npy")
    rows = np.load(array)
    # A row per window, the transfer set's after the training set's: the teacher's logits at each real position.
    want = window_logits(teacher, data)
    assert rows.shape[1:] == (SEQ, 2) and rows.shape[0] > TRAIN + len(want)
    np.testing.assert_allclose(rows[-len(want) :], want, atol=1e-5, rtol=0)
    # The student is the teacher's layer 1 alone.
    assert read_checkpoint(tmp_path / "a" / "model").config.num_hidden_layers == 1

    # The same run reading the cache trains the same student.
    written = array.stat().st_mtime_ns
    caplog.clear()
    with caplog.at_level("INFO", logger="bert.distillation"):
        run_squad(student_args(data, teacher, tmp_path / "b", teacher_cache_dir=str(cache)))
    assert f"{len(rows)} cached outputs" in caplog.text and "computed" not in caplog.text
    assert array.stat().st_mtime_ns == written
    assert_same_weights(read_weights(tmp_path / "a" / "model"), read_weights(tmp_path / "b" / "model"))


def test_squad_v2_student_learns_the_teacher_alone_at_alpha_1(data, teacher, tmp_path, monkeypatch):
    """SQuAD 2.0 distils as 1.1 does, the null answer being [CLS] of each window: at --distill_alpha=1 the loss is
    the teacher's alone, unanswerable questions' windows included."""
    monkeypatch.setattr("bert.run_dir.try_plot", lambda *a, **k: None)
    flags = dict(train_file=str(data / "train-v2.json"), transfer_file=None, distill_alpha=1.0)
    run_squad(student_args(data, teacher, tmp_path / "v2", version_2_with_negative=True, **flags))
    logged = [m for m in read_metrics(tmp_path / "v2") if "kd_loss" in m]
    assert logged and all(m["kd_loss"] > 0 and m["loss"] == pytest.approx(m["kd_loss"], rel=1e-6) for m in logged)


def test_squad_teacher_must_share_the_vocabulary(data, vocab, teacher, tmp_path, capsys):
    other = tmp_path / "other"
    shutil.copytree(teacher, other)
    (other / "vocab.txt").write_text((other / "vocab.txt").read_text().replace("[unused1]", "[unusedX]"))
    flags = [f"--output_dir={tmp_path / 'out'}", f"--vocab_file={vocab}", f"--train_file={data / 'train.json'}"]
    flags += ["--do_train", f"--max_seq_length={SEQ}", f"--max_query_length={QUERY}", "--init_from_teacher_layers=0"]
    error = cli_error(capsys, "squad", *flags, f"--teacher={other}")
    assert f"--teacher={other}: its vocab.txt is not the student's --vocab_file={vocab}" in error
    assert not (tmp_path / "out").exists()


def test_squad_teacher_must_be_a_span_model(data, vocab, tmp_path, capsys):
    from bert.modeling import BertForTokenClassification

    ner = save_model_dir(BertForTokenClassification(vocab_config(vocab)), tmp_path / "ner", vocab)
    flags = [f"--output_dir={tmp_path / 'out'}", f"--vocab_file={vocab}", f"--train_file={data / 'train.json'}"]
    flags += ["--do_train", f"--max_seq_length={SEQ}", f"--max_query_length={QUERY}", "--init_from_teacher_layers=0"]
    error = cli_error(capsys, "squad", *flags, f"--teacher={ner}")
    assert f"--teacher={ner} is a BertForTokenClassification (config.json architectures), not a" in error


def test_squad_no_distillation_weight_needs_a_transfer_set_or_layers(data, teacher, tmp_path, capsys):
    flags = [f"--output_dir={tmp_path / 'out'}", "--bert_config_file=tiny", f"--train_file={data / 'train.json'}"]
    error = cli_error(capsys, "squad", *flags, "--do_train", f"--teacher={teacher}", "--distill_alpha=0")
    assert f"--distill_alpha=0 without --transfer_file leaves --teacher={teacher} nothing to do" in error
