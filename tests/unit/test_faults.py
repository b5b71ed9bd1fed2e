"""Fault injection: what a careless or unlucky user meets, and that each ends in one line or works.

Every test below injects one fault and checks the promise: one error line (`bert CMD: error: ...`), exit
code 2, no traceback, nothing half-written, the previous output intact, the user's data untouched.
Each test, the fault it injects -> what it proves:

- `test_output_of_the_wrong_kind`: an output path that is a directory, a file, or under a file (7 commands) -> refused
  in one line before any work (the model is never loaded).
- `test_output_under_a_read_only_directory`: a read-only tmpfs (root) -> refused before work, naming the file system.
- `test_write_error_after_the_checks`: EROFS raised by the write itself -> the CLI turns the OSError into one line
  with the flag.
- `test_full_disk_keeps_the_previous_output`: ENOSPC from every atomic write (patched) -> one line naming the file and
  the fix; the earlier output and no temp file remain.
- `test_full_tmpfs`: a real 256 KB tmpfs (root) filled by tokenize, create-pretraining-data, convert -> the same on a
  real full disk; convert leaves no empty directory.
- `test_full_disk_during_pretraining_keeps_the_last_checkpoint`: ENOSPC while saving checkpoint-4 -> one line;
  checkpoint-2 intact and resumable; no `.tmp` left.
- `test_output_that_is_an_input`: `--output_file` = `--input_file` (tokenize, prepare-corpus, create-pretraining-data)
  -> refused; the input is byte for byte unchanged.
- `test_second_run_on_a_locked_output`: another process holds the output -> one line naming its pid and host; nothing
  written.
- `test_stale_lock_is_taken_over`: a lock file left by a dead process -> the run proceeds with a warning and removes
  the lock at the end.
- `test_lock_without_flock_judges_the_pid`: a file system without flock -> a live holder's pid refuses, a dead one's
  is taken over.
- `test_kill_during_export_is_cleaned_up`: SIGKILL inside the final export (a real kill) -> the rerun removes the
  `.model.tmp-*` and exports the model.
- `test_workers_die_with_their_parent`: SIGKILL of create-pretraining-data --num_workers=2 -> its workers exit; the
  rerun removes the temporary dataset.
- `test_flags_must_be_finite`: `--learning_rate=inf`, `nan` -> refused in one line.
- `test_diverging_run_stops_before_nan_weights`: `--learning_rate=1e30` -> stops naming the step; no NaN checkpoint,
  no exported model.
- `test_nonfinite_steps_are_skipped_and_counted`: a NaN loss at step 3 -> stops at step 3 by default;
  `--max_nonfinite_steps=1` skips it, counts it in metrics.jsonl.
- `test_bit_flip_in_a_checkpoint`: one flipped bit in model.safetensors, then in training_state.pt -> resume refuses
  naming the file; `--ignore_checkpoint_digest` loads it.
- `test_rerun_with_changed_flags`: pretrain rerun with another batch size and learning rate -> refused naming both;
  `--allow_changed_flags` records them in the history, keeps args.json, removes stale results.
- `test_classify_rerun_with_another_task`: classify rerun with another `--task_name` -> refused; the earlier
  test_results.tsv stays.
- `test_decoding_errors_name_the_right_line`: a bad byte on line 3000 (TSV, JSON lines, CoNLL, tokenize,
  extract-features) -> the message names that line.
- `test_vocab_without_unk`: a vocab without [UNK] and an unknown word -> one line naming the vocab file.
- `test_generic_tsv_row_with_too_few_columns`: a row missing its label -> an error naming the line, not a new class.
- `test_squad_duplicate_question_ids`: a question id twice -> refused by the reader and the evaluation.
- `test_damaged_gzip`: a corrupt .gz stream -> one line naming the file.
"""

from __future__ import annotations

import errno
import gzip
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from bert import outputs, utils
from bert.cli import main as cli_main
from bert.errors import InputError
from conftest import REPO, cli_error, save_tiny_model, write_tiny_config

SAMPLE = REPO / "tests" / "fixtures" / "pretraining_tfrecord" / "sample_text_nowwm.tfrecord"
WORDS = ["the", "cat", "sat", "on", "mat", "dog", "ran", "a", "good", "bad", "day", "##s", "##ing", ".", ","]


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO / "src")}


@pytest.fixture(scope="module")
def vocab(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    path.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory, vocab):
    """(config, vocab, init): a random tiny pre-training model over `vocab`."""
    return save_tiny_model(tmp_path_factory.mktemp("tiny"), vocab, True)


def _text(tmp: Path, lines: int = 50) -> Path:
    path = tmp / "corpus.txt"
    sentences = ["the cat sat on the mat .", "a dog ran , the dogs ran .", "a good day .", "a bad day ."]
    doc = [sentences[i % 4] for i in range(lines)]
    path.write_text("\n".join(doc[:25]) + "\n\n" + "\n".join(doc[25:]) + "\n", encoding="utf-8")
    return path


def _pretrain_argv(tmp: Path, out: Path, *extra: str) -> list[str]:
    config = tmp / "bert_config.json"
    if not config.exists():
        write_tiny_config(config, 30522)
    return [
        f"--bert_config_file={config}",
        f"--input_file={SAMPLE}",
        f"--output_dir={out}",
        "--do_train",
        "--train_batch_size=4",
        "--num_train_steps=4",
        "--num_warmup_steps=1",
        "--learning_rate=1e-3",
        "--save_checkpoints_steps=2",
        "--log_every=1",
        *extra,
    ]


def _classify_data(tmp: Path) -> Path:
    data = tmp / "data"
    data.mkdir(exist_ok=True)
    rows = [("the cat sat on the mat .", "1"), ("a bad day .", "0"), ("a good day .", "1"), ("the dog ran", "0")]
    for name in ("train", "dev", "test"):
        (data / f"{name}.tsv").write_text("".join(f"{t}\t{label}\n" for t, label in rows * 2), encoding="utf-8")
    return data


def _classify_argv(tiny_model, data: Path, out: Path, *extra: str) -> list[str]:
    config, vocab, init = tiny_model
    return [
        "--task_name=generic",
        f"--data_dir={data}",
        f"--output_dir={out}",
        f"--vocab_file={vocab}",
        f"--bert_config_file={config}",
        f"--init_checkpoint={init}",
        "--do_train",
        "--train_batch_size=4",
        "--num_train_epochs=1",
        "--max_seq_length=16",
        "--device=cpu",
        *extra,
    ]


def _leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.rglob("*") if outputs.TEMP_NAME.match(p.name) or p.name.endswith(".lock"))


# ------------------------------------------------------------------------------------ output path kinds
def _never(*_, **__):
    raise AssertionError("the work started before the outputs were checked")


@pytest.mark.parametrize(
    "command, flag, kind",
    [
        ("tokenize", "--output_file", "dir"),
        ("extract-features", "--output_file", "dir"),
        ("pretrain", "--output_dir", "file"),
        ("classify", "--output_dir", "file"),
        ("convert", "--output", "file"),
        ("quickstart", "--output_dir", "file"),
        ("tokenize", "--output_file", "under-file"),
    ],
)
def test_output_of_the_wrong_kind(capsys, monkeypatch, tmp_path, vocab, tiny_model, command, flag, kind):
    target = tmp_path / "target"
    if kind == "dir":
        target.mkdir()
    elif kind == "file":
        target.write_text("keep me")
    else:
        (tmp_path / "a-file").write_text("keep me")
        target = tmp_path / "a-file" / "out.jsonl"
    argv = {
        "tokenize": [f"--vocab_file={vocab}", f"--input_file={_text(tmp_path)}"],
        "extract-features": [],
        "pretrain": _pretrain_argv(tmp_path, tmp_path / "unused")[:2] + ["--do_train"],
        "classify": _classify_argv(tiny_model, _classify_data(tmp_path), tmp_path / "unused")[:6] + ["--do_train"],
        "convert": [f"--input={tiny_model[2]}"],
        "quickstart": [],
    }[command]
    # The expensive work must not start: reading the model or the data, unpacking the data.
    work = {
        "extract-features": "bert.checkpoint.read_checkpoint",  # imported by the command when it runs
        "convert": "bert.checkpoint.read_checkpoint",
        "quickstart": "bert.commands.quickstart._unpack_data",
        "pretrain": "bert.pretraining.run.open_pretraining_data",
        "classify": "bert.starting_model.read_checkpoint",
        "tokenize": "bert.commands.tokenize.FullTokenizer",
    }
    monkeypatch.setattr(work[command], _never)
    line = cli_error(capsys, command, *argv, f"{flag}={target}")
    expected = {"dir": "is a directory", "file": "is a file", "under-file": "is a file, not a directory"}[kind]
    assert expected in line and f"{flag}={target}" in line, line
    assert "choose another" in line or "give a" in line, line
    if kind != "dir":
        assert (tmp_path / ("a-file" if kind == "under-file" else "target")).read_text() == "keep me"


def _mount_tmpfs(path: Path, options: str) -> None:
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root")
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")


@pytest.fixture
def mounts():
    mounted: list[Path] = []
    yield lambda path, options: (_mount_tmpfs(path, options), mounted.append(path))
    for path in reversed(mounted):
        subprocess.run(["umount", "-l", str(path)], check=False)


def test_output_under_a_read_only_directory(capsys, tmp_path, vocab, mounts):
    ro = tmp_path / "ro"
    mounts(ro, "ro,size=64k")
    line = cli_error(capsys, "tokenize", f"--vocab_file={vocab}", f"--input_file={_text(tmp_path)}",
                     f"--output_file={ro / 'out.jsonl'}")  # fmt: skip
    assert "read-only file system" in line and "choose another --output_file" in line, line


def test_write_error_after_the_checks(capsys, monkeypatch, tmp_path, vocab):
    # A file system that turns read-only after the checks (a remount, a network share): the write fails.
    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.setattr("bert.utils.tempfile.mkstemp", read_only)
    out = tmp_path / "sub" / "out.jsonl"
    line = cli_error(
        capsys, "tokenize", f"--vocab_file={vocab}", f"--input_file={_text(tmp_path)}", f"--output_file={out}"
    )
    assert line.endswith(f"cannot write {out}: read-only file system; choose another --output_file"), line
    assert not (tmp_path / "sub").exists()  # the directory the claim made for it is gone again


# ------------------------------------------------------------------------------------------ full disk
class _FullDisk:
    """`os.fdopen` whose files raise ENOSPC once `budget` bytes have been written through them in all."""

    def __init__(self, monkeypatch, budget: int):
        self.budget = budget
        real = os.fdopen

        def fdopen(fd, mode="r", *args, **kwargs):
            f = real(fd, mode, *args, **kwargs)
            if "w" not in mode:
                return f
            write = f.write

            def limited(data):
                self.budget -= len(data)
                if self.budget < 0:
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                return write(data)

            f.write = limited
            return f

        monkeypatch.setattr(utils.os, "fdopen", fdopen)


def test_full_disk_keeps_the_previous_output(capsys, monkeypatch, tmp_path, vocab):
    out = tmp_path / "tokens.jsonl"
    out.write_text("the previous output\n")
    _FullDisk(monkeypatch, budget=100)
    line = cli_error(
        capsys, "tokenize", f"--vocab_file={vocab}", f"--input_file={_text(tmp_path)}", f"--output_file={out}"
    )
    assert line.endswith(f"no space left on device while writing {out}; free space or choose another --output_file"), (
        line
    )
    assert out.read_text() == "the previous output\n"
    assert _leftovers(tmp_path) == []


def test_full_tmpfs(capsys, tmp_path, vocab, tiny_model, mounts):
    full = tmp_path / "full"
    mounts(full, "size=256k")
    big = tmp_path / "big.txt"
    big.write_text(_text(tmp_path).read_text() * 200)
    previous = full / "tokens.jsonl"
    previous.write_text("the previous output\n")
    line = cli_error(capsys, "tokenize", f"--vocab_file={vocab}", f"--input_file={big}", f"--output_file={previous}")
    assert "no space left on device while writing" in line and str(previous) in line, line
    assert previous.read_text() == "the previous output\n"
    line = cli_error(capsys, "create-pretraining-data", f"--input_file={big}", f"--vocab_file={vocab}",
                     f"--output_file={full / 'data'}", "--max_seq_length=32", "--dupe_factor=5")  # fmt: skip
    assert "no space left on device" in line and "--output_file" in line, line
    (tmp_path / "big").mkdir()
    big_model = save_tiny_model(tmp_path / "big", vocab, True, hidden_size=128, intermediate_size=512)[2]
    line = cli_error(capsys, "convert", f"--input={big_model}", f"--output={full / 'converted'}")
    assert "no space left on device" in line and "--output" in line, line
    assert not (full / "converted").exists(), "a failed convert leaves no (empty) output directory"
    assert _leftovers(full) == [] and sorted(p.name for p in full.iterdir()) == ["tokens.jsonl"]


def test_full_disk_during_pretraining_keeps_the_last_checkpoint(capsys, monkeypatch, tmp_path):
    out = tmp_path / "run"
    argv = _pretrain_argv(tmp_path, out, "--keep_checkpoint_max=1")
    real = torch.save

    def save(obj, f, *args, **kwargs):  # the disk fills up while checkpoint-4 is written, as torch reports it
        if isinstance(obj, dict) and obj.get("step") == 4:
            try:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            except OSError:
                raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598") from None
        return real(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save)
    line = cli_error(capsys, "pretrain", *argv)
    assert "no space left on device while writing" in line and "training_state.pt" in line, line
    assert line.endswith("free space or choose another --output_dir"), line
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(("check", "."))) == ["checkpoint-2"]
    monkeypatch.setattr(torch, "save", real)
    assert cli_main(["pretrain", *argv]) == 0  # resumes from checkpoint-2
    assert (out / "model" / "model.safetensors").is_file() and _leftovers(out) == []


# ---------------------------------------------------------------------------------------------- data lost
def test_output_that_is_an_input(capsys, tmp_path, vocab):
    text = _text(tmp_path)
    before = text.read_bytes()
    line = cli_error(capsys, "tokenize", f"--vocab_file={vocab}", f"--input_file={text}", f"--output_file={text}")
    assert f"--output_file={text} is also --input_file" in line, line
    line = cli_error(
        capsys, "prepare-corpus", f"--input_file={text}", f"--output_file={text}", "--sentence_splitter=pysbd"
    )
    assert "is also --input_file" in line, line
    line = cli_error(capsys, "create-pretraining-data", f"--input_file={text}", f"--output_file={text}",
                     f"--vocab_file={vocab}", "--output_format=tfrecord")  # fmt: skip
    assert "is also --input_file" in line, line
    line = cli_error(capsys, "tokenize", f"--vocab_file={vocab}", f"--input_file={text}", f"--output_file={vocab}")
    assert "is also --vocab_file" in line, line
    assert text.read_bytes() == before


def test_second_run_on_a_locked_output(capsys, tmp_path, vocab):
    out = tmp_path / "run"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from bert.outputs import claim\n"
         f"with claim('pretrain', dirs={{'--output_dir': {str(out)!r}}}):\n"
         "    print('held', flush=True); time.sleep(60)"],
        env=_env(), stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        line = cli_error(capsys, "pretrain", *_pretrain_argv(tmp_path, out))
        assert f"--output_dir={out} is in use by another run (bert pretrain, pid {holder.pid} on " in line, line
        assert socket.gethostname() in line and "wait for it to finish, or choose another --output_dir" in line
        assert sorted(p.name for p in out.iterdir()) == [".lock"]  # the second run wrote nothing
    finally:
        holder.kill()
        holder.wait()


def test_stale_lock_is_taken_over(caplog, tmp_path, vocab):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    pid = int(dead.stdout)
    out = tmp_path / "tokens.jsonl"
    lock = tmp_path / ".tokens.jsonl.lock"
    lock.write_text(json.dumps({"pid": pid, "host": socket.gethostname(), "command": "bert tokenize"}))
    (tmp_path / ".tokens.jsonl.abcd1234.tmp").write_text("half written")
    assert (
        cli_main(["tokenize", f"--vocab_file={vocab}", f"--input_file={_text(tmp_path)}", f"--output_file={out}"]) == 0
    )
    assert (
        "taking over the lock of a run that ended without releasing it" in caplog.text and f"pid {pid}" in caplog.text
    )
    assert out.is_file() and _leftovers(tmp_path) == []


def test_lock_without_flock_judges_the_pid(monkeypatch, tmp_path):
    # On a file system without flock the lock file's content decides.
    def no_flock(fd, op):
        raise OSError(errno.ENOLCK, "no locks")

    monkeypatch.setattr(outputs.fcntl, "flock", no_flock)
    lock = tmp_path / ".lock"
    lock.write_text(json.dumps({"pid": os.getppid(), "host": socket.gethostname(), "command": "bert pretrain"}))
    with pytest.raises(InputError, match=f"in use by another run .*pid {os.getppid()}.*delete {lock}"):
        with outputs.claim("pretrain", dirs={"--output_dir": tmp_path}):
            pass
    lock.write_text(json.dumps({"pid": 2**22 + 1, "host": socket.gethostname()}))  # beyond pid_max: dead
    with outputs.claim("pretrain", dirs={"--output_dir": tmp_path}):
        assert json.loads(lock.read_text())["pid"] == os.getpid()
    assert not lock.exists()


# ------------------------------------------------------------------------------------- crash leftovers
KILL_IN_EXPORT = """
import os, signal, sys
from bert import checkpointing
real = checkpointing.save_pretrained
def save_pretrained(model, path, *args, **kwargs):
    real(model, path, *args, **kwargs)
    if ".model.tmp-" in str(path):
        os.kill(os.getpid(), signal.SIGKILL)
checkpointing.save_pretrained = save_pretrained
from bert.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_kill_during_export_is_cleaned_up(tmp_path):
    out = tmp_path / "run"
    argv = ["pretrain", *_pretrain_argv(tmp_path, out)]
    killed = subprocess.run([sys.executable, "-c", KILL_IN_EXPORT, *argv], env=_env(), capture_output=True)
    assert killed.returncode == -signal.SIGKILL
    left = [p.name for p in out.iterdir() if p.name.startswith(".model.tmp-")]
    assert len(left) == 1 and (out / left[0] / "model.safetensors").is_file() and not (out / "model").exists()
    done = subprocess.run([sys.executable, "-m", "bert", *argv], env=_env(), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "taking over the lock" in done.stderr and "removed what an interrupted run left" in done.stderr
    assert (out / "model" / "model.safetensors").is_file() and _leftovers(out) == []


def _children(pid: int) -> set[int]:
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.add(int(stat.parent.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc to find the worker processes")
def test_workers_die_with_their_parent(tmp_path, vocab):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(_text(tmp_path).read_text() * 400)
    out = tmp_path / "data"
    argv = ["create-pretraining-data", f"--input_file={corpus}", f"--output_file={out}", f"--vocab_file={vocab}"]
    argv += ["--max_seq_length=32", "--num_workers=2", "--streaming_buffer_mb=0.01", "--output_format=native"]
    parent = subprocess.Popen([sys.executable, "-m", "bert", *argv], env=_env(), stderr=subprocess.DEVNULL)
    deadline = time.time() + 60
    workers: set[int] = set()
    while len(workers) < 2 and parent.poll() is None and time.time() < deadline:
        workers = {p for p in _children(parent.pid) if "spawn_main" in Path(f"/proc/{p}/cmdline").read_text()}
        time.sleep(0.05)
    assert len(workers) >= 2, "the workers did not start"
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.time() + 10
    while any(_alive(w) for w in workers) and time.time() < deadline:
        time.sleep(0.1)
    try:
        assert not any(_alive(w) for w in workers), "workers outlived their killed parent"
    finally:
        for w in workers:
            if _alive(w):
                os.kill(w, signal.SIGKILL)
    done = subprocess.run([sys.executable, "-m", "bert", *argv], env=_env(), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (out / "manifest.json").is_file() and _leftovers(tmp_path) == []


# ------------------------------------------------------------------------------------------- NaN and inf
@pytest.mark.parametrize("value", ["inf", "nan", "-inf"])
def test_flags_must_be_finite(capsys, tmp_path, value):
    line = cli_error(capsys, "pretrain", *_pretrain_argv(tmp_path, tmp_path / "run", f"--learning_rate={value}"))
    assert f"--learning_rate={float(value)}" in line, line
    assert not (tmp_path / "run").exists()


def test_diverging_run_stops_before_nan_weights(capsys, tmp_path):
    out = tmp_path / "run"
    line = cli_error(
        capsys, "pretrain", *_pretrain_argv(tmp_path, out, "--learning_rate=1e30", "--save_checkpoints_steps=1")
    )
    assert "not a finite number" in line or "NaN or inf" in line, line
    assert line.startswith("bert pretrain: error: step "), line
    assert not (out / "model").exists()
    from safetensors.torch import load_file

    for ckpt in out.glob("checkpoint-*"):
        assert all(bool(torch.isfinite(t).all()) for t in load_file(ckpt / "model.safetensors").values())


def _nan_at_step(monkeypatch, step: int) -> None:
    from bert.pretraining import run

    real = run.pretraining_loss
    calls = {"n": 0}

    def loss(model, batch, totals):
        calls["n"] += 1
        value, metrics = real(model, batch, totals)
        return (value * float("nan"), metrics) if calls["n"] == step else (value, metrics)

    monkeypatch.setattr(run, "pretraining_loss", loss)


def test_nonfinite_steps_are_skipped_and_counted(capsys, monkeypatch, tmp_path):
    _nan_at_step(monkeypatch, 3)
    out = tmp_path / "stop"
    line = cli_error(capsys, "pretrain", *_pretrain_argv(tmp_path, out))
    assert "step 3: the loss is not a finite number; the run stopped without applying it and the last good " in line
    assert "checkpoint is checkpoint-2" in line and "--max_nonfinite_steps=N" in line, line
    assert not (out / "model").exists() and not (out / "checkpoint-4").exists()

    _nan_at_step(monkeypatch, 3)
    out = tmp_path / "skip"
    assert cli_main(["pretrain", *_pretrain_argv(tmp_path, out, "--max_nonfinite_steps=1")]) == 0
    metrics = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2, 4]  # step 3 was skipped: no line of NaN means
    assert [m.get("nonfinite_steps", 0) for m in metrics] == [0, 0, 1]
    from safetensors.torch import load_file

    assert all(bool(torch.isfinite(t).all()) for t in load_file(out / "model" / "model.safetensors").values())


# ------------------------------------------------------------------------------------------------ bit flip
def _flip_a_bit(path: Path, offset_from_end: int = 100) -> None:
    data = bytearray(path.read_bytes())
    data[-offset_from_end] ^= 0x10
    path.write_bytes(bytes(data))


def test_bit_flip_in_a_checkpoint(capsys, tmp_path):
    out = tmp_path / "run"
    assert cli_main(["pretrain", *_pretrain_argv(tmp_path, out, "--num_train_steps=2")]) == 0
    weights = out / "checkpoint-2" / "model.safetensors"
    _flip_a_bit(weights)
    argv = _pretrain_argv(tmp_path, out, "--num_train_steps=2", "--do_eval", "--max_eval_steps=1")
    line = cli_error(capsys, "pretrain", *argv)
    assert f"checkpoint {weights} is damaged" in line and "--ignore_checkpoint_digest" in line, line
    assert cli_main(["pretrain", *argv, "--ignore_checkpoint_digest"]) == 0

    _flip_a_bit(weights)  # back as saved; now the training state
    state = out / "checkpoint-2" / "training_state.pt"
    _flip_a_bit(state, 2000)
    line = cli_error(capsys, "pretrain", *argv)
    assert f"{state} is damaged" in line and "delete checkpoint-2" in line, line


# ----------------------------------------------------------------------------------------- changed flags
def test_rerun_with_changed_flags(capsys, tmp_path):
    out = tmp_path / "run"
    argv = _pretrain_argv(tmp_path, out, "--do_eval", "--max_eval_steps=1")
    assert cli_main(["pretrain", *argv]) == 0
    saved = (out / "args.json").read_text()
    assert cli_main(["pretrain", *argv]) == 0  # the same flags: a finished run is resumed as it is
    changed = [*argv, "--train_batch_size=8", "--learning_rate=2e-3"]
    line = cli_error(capsys, "pretrain", *changed)
    assert "--train_batch_size=8 (the run has 4)" in line and "--learning_rate=0.002 (the run has 0.001)" in line
    assert "--allow_changed_flags" in line, line

    eval_only = [a for a in changed if a != "--do_train"]  # evaluation alone may change training flags
    assert cli_main(["pretrain", *eval_only]) == 0

    assert cli_main(["pretrain", *changed, "--num_train_steps=6", "--allow_changed_flags", "--nodo_eval"]) == 0
    assert (out / "args.json").read_text() == saved  # the flags the run started with
    history = [json.loads(x) for x in (out / "args_history.jsonl").read_text().splitlines()]
    assert [h["changed"] for h in history][-1] == {
        "learning_rate": {"was": 0.001, "now": 0.002},
        "num_train_steps": {"was": 4, "now": 6},
        "train_batch_size": {"was": 4, "now": 8},
    }
    assert not (out / "eval_results.txt").exists()  # made with the earlier flags, and not redone
    assert (out / "checkpoint-6").is_dir() and (out / "model").is_dir()
    # The history counts: the new values are now the run's.
    assert cli_main(["pretrain", *changed, "--num_train_steps=6"]) == 0


def test_classify_rerun_with_another_task(capsys, tiny_model, tmp_path):
    data = _classify_data(tmp_path)
    out = tmp_path / "run"
    argv = _classify_argv(tiny_model, data, out, "--do_predict")
    assert cli_main(["classify", *argv]) == 0
    results = (out / "test_results.tsv").read_text()
    (data / "cola").mkdir()
    for name in ("train", "dev"):
        (data / "cola" / f"{name}.tsv").write_text("s\t1\t\tthe cat sat .\n" * 8)
    (data / "cola" / "test.tsv").write_text("index\tsentence\n" + "".join(f"{i}\tthe cat\n" for i in range(8)))
    other = _classify_argv(tiny_model, data / "cola", out, "--do_predict")
    line = cli_error(capsys, "classify", "--task_name=cola", *other[1:])
    assert "--task_name=cola (the run has generic)" in line and "--data_dir=" in line, line
    assert (out / "test_results.tsv").read_text() == results


# ---------------------------------------------------------------------------------------------- readers
def _with_bad_byte(path: Path, lines: list[str], bad_line: int) -> Path:
    data = "".join(line + "\n" for line in lines).encode()
    cut = sum(len(line.encode()) + 1 for line in lines[: bad_line - 1]) + 2
    path.write_bytes(data[:cut] + b"\xff" + data[cut:])
    return path


def test_decoding_errors_name_the_right_line(capsys, tmp_path, vocab):
    from bert.tasks.generic import GenericProcessor
    from bert.tasks.ner import read_conll

    n = 3000
    _with_bad_byte(tmp_path / "train.tsv", [f"the cat sat number {i}\tpos" for i in range(n + 10)], n)
    with pytest.raises(InputError, match=rf"train.tsv:{n}: bytes that are not valid UTF-8 at column 3"):
        GenericProcessor().get_train_examples(tmp_path)
    _with_bad_byte(tmp_path / "train.jsonl", ['{"text": "a cat", "label": "x"}'] * (n + 10), n)
    with pytest.raises(InputError, match=rf"train.jsonl:{n}: bytes"):
        GenericProcessor(text_a_column="text", label_column="label", train_file="train.jsonl").get_train_examples(
            tmp_path
        )
    conll = _with_bad_byte(tmp_path / "train.txt", ["EU B-ORG", "rejects O", ""] * (n // 3 + 5), n + 1)
    with pytest.raises(InputError, match=rf"train.txt:{n + 1}: bytes"):
        read_conll(conll, "train")
    text = _with_bad_byte(tmp_path / "text.txt", ["the cat sat"] * (n + 10), n)
    line = cli_error(capsys, "tokenize", f"--vocab_file={vocab}", f"--input_file={text}")
    assert f"{text}:{n}: bytes that are not valid UTF-8 at column 3" in line and "--decode_errors=ignore" in line
    assert cli_main(["tokenize", f"--vocab_file={vocab}", f"--input_file={text}", "--decode_errors=ignore",
                     f"--output_file={tmp_path / 'out.jsonl'}"]) == 0  # fmt: skip
    line = cli_error(
        capsys,
        "extract-features",
        f"--input_file={text}",
        f"--output_file={tmp_path / 'f.jsonl'}",
        "--max_seq_length=32",
        "--layers=-1",
    )
    assert f"{text}:{n}: bytes that are not valid UTF-8" in line, line


def test_vocab_without_unk(capsys, tmp_path, vocab):
    no_unk = tmp_path / "vocab.txt"
    no_unk.write_text(vocab.read_text().replace("[UNK]\n", ""))
    text = tmp_path / "text.txt"
    text.write_text("the cat\nthe zebra\n")
    line = cli_error(capsys, "tokenize", f"--vocab_file={no_unk}", f"--input_file={text}")
    assert f"vocab file {no_unk} has no [UNK] token" in line, line


def test_generic_tsv_row_with_too_few_columns(tmp_path):
    from bert.tasks.generic import GenericProcessor

    (tmp_path / "train.tsv").write_text("a good day\tpos\na bad day\tneg\na day without its label\nthe cat\tpos\n")
    with pytest.raises(InputError, match=r"train.tsv:3: 1 tab-separated columns, but line 1 has 2"):
        GenericProcessor().get_train_examples(tmp_path)


def test_squad_duplicate_question_ids(capsys, tmp_path):
    from bert.tasks.squad import read_squad_examples

    qa = {"id": "q1", "question": "who?", "answers": [{"text": "cat", "answer_start": 4}]}
    dataset = {"version": "1.1", "data": [{"title": "t", "paragraphs": [{"context": "the cat", "qas": [qa, qa]}]}]}
    path = tmp_path / "dev.json"
    path.write_text(json.dumps(dataset))
    with pytest.raises(
        InputError, match=re.escape("question 1 has the id 'q1' of article 0 ('t'), paragraph 0, question 0")
    ):
        read_squad_examples(path, is_training=False)
    preds = tmp_path / "preds.json"
    preds.write_text(json.dumps({"q1": "cat"}))
    line = cli_error(capsys, "evaluate-squad", str(path), str(preds))
    assert "has the id 'q1'" in line and "ids must be unique" in line, line


def test_damaged_gzip(capsys, tmp_path, vocab):
    good = bytearray(gzip.compress(_text(tmp_path).read_bytes() * 50))
    good[10] |= 0b110  # the first deflate block's type becomes 3, which is reserved: "invalid block type"
    damaged = tmp_path / "corpus.txt.gz"
    damaged.write_bytes(bytes(good))
    line = cli_error(capsys, "create-pretraining-data", f"--input_file={damaged}", f"--vocab_file={vocab}",
                     f"--output_file={tmp_path / 'out'}")  # fmt: skip
    assert f"{damaged}: cannot read" in line and "corrupt" in line, line
    assert not (tmp_path / "out").exists()
