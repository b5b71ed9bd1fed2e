"""`bert train-embeddings --gather_across_devices` under `torchrun`: two CPU processes (gloo), each embedding
half of the global batch and comparing its anchors with both halves' positives and negatives, train the
weights, loss and gradient norm of one process stepping on the whole batch; the flag is refused where it
has nothing to gather."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from bert.commands.train_embeddings import TrainEmbeddingsArgs, run_train_embeddings
from bert.commands.train_reranker import TrainRerankerArgs, run_train_reranker
from conftest import args_for, cli_error, model_flags, read_metrics, read_weights

# Dropout off: each process draws its own masks, which no one process could replay.
TINY_MODEL = dict(hidden_dropout_prob=0.0)  # conftest's model_files
TIMEOUT = 120  # seconds for the two-process run; about 10 s on two cores
TOPICS = ["music", "cats", "rain", "football", "cooking", "trains", "books", "gardens"]
# Two steps of a global batch of 4 tuples.
FLAGS = dict(train_batch_size=4, num_train_epochs=1.0, learning_rate=1e-3, log_every=1, warmup_proportion=0.0)


def _tuples(path):
    """(anchor, positive, hard negative) tuples, every text distinct."""
    rows = [[f"question on {t}", f"an answer about {t}", f"a note against {t}"] for t in TOPICS]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _two_processes(model_files, output_dir, flags: dict, *extra: str, command: str = "train-embeddings") -> list[str]:
    """`bert COMMAND` with `flags` under `torchrun --standalone --nproc_per_node=2`."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "bert"]
    cmd += [command, *model_flags(model_files, output_dir), "--do_train"]
    return cmd + [f"--{k}={v}" for k, v in flags.items()] + list(extra)


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def _check(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, proc.stderr[-3000:]


def _assert_same_run(one, two) -> None:
    """The runs' exported weights agree to 1e-5, and their logged losses and gradient norms at each step."""
    a, b = read_weights(one / "model"), read_weights(two / "model")
    assert a.keys() == b.keys()
    worst = max(float((a[k] - b[k]).abs().max()) for k in a)
    assert worst <= 1e-5, worst
    m1, m2 = read_metrics(one), read_metrics(two)
    assert [m["step"] for m in m2] == [1, 2]
    for x, y in zip(m1, m2, strict=True):
        assert abs(x["loss"] - y["loss"]) <= 1e-5 * x["loss"], (x, y)
        assert abs(x["grad_norm"] - y["grad_norm"]) <= 1e-4 * x["grad_norm"], (x, y)


@pytest.mark.slow  # a two-process torchrun and a one-process reference: about 20 s on two cores
@pytest.mark.parametrize("loss", ["mnrl_symmetric", "cached_mnrl"])
def test_two_processes_gathering_train_as_one_process_with_the_whole_batch(model_files, tmp_path, loss):
    """Each process embeds half the batch: without the gather (or with each gathering its own half twice)
    the loss, the gradient and the weights are another batch's."""
    data = _tuples(tmp_path / "tuples.jsonl")
    flags = {**FLAGS, "loss": loss, "train_file": str(data), "matryoshka_dims": "32,16"}
    if loss.startswith("cached_"):
        flags["mini_batch_size"] = 1
    one = tmp_path / "one"
    run_train_embeddings(args_for(TrainEmbeddingsArgs, model_files, one, **flags, do_train=True))
    two = tmp_path / "two"
    cmd = _two_processes(model_files, two, flags, "--gather_across_devices")
    _check(subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=TIMEOUT))
    _assert_same_run(one, two)
    init, trained = read_weights(model_files[2]), read_weights(two / "model")
    assert all(not torch.equal(v, init[f"bert.{k}"]) for k, v in trained.items())  # the steps moved every weight


@pytest.mark.slow  # a two-process torchrun and a one-process reference: about 20 s on two cores
def test_two_processes_without_gathering_each_step_on_the_whole_batch(model_files, tmp_path):
    """Without the flag every process embeds the whole batch: the weights, and the loss and gradient norm
    logged (its share, not its whole, summed over processes), are one process's."""
    data = _tuples(tmp_path / "tuples.jsonl")
    flags = {**FLAGS, "loss": "mnrl", "train_file": str(data)}
    one = tmp_path / "one"
    run_train_embeddings(args_for(TrainEmbeddingsArgs, model_files, one, **flags, do_train=True))
    two = tmp_path / "two"
    cmd = _two_processes(model_files, two, flags)
    _check(subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=TIMEOUT))
    _assert_same_run(one, two)


@pytest.mark.slow  # a two-process torchrun and a one-process reference: about 20 s on two cores
def test_two_reranker_processes_share_each_batch_and_train_as_one(model_files, tmp_path):
    """A reranker's loss is a mean over queries: each process scores its half of the step's queries (in
    micro-batches too), and the weights, loss and gradient norm are one process's on the whole batch."""
    data = _tuples(tmp_path / "tuples.jsonl")
    flags = {**FLAGS, "loss": "listwise", "train_file": str(data)}
    one = tmp_path / "one"
    run_train_reranker(args_for(TrainRerankerArgs, model_files, one, **flags, do_train=True))
    two = tmp_path / "two"
    cmd = _two_processes(model_files, two, flags, "--gradient_accumulation_steps=2", command="train-reranker")
    _check(subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=TIMEOUT))
    _assert_same_run(one, two)


def test_gather_across_devices_needs_processes_and_an_in_batch_loss(model_files, tmp_path, capsys):
    data = _tuples(tmp_path / "tuples.jsonl")
    scored = tmp_path / "scored.jsonl"
    scored.write_text("".join(json.dumps([f"a {t}", f"b {t}", 0.5]) + "\n" for t in TOPICS))
    base = [*model_flags(model_files, tmp_path / "out"), "--do_train", "--train_batch_size=4"]
    err = cli_error(capsys, "train-embeddings", *base, f"--train_file={data}", "--gather_across_devices")
    assert "--gather_across_devices" in err and "one process" in err and "torchrun" in err
    err = cli_error(capsys, "train-embeddings", *base, f"--train_file={scored}", "--gather_across_devices")
    assert "--loss=cosent" in err and "--loss=mnrl" in err
