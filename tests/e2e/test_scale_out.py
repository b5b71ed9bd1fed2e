"""Past one machine: pre-training data made in shards, multi-node and elastic `torchrun`, FSDP, sharded
embedding. Every subprocess has a timeout; models are tiny and runs a few steps long."""

from __future__ import annotations

import collections
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from bert.checkpointing import TRAINING_STATE_NAME, list_checkpoints
from bert.commands.create_pretraining_data import CreatePretrainingDataArgs, run_create_pretraining_data
from bert.commands.pretrain import PretrainArgs, run_pretrain
from bert.errors import InputError
from bert.formats.native import open_native_dataset
from bert.pretraining.inputs import open_pretraining_data
from conftest import (
    REPO,
    assert_same_weights,
    read_metrics,
    read_results,
    read_weights,
    save_tiny_model,
    shared_path,
    synthetic_data,
    write_tiny_config,
)

NO_DROPOUT = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def _corpus(path: Path, n_docs: int = 40) -> str:
    rng = random.Random(0)
    words = ["the", "cat", "sat", "on", "mat", "dog", "ran", "far", "unable", "walking", "cats"]
    docs = ["\n".join(" ".join(rng.choice(words) for _ in range(rng.randint(3, 15))) + " ." for _ in range(8))
            for _ in range(n_docs)]  # fmt: skip
    path.write_text("\n\n".join(docs) + "\n")
    return str(path)


def _create(corpus: str, out: Path, vocab: str, **flags) -> dict:
    args = CreatePretrainingDataArgs(
        input_file=corpus, output_file=str(out), vocab_file=vocab, dupe_factor=2, max_seq_length=24,
        max_predictions_per_seq=4, streaming_buffer_mb=0.002, output_format="native", **flags,
    )  # fmt: skip
    return run_create_pretraining_data(args)


def _records(path: Path) -> collections.Counter:
    _, dataset = open_native_dataset(path)
    return collections.Counter(r.tobytes() for r in dataset.records(np.arange(len(dataset))))


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """One unsharded native dataset, and the same corpus in 3 shards (`--num_shards=3`)."""
    tmp = tmp_path_factory.mktemp("shards")
    vocab = tmp / "vocab.txt"
    from conftest import PIECES_VOCAB

    vocab.write_text("\n".join(PIECES_VOCAB) + "\n")
    corpus = _corpus(tmp / "corpus.txt")
    _create(corpus, tmp / "one", str(vocab), streaming=True)
    for i in range(3):
        _create(corpus, tmp / f"shard-{i}", str(vocab), num_shards=3, shard_index=i)
    return tmp, corpus, str(vocab)


def test_three_shards_hold_the_instances_of_one_run(shards):
    tmp, _, _ = shards
    one = _records(tmp / "one")
    parts = [_records(tmp / f"shard-{i}") for i in range(3)]
    assert len(one) > 30 and all(sum(p.values()) > 0 for p in parts)
    assert sum(parts, collections.Counter()) == one  # the same multiset of records
    manifests = [open_native_dataset(tmp / f"shard-{i}")[0] for i in range(3)]
    assert [(m["shard_index"], m["num_shards"]) for m in manifests] == [(0, 3), (1, 3), (2, 3)]
    # Joined by `bert pretrain` (a glob that matches the directories, not the logs beside them), the parts
    # come back in the unsharded run's order.
    joined = open_pretraining_data(str(tmp / "shard-?"), 24, 4, None)
    single = open_pretraining_data(str(tmp / "one"), 24, 4, None)
    assert len(joined) == len(single)
    for key, value in single.get_batch(np.arange(len(single))).items():
        np.testing.assert_array_equal(joined.get_batch(np.arange(len(joined)))[key], value, err_msg=key)


def test_pretrain_on_shards_equals_pretrain_on_one_output(shards):
    tmp, _, vocab = shards
    config = write_tiny_config(tmp / "bert_config.json", 19, max_position_embeddings=24, **NO_DROPOUT)
    listed = ",".join(str(tmp / f"shard-{i}") for i in range(3))
    for name, data in (("run-one", str(tmp / "one")), ("run-shards", listed)):
        run_pretrain(PretrainArgs(
            bert_config_file=str(config), input_file=data, output_dir=str(tmp / name), do_train=True,
            train_batch_size=8, max_seq_length=24, max_predictions_per_seq=4, num_train_steps=3,
            num_warmup_steps=1, learning_rate=1e-3, log_every=1,
        ))  # fmt: skip
    losses = {name: [m["loss"] for m in read_metrics(tmp / name)] for name in ("run-one", "run-shards")}
    assert losses["run-shards"] == losses["run-one"]
    assert_same_weights(read_weights(tmp / "run-one" / "model"), read_weights(tmp / "run-shards" / "model"))


def test_pretrain_refuses_a_missing_shard_or_shards_of_other_flags(shards, tmp_path):
    tmp, corpus, vocab = shards
    with pytest.raises(InputError, match=r"shard\(s\) 1 of 3 are missing"):
        open_pretraining_data(f"{tmp / 'shard-0'},{tmp / 'shard-2'}", 24, 4, None)
    with pytest.raises(InputError, match="are both shard 0 of 3"):
        open_pretraining_data(f"{tmp / 'shard-0'},{tmp / 'shard-0'},{tmp / 'shard-1'},{tmp / 'shard-2'}", 24, 4, None)
    _create(corpus, tmp_path / "other-seed", vocab, num_shards=3, shard_index=1, random_seed=7)
    with pytest.raises(InputError, match=r"were made with different flags \(random_seed: 12345 vs 7\)"):
        open_pretraining_data(f"{tmp / 'shard-0'},{tmp_path / 'other-seed'},{tmp / 'shard-2'}", 24, 4, None)


@pytest.mark.parametrize(("flags", "message"), [
    (dict(num_shards=0), "--num_shards=0 must be at least 1"),
    (dict(num_shards=3, shard_index=3), "--shard_index=3 must be between 0 and --num_shards-1 = 2"),
])  # fmt: skip
def test_bad_shard_flags(tmp_path, flags, message):
    from conftest import PIECES_VOCAB

    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(PIECES_VOCAB) + "\n")
    with pytest.raises(InputError, match=message):
        _create(_corpus(tmp_path / "c.txt", 2), tmp_path / "out", str(vocab), **flags)


# ------------------------------------------------------------------------------ torchrun: nodes, restarts
TIMEOUT = 120  # seconds, for any one torchrun; each run is a few seconds on 2 cores
DROPOUT = dict(hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)


def _env() -> dict[str, str]:
    # One thread per process: runs compared bit for bit do the same float reductions.
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pretrain_flags(config: Path, data: Path, out: Path, *extra: str) -> list[str]:
    return [
        "-m", "bert", "pretrain", f"--bert_config_file={config}", f"--input_file={data}", f"--output_dir={out}",
        "--do_train", "--train_batch_size=8", "--max_seq_length=32", "--max_predictions_per_seq=5",
        "--num_warmup_steps=3", "--learning_rate=1e-3", "--log_every=1", *extra,
    ]  # fmt: skip


def _torchrun(*args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", *args]


def _elastic(port: int, nnodes: str, nproc: int, *extra: str) -> list[str]:
    """torchrun with the c10d rendezvous on 127.0.0.1 (what a multi-node job runs on each node)."""
    return _torchrun(
        f"--nnodes={nnodes}", f"--nproc_per_node={nproc}", "--rdzv_backend=c10d", f"--rdzv_endpoint=127.0.0.1:{port}",
        "--rdzv_id=scale-out-test", "--local_addr=127.0.0.1", *extra,
    )  # fmt: skip


def _check(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, proc.stderr[-3000:]


# The flags of the runs compared with one node's uninterrupted run (dropout on: the RNG state resumes too).
ELASTIC_STEPS = 12


@pytest.fixture(scope="module")
def one_node(tmp_path_factory):
    """Data, config, flags, and the output of `torchrun --standalone --nproc_per_node=2`: the reference."""
    tmp = tmp_path_factory.mktemp("elastic")
    data, vocab = synthetic_data(tmp, n=24, seq=32)
    config = write_tiny_config(tmp / "bert_config.json", 99, max_position_embeddings=32, **DROPOUT)
    flags = [f"--num_train_steps={ELASTIC_STEPS}", "--save_checkpoints_steps=3", "--dynamic_masking"]
    flags.append(f"--vocab_file={vocab}")
    out = tmp / "one-node"
    cmd = _torchrun("--standalone", "--nproc_per_node=2", *_pretrain_flags(config, data, out, *flags))
    _check(subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=TIMEOUT))
    return tmp, config, data, flags, out


@pytest.mark.slow  # two torchrun agents and a reference run: about 15 s on two cores
def test_two_torchrun_agents_meet_and_train_as_one_node(one_node, tmp_path):
    _, config, data, flags, reference = one_node
    out, port = tmp_path / "two-nodes", _free_port()
    agents = [
        subprocess.Popen(_elastic(port, "2", 1, *_pretrain_flags(config, data, out, *flags)), env=_env(),
                         stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]  # fmt: skip
    for proc in agents:
        _, err = proc.communicate(timeout=TIMEOUT)
        assert proc.returncode == 0, err[-3000:]
    state = torch.load(out / f"checkpoint-{ELASTIC_STEPS}" / TRAINING_STATE_NAME, weights_only=True)
    assert state["world_size"] == 2
    assert_same_weights(read_weights(reference / "model"), read_weights(out / "model"))


def _worker_pids(agent_pid: int) -> dict[int, int]:
    """The agent's worker processes, by RANK (read from their environment)."""
    out = {}
    for task in Path(f"/proc/{agent_pid}/task").iterdir():
        for pid in (task / "children").read_text().split():
            try:
                env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            ranks = [int(e.split(b"=", 1)[1]) for e in env if e.startswith(b"RANK=")]
            if ranks:
                out[ranks[0]] = int(pid)
    return out


@pytest.mark.slow  # an elastic restart of two ranks and a reference run: about 13 s on two cores
@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="finds the worker to kill through /proc (Linux)")
def test_a_rank_killed_mid_run_is_restarted_and_ends_with_the_uninterrupted_weights(one_node, tmp_path):
    _, config, data, flags, reference = one_node
    out = tmp_path / "killed"
    agent = subprocess.Popen(
        # An elastic node range (1:2); the rendezvous waits 1 s, not 30, for a second node that never comes.
        _elastic(_free_port(), "1:2", 2, "--max_restarts=1", "--rdzv_conf=last_call_timeout=1",
                 *_pretrain_flags(config, data, out, *flags)),
        env=_env(), stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.time() + TIMEOUT
    while not (out / "checkpoint-3").is_dir() and agent.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    workers = _worker_pids(agent.pid)
    assert 1 in workers and not (out / "model").exists(), "the run ended before it could be interrupted"
    os.kill(workers[1], signal.SIGKILL)
    _, err = agent.communicate(timeout=TIMEOUT)
    assert agent.returncode == 0, err[-3000:]
    assert "exitcode: -9" in err  # torchrun saw the rank die, and restarted the group
    log = (out / "log.txt").read_text()
    assert "resuming from" in log and f"checkpoint-{ELASTIC_STEPS}" not in log.split("resuming from")[1][:200]
    assert_same_weights(read_weights(reference / "model"), read_weights(out / "model"))
    assert [m["loss"] for m in read_metrics(out)] == [m["loss"] for m in read_metrics(reference)]


@pytest.mark.slow  # two FSDP processes and a reference run: about 20 s on two cores
def test_fsdp_two_processes_equal_one(tmp_path):
    # FSDP on CPU (gloo): the same losses and weights as one process, and a rerun resumes the sharded
    # optimizer state from the full checkpoint.
    data, _ = synthetic_data(tmp_path, n=24, seq=32)
    config = write_tiny_config(tmp_path / "bert_config.json", 99, max_position_embeddings=32, **NO_DROPOUT)
    common = ["--num_train_steps=6", "--save_checkpoints_steps=3"]
    two = tmp_path / "fsdp"
    cmd = _torchrun("--standalone", "--nproc_per_node=2", *_pretrain_flags(config, data, two, *common, "--fsdp"))
    _check(subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=TIMEOUT))
    # The one-process reference runs after the two ranks, not beside them: on two cores a third process slows
    # them (a rank aborted once in a loaded run; the cause was not found).
    one = tmp_path / "one"
    _check(subprocess.run([sys.executable, *_pretrain_flags(config, data, one, *common)], env=_env(),
                          capture_output=True, text=True, timeout=TIMEOUT))  # fmt: skip
    np.testing.assert_allclose(
        [m["loss"] for m in read_metrics(two)], [m["loss"] for m in read_metrics(one)], atol=1e-5
    )
    wa, wb = read_weights(one / "checkpoint-3"), read_weights(two / "checkpoint-3")
    assert max(float((wa[k] - wb[k]).abs().max()) for k in wa) < 1e-5
    state = torch.load(two / "checkpoint-6" / TRAINING_STATE_NAME, weights_only=True)
    assert state["world_size"] == 2 and len(state["rng"]) == 2
    again = subprocess.run([*cmd, "--do_eval", "--max_eval_steps=2"], env=_env(), capture_output=True, text=True,
                           timeout=TIMEOUT)  # fmt: skip
    _check(again)
    assert "resuming from" in (two / "log.txt").read_text()
    assert read_results(two / "eval_results.txt")["global_step"] == "6"


def test_checkpoints_every_few_minutes(tmp_path):
    data, _ = synthetic_data(tmp_path, n=24, seq=32)
    config = write_tiny_config(tmp_path / "bert_config.json", 99, max_position_embeddings=32, **NO_DROPOUT)
    out = tmp_path / "run"
    run_pretrain(PretrainArgs(
        bert_config_file=str(config), input_file=str(data), output_dir=str(out), do_train=True, train_batch_size=8,
        max_seq_length=32, max_predictions_per_seq=5, num_train_steps=4, num_warmup_steps=1, log_every=1,
        save_checkpoints_steps=1000, save_checkpoints_minutes=1e-9, keep_checkpoint_max=0,
    ))  # fmt: skip
    # Each step took longer than the interval: a checkpoint after every step, though the step cadence is 1000.
    assert [s for s, _ in list_checkpoints(out)] == [1, 2, 3, 4]


# ---------------------------------------------------------------------------------------- sharded embedding
def test_sharded_embedding_equals_unsharded(tmp_path, monkeypatch):
    import bert.input_lines
    from bert.commands.embed import EmbedArgs, run_embed
    from bert.utils import shard_file

    _, _, model = save_tiny_model(tmp_path, shared_path("data", "vocab", "uncased.txt"), True)
    texts = [f"sentence number {i} about {'cats' if i % 2 else 'dogs'} and more" for i in range(11)]
    inputs = tmp_path / "in.txt"
    inputs.write_text("".join(t + "\n" for t in texts))
    monkeypatch.setattr(bert.input_lines, "CHUNK_LINES", 2)  # shards that start and end inside chunks
    whole = tmp_path / "whole.npy"
    run_embed(EmbedArgs(model=str(model), input_file=str(inputs), output_file=str(whole)))
    out = tmp_path / "emb.npy"
    counts = [
        run_embed(EmbedArgs(model=str(model), input_file=str(inputs), output_file=str(out), num_shards=3,
                            shard_index=i))["lines"]
        for i in range(3)
    ]  # fmt: skip
    assert counts == [3, 4, 4]
    names = sorted(p.name for p in tmp_path.glob("emb-*.npy"))
    assert (
        names == [Path(shard_file(out, i, 3)).name for i in range(3)] == [f"emb-0000{i}-of-00003.npy" for i in range(3)]
    )
    joined = np.concatenate([np.load(tmp_path / n, mmap_mode="r") for n in names])  # in name order
    # Rows are embedded in other batches than unsharded (a shard's own length-sorted batches), and CPU
    # inference's GEMM blocking depends on a batch's rows: equal to float32 rounding, not bit for bit.
    np.testing.assert_allclose(joined, np.load(whole), rtol=0, atol=1e-6)
    with pytest.raises(InputError, match="--num_shards needs --output_file"):
        run_embed(EmbedArgs(model=str(model), input_file=str(inputs), num_shards=2, shard_index=1))


# ------------------------------------------------------------------------------------ the README's recipes
def _readme_blocks(language: str) -> list[str]:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    return re.findall(rf"^```{language}\n(.*?)^```", text, flags=re.M | re.S)


def test_readme_slurm_scripts_parse_and_run_bert_through_the_schedulers_variables():
    scripts = _readme_blocks("sh")
    commands = ("create-pretraining-data", "pretrain", "embed")
    slurm = [s for s in scripts if "#SBATCH" in s]
    data, train, embed = (next(s for s in slurm if f"bert {c}" in s) for c in commands)
    for script in (data, train, embed):
        done = subprocess.run(["bash", "-n"], input=script, capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, done.stderr
        assert script.startswith("#!/bin/bash\n#SBATCH ")
    for array in (data, embed):  # one task per shard
        assert "#SBATCH --array=" in array
        assert '--num_shards="$SLURM_ARRAY_TASK_COUNT" --shard_index="$SLURM_ARRAY_TASK_ID"' in array
    # srun starts one torchrun per node; they meet through c10d on the first node, elastic with restarts.
    assert "srun torchrun" in train and "--rdzv_backend=c10d" in train and "--max_restarts=" in train
    assert '--rdzv_endpoint="$head_node:29500"' in train and "--nnodes=" in train
    for script in (data, train, embed):  # every flag given to bert is one of its command's flags
        _check_bert_flags(" ".join(script.replace("\\\n", " ").split("\n")))


def _check_bert_flags(line: str) -> None:
    """Every --flag=value after `bert COMMAND` in `line` is a flag of that command (`bert.cli.COMMANDS`)."""
    import dataclasses
    import importlib

    from bert.cli import COMMANDS

    command = re.search(r"bert ([a-z-]+)", line).group(1)
    module, args_name, _, _ = COMMANDS[command]
    known = {f.name for f in dataclasses.fields(getattr(importlib.import_module(module), args_name))}
    flags = set(re.findall(r"(?<![\w-])--([a-z_]+)=", line.split(f"bert {command}", 1)[1]))
    assert flags and flags <= known, (command, flags - known)


def test_readme_pytorchjob_manifest_is_an_elastic_torchrun_of_bert_pretrain():
    yaml = pytest.importorskip("yaml")
    (manifest,) = [yaml.safe_load(block) for block in _readme_blocks("yaml") if "PyTorchJob" in block]
    assert (manifest["apiVersion"], manifest["kind"]) == ("kubeflow.org/v1", "PyTorchJob")
    policy = manifest["spec"]["elasticPolicy"]
    assert policy["rdzvBackend"] == "c10d" and 1 <= policy["minReplicas"] <= policy["maxReplicas"]
    assert policy["maxRestarts"] >= 1
    worker = manifest["spec"]["pytorchReplicaSpecs"]["Worker"]
    assert policy["minReplicas"] <= worker["replicas"] <= policy["maxReplicas"]
    (container,) = worker["template"]["spec"]["containers"]
    command = container["command"]
    assert command[:1] == ["torchrun"] and command[command.index("-m") + 1 : command.index("-m") + 3] == [
        "bert",
        "pretrain",
    ]
    _check_bert_flags(" ".join(command))
    mounts = {m["name"] for m in container["volumeMounts"]}
    assert mounts == {v["name"] for v in worker["template"]["spec"]["volumes"]}


def test_sharded_prepare_corpus_concatenates_to_the_unsharded_output(tmp_path):
    from bert.commands.prepare_corpus import PrepareCorpusArgs, run_prepare_corpus
    from bert.utils import shard_file

    for i in range(5):
        text = "\n\n".join(f"Book {i} paragraph {p}. It has two sentences here." for p in range(3))
        (tmp_path / f"book{i}.txt").write_text(text + "\n")
    common = dict(input_file=str(tmp_path / "book*.txt"), sentence_splitter="blingfire", paragraph_mode="blank_line")
    pytest.importorskip("blingfire")
    run_prepare_corpus(PrepareCorpusArgs(output_file=str(tmp_path / "whole.txt"), **common))
    out = tmp_path / "sentences.txt"
    counts = [
        run_prepare_corpus(PrepareCorpusArgs(output_file=str(out), num_shards=3, shard_index=i, **common))["files"]
        for i in range(3)
    ]
    assert counts == [1, 2, 2]
    joined = "".join(Path(shard_file(out, i, 3)).read_text() for i in range(3))
    assert joined == (tmp_path / "whole.txt").read_text() and joined.count("Book 4 paragraph 2.") == 1
    with pytest.raises(InputError, match="--num_shards=6 exceeds the 5 input files"):
        run_prepare_corpus(PrepareCorpusArgs(output_file=str(out), num_shards=6, shard_index=0, **common))
