"""`bert pretrain --teacher`: a tiny student distilled from a wider teacher learns its masked-LM distribution,
resumes exactly, and refuses a teacher of another vocabulary."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from bert.checkpoint import save_pretrained
from bert.commands.pretrain import PretrainArgs, run_pretrain
from bert.config import BertConfig
from bert.modeling import BertForPreTraining
from bert.pretraining.inputs import features_to_model_inputs, open_pretraining_data
from conftest import (
    assert_same_weights,
    cli_error,
    read_metrics,
    read_weights,
    save_tiny_model,
    synthetic_data,
    write_tiny_config,
)

TEACHER = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)


def _teacher(directory: Path, vocab: Path, vocab_size: int = 99) -> Path:
    """A random teacher twice the student's width, its weights wide enough (initializer_range 0.2) that its
    masked-LM and attention distributions are far from uniform."""
    torch.manual_seed(1)
    config = BertConfig(vocab_size=vocab_size, max_position_embeddings=32, initializer_range=0.2, **TEACHER)
    save_pretrained(BertForPreTraining(config), directory, vocab, do_lower_case=True)
    return directory


def _held_out_kl(model_dir: Path, teacher_dir: Path, data: Path) -> float:
    """The student's masked-LM KL to the teacher (T = 1) over the masked positions of held-out records."""
    student, teacher = (BertForPreTraining.from_pretrained(d).eval() for d in (model_dir, teacher_dir))
    source = open_pretraining_data(str(data), 32, 5, None)
    batch = features_to_model_inputs(source.get_batch(np.arange(len(source))))
    with torch.no_grad():
        s, t = student(**batch).mlm_logits.double(), teacher(**batch).mlm_logits.double()  # [B, P, V]
    kl = (t.softmax(-1) * (t.log_softmax(-1) - s.log_softmax(-1))).sum(-1)  # [B, P]
    w = batch["masked_lm_weights"]
    return float((w * kl).sum() / w.sum())


@pytest.fixture
def setup(tmp_path):
    data, vocab = synthetic_data(tmp_path, n=32, seq=32)
    (tmp_path / "held").mkdir()
    held_out, _ = synthetic_data(tmp_path / "held", n=8, seq=32, seed=1)
    config, _, init = save_tiny_model(tmp_path, vocab, True, max_position_embeddings=32)
    return dict(
        data=data, vocab=vocab, held_out=held_out, config=config, init=init, teacher=_teacher(tmp_path / "t", vocab)
    )


def test_student_learns_the_teacher_and_resumes_exactly(tmp_path, setup):
    out = tmp_path / "run"
    args = PretrainArgs(
        bert_config_file=str(setup["config"]),
        init_checkpoint=str(setup["init"]),
        vocab_file=str(setup["vocab"]),
        input_file=str(setup["data"]),
        output_dir=str(out),
        teacher=str(setup["teacher"]),
        temperature=2.0,
        distill_alpha=0.8,
        distill_attention=True,
        do_train=True,
        train_batch_size=8,
        max_seq_length=32,
        max_predictions_per_seq=5,
        num_train_steps=20,
        num_warmup_steps=2,
        learning_rate=3e-3,
        save_checkpoints_steps=10,
        log_every=1,
        dynamic_masking=True,  # its draws and the dropout must resume too
        device="cpu",
    )
    run_pretrain(args)
    metrics = read_metrics(out)
    assert [m["step"] for m in metrics] == list(range(1, 21))
    for m in metrics:
        want = 0.8 * m["masked_lm_kl"] + 0.2 * m["masked_lm_loss"] + m["next_sentence_loss"]
        want += m["attention_relation_loss"] + m["value_relation_loss"]
        assert m["loss"] == pytest.approx(want, rel=1e-5)
    for name in ("masked_lm_kl", "attention_relation_loss", "value_relation_loss"):
        curve = [m[name] for m in metrics]
        assert np.mean(curve[-5:]) < np.mean(curve[:5]), name

    # On records it never trained on, the student's distribution comes closer to the teacher's as it trains.
    kls = [
        _held_out_kl(d, setup["teacher"], setup["held_out"])
        for d in (setup["init"], out / "checkpoint-10", out / "model")
    ]
    assert kls[1] < 0.6 * kls[0] and kls[2] < 0.6 * kls[0], kls  # (from 0.97 to 0.45 and 0.45)

    # Resuming from checkpoint-10 gives the uninterrupted run's weights and metrics, bit for bit.
    first = read_weights(out / "model")
    shutil.rmtree(out / "checkpoint-20")
    run_pretrain(args)
    assert_same_weights(first, read_weights(out / "checkpoint-20"))
    assert [m["loss"] for m in read_metrics(out)] == [m["loss"] for m in metrics]


def test_teacher_errors(tmp_path, setup, capsys):
    base = [
        f"--bert_config_file={setup['config']}",
        f"--vocab_file={setup['vocab']}",
        f"--input_file={setup['data']}",
        "--do_train",
        "--max_seq_length=32",
        "--max_predictions_per_seq=5",
        "--device=cpu",
    ]
    other_vocab = tmp_path / "other_vocab.txt"
    other_vocab.write_text(setup["vocab"].read_text() + "\nextra")
    wider = _teacher(tmp_path / "t100", other_vocab, vocab_size=100)
    err = cli_error(capsys, "pretrain", *base, f"--output_dir={tmp_path / 'a'}", f"--teacher={wider}")
    assert "vocab_size=100" in err and "vocab_size=99" in err and str(wider / "vocab.txt") in err

    renamed = tmp_path / "renamed_vocab.txt"
    renamed.write_text(setup["vocab"].read_text().replace("w98", "w98x"))
    err = cli_error(
        capsys, "pretrain", *base, f"--output_dir={tmp_path / 'd'}", f"--teacher={_teacher(tmp_path / 'tr', renamed)}"
    )
    assert "vocabulary" in err and "differs from the student's" in err and "(both 99 entries)" in err

    err = cli_error(capsys, "pretrain", *base, f"--output_dir={tmp_path / 'b'}", "--distill_attention")
    assert "--distill_attention applies to distillation only: add --teacher" in err
    bad = f"--teacher={setup['teacher']}"
    err = cli_error(
        capsys, "pretrain", *base, f"--output_dir={tmp_path / 'c'}", bad, "--distill_attention", "--relation_heads=3"
    )
    assert "hidden_size=32 does not split into --relation_heads=3" in err
    missing = f"--teacher={tmp_path / 'nowhere'}"
    err = cli_error(capsys, "pretrain", *base, f"--output_dir={tmp_path / 'f'}", missing)
    assert err.endswith(f"{missing}: no such model directory or checkpoint")
    err = cli_error(capsys, "pretrain", *base, f"--output_dir={tmp_path / 'e'}", bad, "--distill_alpha=0")
    assert "--distill_alpha=0 and no --distill_attention is not learnt from" in err


def test_student_from_the_teachers_layers(tmp_path, setup):
    """--init_from_teacher_layers starts the distilled student from the teacher's block 1 (a 1-layer student,
    whose relation losses read the embeddings as the last block's input); one warm-up step at learning rate 0
    leaves those weights as they were."""
    out = tmp_path / "run"
    args = PretrainArgs(
        input_file=str(setup["data"]),
        output_dir=str(out),
        teacher=str(setup["teacher"]),
        init_from_teacher_layers="1",
        distill_attention=True,
        do_train=True,
        train_batch_size=8,
        max_seq_length=32,
        max_predictions_per_seq=5,
        num_train_steps=1,
        num_warmup_steps=1,
        log_every=1,
        device="cpu",
    )
    run_pretrain(args)
    teacher, student = read_weights(setup["teacher"]), read_weights(out / "model")
    assert student.keys() == {k for k in teacher if ".layer.1." not in k}
    for key, value in student.items():
        assert torch.equal(value, teacher[key.replace(".layer.0.", ".layer.1.")]), key
    (m,) = read_metrics(out)
    assert m["attention_relation_loss"] > 0 and m["value_relation_loss"] > 0 and m["masked_lm_kl"] > 0


@pytest.mark.slow  # two torchrun processes: 9-15 s
def test_two_processes_distil_as_one(tmp_path, setup):
    """Under DDP the student's last-block projections, recomputed outside its forward (`last_layer_qkv`), still
    get their gradients reduced: 2 processes give the 1-process run's losses and weights."""
    no_dropout = write_tiny_config(tmp_path / "no_dropout.json", 99, max_position_embeddings=32, hidden_dropout_prob=0)
    flags = [
        f"--bert_config_file={no_dropout}",  # dropout differs across ranks
        f"--init_checkpoint={setup['init']}",
        f"--vocab_file={setup['vocab']}",
        f"--input_file={setup['data']}",
        f"--teacher={setup['teacher']}",
        "--distill_attention",
        "--do_train",
        "--train_batch_size=8",
        "--max_seq_length=32",
        "--max_predictions_per_seq=5",
        "--num_train_steps=4",
        "--num_warmup_steps=1",
        "--learning_rate=3e-3",
        "--log_every=1",
        "--device=cpu",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    one = subprocess.Popen(
        [sys.executable, "-m", "bert", "pretrain", f"--output_dir={tmp_path / 'one'}", *flags], env=env
    )
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "bert"]
    done = subprocess.run([*cmd, "pretrain", f"--output_dir={tmp_path / 'two'}", *flags], env=env, capture_output=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert one.wait() == 0
    a, b = read_metrics(tmp_path / "one"), read_metrics(tmp_path / "two")
    for name in ("loss", "masked_lm_kl", "attention_relation_loss", "value_relation_loss", "grad_norm"):
        np.testing.assert_allclose([m[name] for m in b], [m[name] for m in a], rtol=1e-4, err_msg=name)
    wa, wb = read_weights(tmp_path / "one" / "model"), read_weights(tmp_path / "two" / "model")
    assert max(float((wa[k] - wb[k]).abs().max()) for k in wa) < 1e-5
