"""The foundation helpers: atomic writes, input file lists, reading text lines, JSON files, the run record."""

from __future__ import annotations

import argparse
import gzip
import json
import os
import stat
import sys
from dataclasses import dataclass

import pytest

from bert import __version__
from bert.errors import InputError
from bert.utils import atomic_write, expand_input_files, iter_lines, load_json_file, text_size, write_run_info


# ------------------------------------------------------------------------------------------ atomic_write
def test_atomic_write_replaces_the_file_when_the_block_succeeds(tmp_path):
    path = tmp_path / "sub" / "out.txt"  # missing parents are made
    with atomic_write(path) as f:
        f.write("héllo\r\n")
        assert not path.exists()  # nothing under the final name before the block ends
    assert path.read_bytes() == "héllo\r\n".encode()  # utf-8, newlines untranslated
    with atomic_write(path, "wb") as f:
        f.write(b"\x00\x01")
    assert path.read_bytes() == b"\x00\x01"
    assert os.listdir(path.parent) == ["out.txt"]


@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
def test_atomic_write_keeps_the_old_file_on_an_exception_and_leaves_no_temp_file(tmp_path, error):
    path = tmp_path / "out.txt"
    path.write_text("old contents")
    with pytest.raises(error), atomic_write(path) as f:
        f.write("half of the new")
        raise error()
    assert path.read_text() == "old contents"
    assert os.listdir(tmp_path) == ["out.txt"]
    with pytest.raises(RuntimeError), atomic_write(tmp_path / "new.txt") as f:
        raise RuntimeError
    assert os.listdir(tmp_path) == ["out.txt"]  # a file that did not exist is not created


def test_atomic_write_gives_the_permissions_of_open(tmp_path):
    old = os.umask(0o027)
    try:
        with atomic_write(tmp_path / "atomic.txt") as f:
            f.write("x")
        with open(tmp_path / "plain.txt", "w") as f:
            f.write("x")
    finally:
        os.umask(old)
    mode = stat.S_IMODE((tmp_path / "atomic.txt").stat().st_mode)
    assert mode == stat.S_IMODE((tmp_path / "plain.txt").stat().st_mode) == 0o640  # not mkstemp's 0600


# ------------------------------------------------------------------------------------ expand_input_files
def test_expand_input_files(tmp_path):
    for name in ("b.txt", "a.txt", "c.gz"):
        (tmp_path / name).write_text("x")
    files = expand_input_files(f"{tmp_path}/*.txt,{tmp_path}/c.gz")
    assert [p.rsplit("/", 1)[1] for p in files] == ["a.txt", "b.txt", "c.gz"]
    with pytest.raises(InputError, match="nothing matches"):
        expand_input_files(f"{tmp_path}/*.txt,{tmp_path}/missing*.txt")


def test_expand_input_files_order_directories_and_errors(tmp_path):
    for name in ("z.txt", "d1/b.txt", "d1/a.txt", "d1/d2/c.txt"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x")
    names = lambda files: [os.path.relpath(f, tmp_path) for f in files]  # noqa: E731
    # Patterns in the order given, each pattern's matches sorted; a file named twice is read twice.
    got = expand_input_files(f" {tmp_path}/z.txt , {tmp_path}/d1/*.txt,{tmp_path}/z.txt,")
    assert names(got) == ["z.txt", "d1/a.txt", "d1/b.txt", "z.txt"]
    assert names(expand_input_files(f"{tmp_path}/**/*.txt")) == ["d1/a.txt", "d1/b.txt", "d1/d2/c.txt", "z.txt"]
    # Directories are skipped unless asked for (native datasets are directories).
    with pytest.raises(InputError, match=r"^--input_file: nothing matches .*/d1/d\*; check the path"):
        expand_input_files(f"{tmp_path}/d1/d*")
    assert names(expand_input_files(f"{tmp_path}/d1/d*", directories=True)) == ["d1/d2"]
    with pytest.raises(InputError, match=r"^--train_file is empty; give one or more files"):
        expand_input_files(" , ", flag="--train_file")


def test_expand_input_files_expands_the_home_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "corpus.txt").write_text("x")
    assert expand_input_files("~/corpus.txt") == [str(tmp_path / "corpus.txt")]


# -------------------------------------------------------------------------------------------- iter_lines
def test_iter_lines_plain_gz_crlf_and_no_final_newline(tmp_path):
    plain = tmp_path / "a.txt"
    plain.write_bytes(b"one\r\ntwo\n\nthree")
    packed = tmp_path / "b.txt.gz"
    packed.write_bytes(gzip.compress(b"one\r\ntwo\n\nthree\n"))
    assert list(iter_lines(str(plain))) == ["one\r", "two", "", "three"]
    assert list(iter_lines(str(packed))) == ["one\r", "two", "", "three"]


def test_iter_lines_names_file_and_line_of_bad_bytes(tmp_path):
    path = tmp_path / "bad.txt"
    path.write_bytes(b"fine\nalso fine\nbad \xff byte\n")
    with pytest.raises(InputError, match=r"bad\.txt:3: .*column 5.*--decode_errors=ignore"):
        list(iter_lines(str(path)))
    assert list(iter_lines(str(path), errors="ignore")) == ["fine", "also fine", "bad  byte"]


def test_iter_lines_long_file_counts_lines_across_blocks(tmp_path, monkeypatch):
    import bert.utils as pc

    monkeypatch.setattr(pc, "_BLOCK_BYTES", 16)
    path = tmp_path / "long.txt"
    path.write_bytes(b"".join(b"line %d\n" % i for i in range(50)) + b"\xc3(\n")
    with pytest.raises(InputError, match=r"long\.txt:51:"):
        list(iter_lines(str(path)))


def test_iter_lines_across_small_blocks_other_encodings_and_bad_files(tmp_path, monkeypatch):
    import bert.utils as pc

    monkeypatch.setattr(pc, "_BLOCK_BYTES", 5)  # blocks end inside lines and inside multi-byte characters
    text = "ünïcödé line\nshort\n\n" + "x" * 23 + "\nlast é"
    path = tmp_path / "a.txt"
    path.write_bytes(text.encode())
    assert list(iter_lines(str(path))) == text.split("\n")
    path.write_bytes("café\n".encode("latin-1"))
    assert list(iter_lines(str(path), encoding="latin-1")) == ["café"]
    assert list(iter_lines(str(path), errors="replace")) == ["caf\ufffd"]
    with pytest.raises(InputError, match="unknown text encoding 'klingon'"):
        list(iter_lines(str(path), encoding="klingon"))
    with pytest.raises(InputError, match=r"missing\.txt: cannot open .*check the path"):
        list(iter_lines(str(tmp_path / "missing.txt")))
    (tmp_path / "cut.txt.gz").write_bytes(gzip.compress(b"a\n" * 1000)[:-10])
    with pytest.raises(InputError, match=r"cut\.txt\.gz: cannot read .*is the file complete"):
        list(iter_lines(str(tmp_path / "cut.txt.gz")))
    (tmp_path / "empty.txt").write_bytes(b"")
    assert list(iter_lines(str(tmp_path / "empty.txt"))) == []


def test_text_size_is_the_uncompressed_size(tmp_path):
    text = "ünïcode line\n" * 1000
    (tmp_path / "a.txt").write_text(text, encoding="utf-8")
    (tmp_path / "a.txt.gz").write_bytes(gzip.compress(text.encode()))
    assert text_size(str(tmp_path / "a.txt")) == text_size(str(tmp_path / "a.txt.gz")) == len(text.encode())
    assert (tmp_path / "a.txt.gz").stat().st_size < len(text.encode()) // 10


# ---------------------------------------------------------------------------------------- load_json_file
def test_load_json_file_reads_plain_and_gzipped_json(tmp_path):
    (tmp_path / "a.json").write_text('{"a": [1, "é"]}', encoding="utf-8")
    (tmp_path / "b.json.gz").write_bytes(gzip.compress(b'{"b": 2}'))
    assert load_json_file(tmp_path / "a.json", "--predict_file") == {"a": [1, "é"]}
    assert load_json_file(str(tmp_path / "b.json.gz"), "dataset") == {"b": 2}


@pytest.mark.parametrize(
    "name, content, message",
    [
        ("missing.json", None, r"^--predict_file \S*missing\.json: no such file; check the path$"),
        ("bad.json", b'{"a": ', r"^--predict_file \S*bad\.json:1: not valid JSON \(.*, column 7\); fix the file$"),
        ("latin.json", '{"a": "é"}'.encode("latin-1"), r"latin\.json:1: bytes that are not valid UTF-8 \(b'\\xe9'\)"),
        ("bad.json.gz", b"not gzip", r"bad\.json\.gz cannot be read \(.*\); is the file complete and not corrupt\?$"),
    ],
)
def test_load_json_file_errors_name_the_file_and_the_flag(tmp_path, name, content, message):
    if content is not None:
        (tmp_path / name).write_bytes(content)
    with pytest.raises(InputError, match=message):
        load_json_file(tmp_path / name, "--predict_file")


# ---------------------------------------------------------------------------------------- write_run_info
@dataclass
class _Args:
    output_dir: str
    rate: float = 2e-5
    layers: tuple = (-1, -2)


def test_write_run_info_records_the_resolved_args(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["bert", "classify", "--rate=2e-5"])
    path = write_run_info(tmp_path / "out", "classify", _Args(output_dir="out"))
    assert path == tmp_path / "out" / "args.json"
    info = json.loads(path.read_text())
    assert set(info) == {"command", "args", "argv", "bert_version", "cwd", "time"}
    assert info["cwd"] == os.getcwd()  # relative paths in args resolve against it
    assert info["command"] == "classify" and info["bert_version"] == __version__
    assert info["args"] == {"output_dir": "out", "rate": 2e-5, "layers": [-1, -2]}
    assert info["argv"] == ["bert", "classify", "--rate=2e-5"]
    assert list(info) == sorted(info) and path.read_text().endswith("}\n")
    # argparse namespaces too; values JSON cannot hold are written as their str().
    write_run_info(tmp_path / "out", "tokenize", argparse.Namespace(vocab=tmp_path / "v.txt"))
    assert json.loads(path.read_text())["args"] == {"vocab": str(tmp_path / "v.txt")}
