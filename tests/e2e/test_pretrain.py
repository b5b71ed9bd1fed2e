"""`bert pretrain` end to end: training, evaluation, checkpoints, exact resume, 2 processes, bad input."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from bert.checkpointing import TRAINING_STATE_NAME, list_checkpoints, load_training_state
from bert.commands.pretrain import PretrainArgs, run_pretrain
from bert.distributed import DistContext
from bert.errors import InputError
from bert.pretraining.evaluation import EVAL_KEYS, evaluate
from bert.pretraining.inputs import open_pretraining_data
from conftest import (
    FIXTURES,
    assert_model_card,
    assert_same_weights,
    check_curves,
    cli_error,
    read_metrics,
    read_weights,
    synthetic_data,
    write_tiny_config,
)

SAMPLE = FIXTURES / "pretraining_tfrecord" / "sample_text_nowwm.tfrecord"
DROPOUT = dict(hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
NO_DROPOUT = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def _env() -> dict[str, str]:
    # One thread per process: the runs compared bit for bit do the same float reductions, and two
    # processes share the two cores of a small CI machine.
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


# ------------------------------------------------------------------------------------------------ (c)
def test_pretrain_on_sample_text(tmp_path):
    out = tmp_path / "run"
    args = PretrainArgs(
        bert_config_file=str(write_tiny_config(tmp_path / "bert_config.json", 30522, **DROPOUT)),
        input_file=str(SAMPLE),
        output_dir=str(out),
        do_train=True,
        do_eval=True,
        train_batch_size=4,
        eval_batch_size=4,
        num_train_steps=20,
        num_warmup_steps=2,
        learning_rate=1e-3,
        save_checkpoints_steps=10,
        max_eval_steps=2,
        log_every=1,
        keep_checkpoint_max=1,
    )
    result = run_pretrain(args)
    assert result["global_step"] == 20

    # Loss goes down (from ~ln(30522) + ln 2 = 11.0).
    lines = read_metrics(out)
    assert [m["step"] for m in lines] == list(range(1, 21))
    losses = [m["loss"] for m in lines]
    assert losses[0] > 10.0
    assert np.mean(losses[-5:]) < np.mean(losses[:5]) - 0.5
    for m in lines:
        assert m["loss"] == pytest.approx(m["masked_lm_loss"] + m["next_sentence_loss"], rel=1e-5)
        assert {"grad_norm", "learning_rate", "sequences_per_second"} <= set(m)
    assert lines[0]["learning_rate"] == 0.0 and lines[1]["learning_rate"] == pytest.approx(5e-4, rel=1e-12)
    drawn = check_curves(out)["runs"][0]["eval"]
    assert {"eval_loss", "eval_masked_lm_accuracy", "eval_next_sentence_accuracy"} <= set(drawn)

    # eval_results.txt: the original's six keys, sorted, `key = value`; and its JSON copy.
    text = (out / "eval_results.txt").read_text().splitlines()
    assert [line.split(" = ")[0] for line in text] == sorted(EVAL_KEYS)
    assert text[0] == "global_step = 20"
    results = json.loads((out / "eval_results.json").read_text())
    assert set(results) == set(EVAL_KEYS)
    assert_model_card(out, "pretrain", "fill-mask", "--num_train_steps=20")

    # Checkpoints: only the newest kept; it and the exported model hold the same weights, which load
    # with from_pretrained and reproduce the evaluation (each metric as tests/unit/test_pretraining_evaluation.py
    # checks `evaluate` computes it).
    assert [s for s, _ in list_checkpoints(out)] == [20]
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no temporary directories left
    final = read_weights(out / "model")
    assert_same_weights(read_weights(out / "checkpoint-20"), final)
    state = torch.load(out / "checkpoint-20" / TRAINING_STATE_NAME, weights_only=True)
    assert state["step"] == 20 and state["data"]["epoch"] * 23 + state["data"]["index"] == 80

    from bert.modeling import BertForPreTraining

    model = BertForPreTraining.from_pretrained(out / "model")
    loaded = {k: v for k, v in model.state_dict().items() if k in final}
    assert all(torch.equal(loaded[k], final[k]) for k in final)
    source = open_pretraining_data(str(SAMPLE), 128, 20, None)
    again = evaluate(model, source, 4, 2, DistContext(torch.device("cpu")))
    for key in ("loss", "masked_lm_loss", "masked_lm_accuracy", "next_sentence_loss", "next_sentence_accuracy"):
        assert again[key] == pytest.approx(results[key], rel=1e-5, abs=1e-6)

    # TensorBoard events: training scalars in output_dir, evaluation in output_dir/eval.
    from bert.formats.tensorboard import read_scalars

    scalars = read_scalars(out)
    assert [s for s, _ in scalars["loss"]] == list(range(1, 21))
    assert [v for _, v in scalars["loss"]] == pytest.approx(losses, rel=1e-6)
    assert read_scalars(out / "eval")["masked_lm_loss"][0] == (20, pytest.approx(results["masked_lm_loss"], rel=1e-6))

    # Rerunning the finished job resumes at step 20, trains no more, and evaluates the same model.
    again = run_pretrain(args)
    assert again["global_step"] == 20 and "train" not in again
    assert again["eval"]["loss"] == pytest.approx(results["loss"], rel=1e-6)


# ------------------------------------------------------------------------------------------------ (d)
def _pretrain_cmd(config: Path, data: Path, out: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "bert",
        "pretrain",
        f"--bert_config_file={config}",
        f"--input_file={data}",
        f"--output_dir={out}",
        "--do_train",
        "--train_batch_size=8",
        "--max_seq_length=32",
        "--max_predictions_per_seq=5",
        "--num_warmup_steps=3",
        "--learning_rate=1e-3",
        "--log_every=1",
        *extra,
    ]


def test_resume_after_kill_is_exact(tmp_path):
    data, vocab = synthetic_data(tmp_path, n=20, seq=32)
    # Dropout on: the RNG state must resume too.
    config = write_tiny_config(tmp_path / "bert_config.json", 99, max_position_embeddings=32, **DROPOUT)
    steps = ["--num_train_steps=40", "--save_checkpoints_steps=5", "--dynamic_masking", f"--vocab_file={vocab}"]
    ref = tmp_path / "uninterrupted"
    reference = subprocess.Popen(_pretrain_cmd(config, data, ref, *steps), env=_env(), stderr=subprocess.DEVNULL)

    out = tmp_path / "killed"
    proc = subprocess.Popen(_pretrain_cmd(config, data, out, *steps), env=_env(), stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while not (out / "checkpoint-5").is_dir() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the run ended before it could be interrupted"
    assert not (out / "model").exists()
    killed_at = max(s for s, _ in list_checkpoints(out))
    assert 5 <= killed_at < 40

    # The same command again resumes from the newest checkpoint (an init_checkpoint would be ignored).
    subprocess.run(_pretrain_cmd(config, data, out, *steps), env=_env(), check=True, stderr=subprocess.DEVNULL)
    assert reference.wait() == 0

    assert_same_weights(read_weights(ref / "model"), read_weights(out / "model"))  # resumed = uninterrupted
    # metrics.jsonl holds each step once, with the uninterrupted run's values.
    assert [m["step"] for m in read_metrics(out)] == list(range(1, 41))
    assert [m["loss"] for m in read_metrics(out)] == [m["loss"] for m in read_metrics(ref)]


# ------------------------------------------------------------------------------------------------ (e)
@pytest.mark.slow  # two torchrun processes and a reference run: about 12 s on two cores
def test_two_processes_equal_one(tmp_path):
    data, vocab = synthetic_data(tmp_path, n=24, seq=32)
    config = write_tiny_config(tmp_path / "bert_config.json", 99, max_position_embeddings=32, **NO_DROPOUT)
    common = ["--num_train_steps=6", "--save_checkpoints_steps=100", "--dynamic_masking", f"--vocab_file={vocab}"]
    one = tmp_path / "one"
    run_one = subprocess.Popen(_pretrain_cmd(config, data, one, *common), env=_env(), stderr=subprocess.DEVNULL)
    two = tmp_path / "two"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "bert"]
    cmd += _pretrain_cmd(config, data, two, *common)[3:]
    done = subprocess.run(cmd, env=_env(), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert run_one.wait() == 0
    a, b = read_metrics(one), read_metrics(two)
    assert [m["step"] for m in b] == list(range(1, 7))
    np.testing.assert_allclose([m["loss"] for m in b], [m["loss"] for m in a], atol=1e-5, rtol=0)
    np.testing.assert_allclose([m["grad_norm"] for m in b], [m["grad_norm"] for m in a], rtol=1e-4)
    assert a[-1]["loss"] < a[0]["loss"]
    wa, wb = read_weights(one / "model"), read_weights(two / "model")
    assert max(float((wa[k] - wb[k]).abs().max()) for k in wa) < 1e-5
    # The 2-process checkpoint resumes in one process (optimizer state is keyed by parameter name); more
    # steps change the schedule, which the rerun must acknowledge.
    more = _pretrain_cmd(config, data, two, "--num_train_steps=8", "--dynamic_masking", f"--vocab_file={vocab}")
    more.append("--allow_changed_flags")
    subprocess.run(more, env=_env(), check=True, stderr=subprocess.DEVNULL)
    assert [m["step"] for m in read_metrics(two)] == list(range(1, 9))


def synthetic_run(tmp_path: Path, name: str, records: int, **flags) -> list[dict]:
    """Pre-train the 99-word tiny model (no dropout) on synthetic 32-token records into tmp_path/name."""
    data = tmp_path / "synthetic.tfrecord"
    if not data.exists():
        synthetic_data(tmp_path, n=records, seq=32)
    config = write_tiny_config(tmp_path / "bert_config.json", 99, max_position_embeddings=32, **NO_DROPOUT)
    args = dict(
        bert_config_file=str(config),
        input_file=str(data),
        output_dir=str(tmp_path / name),
        do_train=True,
        max_seq_length=32,
        max_predictions_per_seq=5,
        log_every=1,
    )
    run_pretrain(PretrainArgs(**args, **flags))
    return read_metrics(tmp_path / name)


def test_gradient_accumulation_equals_one_batch(tmp_path):
    flags = dict(train_batch_size=8, num_train_steps=4, num_warmup_steps=1, learning_rate=1e-3)
    one = synthetic_run(tmp_path, "acc1", 24, **flags)
    four = synthetic_run(tmp_path, "acc4", 24, gradient_accumulation_steps=4, **flags)
    np.testing.assert_allclose([m["loss"] for m in four], [m["loss"] for m in one], atol=1e-5, rtol=0)


MIXED_PRECISION_FLAGS = dict(train_batch_size=16, num_train_steps=30, num_warmup_steps=3, learning_rate=3e-3)


@pytest.fixture(scope="module")
def fp32_curve(tmp_path_factory) -> np.ndarray:
    """The fp32 loss curve both mixed-precision runs are held to (one run for both)."""
    runs = synthetic_run(tmp_path_factory.mktemp("fp32"), "fp32", 64, precision="fp32", **MIXED_PRECISION_FLAGS)
    return np.array([m["loss"] for m in runs])


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_follows_the_fp32_curve(tmp_path, precision, fp32_curve):
    runs = synthetic_run(tmp_path, precision, 64, precision=precision, **MIXED_PRECISION_FLAGS)
    curves = {"fp32": fp32_curve, precision: np.array([m["loss"] for m in runs])}
    assert curves["fp32"][-5:].mean() < curves["fp32"][:5].mean() - 0.3  # it learns, so the curves can differ
    np.testing.assert_allclose(curves[precision], curves["fp32"], rtol=0.02)
    weights = read_weights(tmp_path / precision / "model")
    assert all(w.dtype == torch.float32 for w in weights.values())  # fp32 master weights
    scaler = load_training_state(tmp_path / precision / "checkpoint-30")["scaler"]
    assert (scaler is not None and scaler["scale"] > 0) == (precision == "fp16")


def test_lamb_trains_and_resumes_exactly(tmp_path):
    # LAMB moves each tensor by about lr * ||w|| per step: it takes larger rates than Adam.
    flags = dict(train_batch_size=16, num_train_steps=30, num_warmup_steps=3, learning_rate=5e-2, optimizer="lamb")
    losses = [m["loss"] for m in synthetic_run(tmp_path, "lamb", 64, save_checkpoints_steps=15, **flags)]
    assert np.mean(losses[-5:]) < np.mean(losses[:5]) - 0.3
    out = tmp_path / "lamb"
    assert json.loads((out / "checkpoint-30" / "trainer_state.json").read_text())["optimizer"] == "lamb"
    # Resuming reloads LAMB's moments: the last 15 steps again from checkpoint-15 give the same weights.
    first = read_weights(out / "model")
    shutil.rmtree(out / "checkpoint-30")
    synthetic_run(tmp_path, "lamb", 64, save_checkpoints_steps=15, **flags)
    again = read_weights(out / "checkpoint-30")
    assert_same_weights(first, again)


def test_native_dataset_gives_the_same_run(tmp_path):
    from bert.formats.native import NativeShardWriter, features_to_records

    data, _ = synthetic_data(tmp_path, n=20, seq=32)
    source = open_pretraining_data(str(data), 32, 5, None)
    native = tmp_path / "native"
    with NativeShardWriter(native, 32, 5, vocab_size=99, shard_size=7) as w:  # 3 shards
        w.write(features_to_records(source.get_batch(np.arange(20)), w.dtype))
        w.close({"max_seq_length": 32, "max_predictions_per_seq": 5, "vocab_size": 99})
    config = write_tiny_config(tmp_path / "bert_config.json", 99, max_position_embeddings=32, **DROPOUT)
    results = {}
    for name, inputs in (("tfrecord", {"input_file": str(data)}), ("native", {"input_file": str(native)})):
        out = tmp_path / f"run-{name}"  # not the dataset directory itself: an output is never an input
        result = run_pretrain(
            PretrainArgs(
                bert_config_file=str(config),
                output_dir=str(out),
                do_train=True,
                do_eval=True,
                train_batch_size=8,
                eval_batch_size=4,
                max_eval_steps=3,
                eval_files=str(data),  # the same evaluation data for both
                max_seq_length=32,
                max_predictions_per_seq=5,
                num_train_steps=3,
                num_warmup_steps=1,
                learning_rate=1e-3,
                log_every=1,
                **inputs,
            )
        )
        results[name] = ([m["loss"] for m in read_metrics(out)], result["eval"])
    assert results["native"] == results["tfrecord"]
    with pytest.raises(InputError, match="--max_predictions_per_seq=6 does not match the data"):
        open_pretraining_data(str(native), 32, 6, None)


def test_init_from_tf_checkpoint_then_resume_ignores_it(tmp_path, caplog):
    tiny = FIXTURES / "tf_checkpoint" / "tiny"
    data, _ = synthetic_data(tmp_path, n=8, seq=32)  # ids < 99, the tiny checkpoint's vocab
    out = tmp_path / "run"
    args = dict(
        bert_config_file=str(tiny / "bert_config.json"),
        input_file=str(data),
        output_dir=str(out),
        init_checkpoint=str(tiny / "bert_model.ckpt"),
        max_seq_length=32,
        max_predictions_per_seq=5,
        eval_batch_size=4,
        max_eval_steps=2,
    )
    result = run_pretrain(PretrainArgs(do_eval=True, **args))
    assert result["global_step"] == 0
    from bert.modeling import BertForPreTraining

    model = BertForPreTraining.from_pretrained(tiny / "bert_model.ckpt")
    want = evaluate(model, open_pretraining_data(str(data), 32, 5, None), 4, 2, DistContext(torch.device("cpu")))
    assert result["eval"]["loss"] == pytest.approx(want["loss"], rel=1e-6)
    assert "name = bert.embeddings.word_embeddings.weight, shape = (99, 32), *INIT_FROM_CKPT*" in caplog.text

    run_pretrain(PretrainArgs(do_train=True, train_batch_size=4, num_train_steps=2, num_warmup_steps=0, **args))
    caplog.clear()
    args["init_checkpoint"] = str(tmp_path / "missing")  # ignored: the output directory has a checkpoint
    more = dict(do_train=True, train_batch_size=4, num_train_steps=3, num_warmup_steps=0, allow_changed_flags=True)
    again = run_pretrain(PretrainArgs(**more, **args))
    assert again["global_step"] == 3 and "is ignored" in caplog.text


# ------------------------------------------------------------------------------------------------ (f)
def test_bad_input(tmp_path, capsys):
    config = write_tiny_config(tmp_path / "bert_config.json", 30522, **DROPOUT)
    base = [f"--bert_config_file={config}", f"--input_file={SAMPLE}"]

    err = cli_error(capsys, "pretrain", *base, f"--output_dir={tmp_path / 'a'}")
    assert "do_train" in err and "do_eval" in err

    err = cli_error(capsys, "pretrain", *base, f"--output_dir={tmp_path / 'b'}", "--do_train", "--max_seq_length=64")
    assert "--max_seq_length=64" in err and "--max_seq_length=128" in err and SAMPLE.name in err

    err = cli_error(
        capsys, "pretrain", *base, f"--output_dir={tmp_path / 'c'}", "--do_train", "--max_predictions_per_seq=10"
    )
    assert "--max_predictions_per_seq=20" in err

    err = cli_error(
        capsys, "pretrain", *base, f"--output_dir={tmp_path / 'c'}", "--do_train", "--gradient_accumulation_steps=4",
        "--train_batch_size=6",
    )  # fmt: skip
    assert "divisible" in err

    # A vocab larger than the config's table.
    small = write_tiny_config(tmp_path / "small.json", 1000, **DROPOUT)
    vocab = tmp_path / "big_vocab.txt"
    vocab.write_text("\n".join(f"t{i}" for i in range(2000)))
    err = cli_error(
        capsys, "pretrain", f"--bert_config_file={small}", f"--input_file={SAMPLE}", f"--output_dir={tmp_path / 'd'}",
        "--do_train", f"--vocab_file={vocab}",
    )  # fmt: skip
    assert "vocab_size" in err and "2000" in err

    # Data ids beyond the config's vocab (no vocab file given).
    err = cli_error(
        capsys,
        "pretrain",
        f"--bert_config_file={small}",
        f"--input_file={SAMPLE}",
        f"--output_dir={tmp_path / 'e'}",
        "--do_train",
    )
    assert SAMPLE.name in err and "vocab_size" in err

    # An output directory holding a checkpoint of another shape.
    from bert.checkpoint import save_pretrained
    from bert.config import BertConfig
    from bert.modeling import BertForPreTraining

    other = tmp_path / "other" / "checkpoint-3"
    h16 = write_tiny_config(tmp_path / "h16.json", 30522, hidden_size=16, **DROPOUT)
    model = BertForPreTraining(BertConfig.from_json_file(h16))
    save_pretrained(model, other)
    torch.save({"step": 3}, other / TRAINING_STATE_NAME)
    err = cli_error(capsys, "pretrain", *base, f"--output_dir={other.parent}", "--do_train")
    assert str(other / "config.json") in err and "hidden_size 16 (now 32)" in err and "--bert_config_file" in err

    err = cli_error(capsys, "pretrain", *base, f"--output_dir={tmp_path / 'f'}", "--do_train", "--use_tpu")
    assert "use_tpu" in err
    err = cli_error(capsys, "pretrain", *base, f"--output_dir={tmp_path / 'f'}", "--do_train", "--do_whole_word_mask")
    assert "--do_whole_word_mask" in err and "--dynamic_masking=true" in err
    err = cli_error(capsys, "pretrain", f"--bert_config_file={config}", "--input_file=/nonexistent/*.tfrecord",
                     f"--output_dir={tmp_path / 'g'}", "--do_train")  # fmt: skip
    assert "nothing matches" in err
    assert not (tmp_path / "b").exists()  # nothing written before validation passed
