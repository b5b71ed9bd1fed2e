"""Resume of `bert train-embeddings` and `bert train-reranker`: a run stopped after checkpoint-2 and resumed with
`--keep_checkpoint_max=1` (which rotates away the checkpoint it resumed from, vocab.txt included) finishes and
exports the uninterrupted run's weights bit for bit. The model starts from `--init_checkpoint` alone, so the
resumed run's vocabulary comes from the checkpoint it resumes. The stop is a copied checkpoint-2 (fast), and a
real SIGKILL or SIGINT in the process (slow); a process that stops consuming batches exits without SIGABRT."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading

import pytest

from bert.commands.train_embeddings import TrainEmbeddingsArgs, run_train_embeddings
from bert.commands.train_reranker import TrainRerankerArgs, run_train_reranker
from bert.training import prefetch
from conftest import REPO, args_for, assert_same_weights, read_weights

TOPICS = ["music", "cats", "rain", "football", "cooking", "trains", "books", "gardens", "coffee", "mountains"]
COMMANDS = {
    "train-embeddings": (TrainEmbeddingsArgs, run_train_embeddings),
    "train-reranker": (TrainRerankerArgs, run_train_reranker),
}


def _triples(path):
    rows = [
        [f"question {i} on {t}", f"answer {i} about {t}", f"note {i} on {TOPICS[(i + 3) % 10]}"]
        for i, t in enumerate(TOPICS * 2)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _flags(model_files, train_file, **more):
    # No --vocab_file and no --bert_config_file: both come from the checkpoint the run starts or resumes from.
    return dict(
        vocab_file=None,
        bert_config_file=None,
        train_file=str(train_file),
        do_train=True,
        max_seq_length=16,
        train_batch_size=4,
        num_train_epochs=1.0,
        save_checkpoints_steps=2,
        learning_rate=1e-3,
        **more,
    )


@pytest.mark.parametrize("command", list(COMMANDS))
def test_resume_with_rotation_exports_the_uninterrupted_model(model_files, tmp_path, command):
    args_cls, run = COMMANDS[command]
    flags = _flags(model_files, _triples(tmp_path / "triples.jsonl"))
    full, resumed = tmp_path / "full", tmp_path / "resumed"
    assert run(args_for(args_cls, model_files, full, keep_checkpoint_max=0, **flags))["global_step"] == 5
    resumed.mkdir()
    shutil.copytree(full / "checkpoint-2", resumed / "checkpoint-2")
    result = run(args_for(args_cls, model_files, resumed, keep_checkpoint_max=1, **flags))
    assert result["global_step"] == 5
    assert sorted(p.name for p in resumed.glob("checkpoint-*")) == ["checkpoint-5"]
    assert_same_weights(read_weights(full / "model"), read_weights(resumed / "model"))
    assert (resumed / "model" / "vocab.txt").read_bytes() == (full / "model" / "vocab.txt").read_bytes()


STOP_AFTER_CHECKPOINT_2 = """
import os, signal, sys
from bert import training
real = training.Trainer.save_checkpoint
def save_checkpoint(self, step, *args, **kwargs):
    path = real(self, step, *args, **kwargs)
    if step == 2:
        os.kill(os.getpid(), getattr(signal, sys.argv[1]))
    return path
training.Trainer.save_checkpoint = save_checkpoint
from bert.cli import main
sys.exit(main(sys.argv[2:]))
"""


@pytest.mark.slow
@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize("sig", ["SIGKILL", "SIGINT"])
def test_a_killed_run_resumes_to_the_uninterrupted_model(model_files, tmp_path, sig, command):
    """A real signal in the process once checkpoint-2 is written; the rerun takes the lock over, resumes
    with --keep_checkpoint_max=1 and ends with the uninterrupted run's model."""
    triples = _triples(tmp_path / "triples.jsonl")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO / "src")}
    config, vocab, init = model_files

    def argv(out):
        return [
            command,
            f"--init_checkpoint={init}",
            f"--train_file={triples}",
            f"--output_dir={out}",
            "--do_train",
            "--max_seq_length=16",
            "--train_batch_size=4",
            "--num_train_epochs=1",
            "--save_checkpoints_steps=2",
            "--learning_rate=1e-3",
            "--keep_checkpoint_max=1",
            "--device=cpu",
        ]

    full, stopped = tmp_path / "full", tmp_path / "stopped"
    done = subprocess.run([sys.executable, "-m", "bert", *argv(full)], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    killed = subprocess.run(
        [sys.executable, "-c", STOP_AFTER_CHECKPOINT_2, sig, *argv(stopped)], env=env, capture_output=True, text=True
    )
    assert killed.returncode != 0 and not (stopped / "model").exists(), killed.stderr[-2000:]
    assert (stopped / "checkpoint-2").is_dir()
    again = subprocess.run([sys.executable, "-m", "bert", *argv(stopped)], env=env, capture_output=True, text=True)
    assert again.returncode == 0, again.stderr[-2000:]
    assert_same_weights(read_weights(full / "model"), read_weights(stopped / "model"))


PREFETCH_THEN_EXIT = """
import sys, torch
from bert import training
def batches():
    while True:
        x = torch.randn(256, 256)
        for _ in range(20):
            x = torch.tanh(x @ x)
        yield {"x": x}
stream = training.prefetch(batches())
next(stream)
stream.close()
sys.exit(2)
"""


def test_a_run_that_stops_while_batches_are_made_exits_cleanly():
    """A consumer that stops while the prefetch thread is inside torch, then the process exits (as a run ending
    on an error does): exit 2, not SIGABRT ("terminate called without an active exception", 10 in 10 before
    the thread was joined)."""
    env = {**os.environ, "OMP_NUM_THREADS": "2", "PYTHONPATH": str(REPO / "src")}
    done = subprocess.run([sys.executable, "-c", PREFETCH_THEN_EXIT], env=env, capture_output=True, text=True)
    assert done.returncode == 2 and "terminate called" not in done.stderr, (done.returncode, done.stderr[-500:])


def test_prefetch_thread_is_joined_when_the_consumer_stops():
    """A consumer that stops early (a run ending on an error) leaves no prefetch thread running: one left inside
    torch at the process's exit aborted it ("terminate called without an active exception")."""
    stream = prefetch(iter(range(1000)), depth=2)
    assert next(stream) == 0
    stream.close()
    assert not [t for t in threading.enumerate() if t.name == "prefetch"]
