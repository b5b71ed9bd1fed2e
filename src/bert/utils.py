"""Small helpers below everything else: atomic file writes, reading text files (plain or gzipped, globs,
undecodable bytes named by line), a command's log file and progress bars, the record of what a command
did, flags that must be finite, and worker processes that end with their parent. No torch here.
"""

from __future__ import annotations

import codecs
import contextlib
import contextvars
import dataclasses
import errno
import glob
import gzip
import json
import logging
import math
import os
import re
import shutil
import struct
import sys
import tempfile
import threading
import time
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

from tqdm import tqdm

from bert import __version__
from bert.errors import InputError


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "w", encoding: str | None = "utf-8") -> Iterator[IO]:
    """Open a temporary file beside `path` and rename it onto `path` only if the block succeeds.

    A crash or an exception inside the block leaves `path` untouched (an earlier version stays whole)
    and removes the temporary file, so nothing half-written is ever seen under the final name. The
    temporary name is `.NAME.XXXXXXXX.tmp` (`bert.outputs` removes those a killed run left). A full disk or
    a read-only file system met while writing is raised as an `OSError` that names `path`.
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as e:
        raise _named(e, path) from None
    try:
        if "b" in mode:
            f = os.fdopen(fd, mode)
        else:
            f = os.fdopen(fd, mode, encoding=encoding, newline="")
        with f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        # mkstemp creates the file private (0600); give it the permissions a plain open() would.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if isinstance(e, OSError) and e.errno in _WRITE_ERRNOS:
            raise _named(e, path) from None
        raise


# Errors of writing, not reading: an OSError with one of these inside an atomic write is about its file.
_WRITE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG, errno.EACCES, errno.EPERM}


def _named(e: OSError, path: Path) -> OSError:
    """`e`, naming `path` when it names no file (a failed `write` does not know its file's name)."""
    if e.filename is None:
        e.filename = str(path)
    return e


LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


@contextlib.contextmanager
def log_to_file(path: str | os.PathLike, main: bool = True) -> Iterator[None]:
    """Within the block, also log this package's INFO messages to `path`, appended (on the main process;
    the other ranks log warnings only). The terminal shows what `bert.cli` lets through (warnings, or
    everything with --verbose); handlers set up by the caller (the CLI's, pytest's) are left in place."""
    package = logging.getLogger("bert")
    level = package.level
    package.setLevel(logging.INFO if main else logging.WARNING)
    handler = None
    path = Path(path)
    new_file, new_dir = not path.exists(), not path.parent.exists()
    if main:
        path.parent.mkdir(parents=True, exist_ok=True)
        handler = logging.FileHandler(path, encoding="utf-8", delay=True)
        handler.setFormatter(logging.Formatter(LOG_FORMAT))
        package.addHandler(handler)
    try:
        yield
    except (InputError, OSError):
        # Bad input (or a full disk, a read-only place) stops the command with nothing written: the log
        # file it started goes too; the one error line says what happened.
        if handler is not None and new_file:
            handler.close()
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            with contextlib.suppress(OSError):  # only when empty
                if new_dir:
                    path.parent.rmdir()
        raise
    finally:
        package.setLevel(level)
        if handler is not None:
            package.removeHandler(handler)
            handler.close()


def progress(iterable: Iterable | None = None, **kwargs: Any) -> tqdm:
    """A progress bar on stderr, with its rate and time left: one per stage of a command.

    Away from a terminal (a pipe, a CI log) it is redrawn every 10 seconds instead of several times a
    second, so logs hold a few updates per stage; `TQDM_DISABLE=1` hides every bar. A bar shows only after
    its first second, so work that ends sooner (or stops at once on bad input) leaves no bar behind.
    """
    interactive = getattr(sys.stderr, "isatty", lambda: False)()
    kwargs.setdefault("delay", 1.0)
    kwargs.setdefault("mininterval", 0.1 if interactive else 10.0)
    kwargs.setdefault("dynamic_ncols", True)
    # tqdm reads TQDM_* variables only for arguments left out; disable is often passed (ranks > 0).
    if os.environ.get("TQDM_DISABLE", "").lower() in ("1", "true", "yes"):
        kwargs["disable"] = True
    return tqdm(iterable, **kwargs)


def write_run_info(output_dir: str | os.PathLike, command: str, args: object) -> Path:
    """Record what a command did in `output_dir/args.json`: its resolved arguments and command line."""
    info = {
        "command": command,
        "args": dataclasses.asdict(args)
        if dataclasses.is_dataclass(args) and not isinstance(args, type)
        else dict(vars(args)),
        "argv": sys.argv,
        "cwd": os.getcwd(),
        "bert_version": __version__,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    path = Path(output_dir) / "args.json"
    with atomic_write(path) as f:
        json.dump(info, f, indent=2, sort_keys=True, default=str)
        f.write("\n")
    return path


# A lone surrogate (from a "\\ud800"-style escape in a JSON input) cannot be encoded as UTF-8.
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def json_line(obj: object) -> str:
    """`obj` as one line of JSON with non-ASCII characters as they are, or escaped when a lone surrogate
    would make the line unencodable as UTF-8.

    Raises:
        InputError: `obj` holds NaN or infinity, which JSON has no spelling for (Python's bare `NaN` is not
            JSON); a model that computes them is broken, so the output stops rather than lie.
    """
    try:
        line = json.dumps(obj, ensure_ascii=False, allow_nan=False)
    except ValueError:
        raise InputError(
            "a result holds NaN or infinity, which JSON cannot hold: the model's weights or its inputs overflow; "
            "check the model (its weights must be finite numbers)"
        ) from None
    return json.dumps(obj) if _LONE_SURROGATE.search(line) is not None else line


def as_number(value: Any) -> float | None:
    """A JSON number, or a text that spells one ("0.8", "nan", "1e999"), as a float, which may be NaN or
    infinite (a file's layout is judged by what looks like a number, so that a NaN score is refused on its
    line rather than taken for text); None for anything else (a bool, a text that is no number)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return None
    try:
        return float(value)
    except (ValueError, OverflowError):  # OverflowError: a JSON integer beyond a float
        return math.inf if isinstance(value, int) else None


def finite_number(value: Any, where: str, what: str = "score", note: str = "") -> float:
    """`value` (see `as_number`) as a finite float: the one rule of the data readers for a score or a regression
    label. `where` ("FILE:LINE"), `what` and `note` (after the value) name it in the error."""
    x = as_number(value)
    if x is None or not math.isfinite(x):
        shown = value if isinstance(value, str) else json.dumps(value)[:40]
        raise InputError(f"{where}: {what} {shown!r}{note} is not a finite number; give a number such as 0.8")
    return x


def parse_json_line(text: str) -> Any:
    """`json.loads` of one line of a JSON-lines input, for every reader of them (training files, predict's
    and rerank's inputs, BEIR files). A line nested too deeply for the parser (RecursionError) is an
    `InputError` without a location, which the reader adds ("FILE:LINE: ..."); a malformed line raises
    `json.JSONDecodeError` as `json.loads` does, for the reader to refuse or read as plain text."""
    try:
        return json.loads(text)
    except RecursionError:
        raise InputError("JSON nested too deeply to read; write one flat JSON value per line") from None


def load_json_file(path: str | os.PathLike, what: str, missing_ok: bool = False) -> Any:
    """Parse a JSON (or gzipped JSON) file; `what` names it in errors, e.g. "--predict_file" or "dataset".

    The one JSON reader of the package: a file that is there but unreadable is always an error naming it;
    a missing one is too, unless `missing_ok` (None is returned).
    """
    p = Path(path)
    if not p.is_file():
        if missing_ok:
            return None
        raise InputError(f"{what} {path}: no such file; check the path")
    try:
        with _open_binary(str(p)) as f:
            raw = f.read()
    except (OSError, EOFError, zlib.error) as e:
        raise InputError(f"{what} {path} cannot be read ({e}); is the file complete and not corrupt?") from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise InputError(
            f"{what} {path}:{line}: bytes that are not valid UTF-8 ({raw[e.start : e.end]!r}); save the file as UTF-8"
        ) from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError(
            f"{what} {path}:{e.lineno}: not valid JSON ({e.msg}, column {e.colno}); fix the file"
        ) from None
    except RecursionError:
        raise InputError(f"{what} {path}: JSON nested too deeply to read; fix the file") from None


# Bytes read at a time by `iter_lines`; a block always ends at a newline, so it never cuts a character.
_BLOCK_BYTES = 1 << 20
DECODE_ERRORS = ("strict", "ignore", "replace")


def expand_input_files(input_file: str, flag: str = "--input_file", directories: bool = False) -> list[str]:
    """Expand a comma-separated list of glob patterns, as the original's `tf.gfile.Glob` loop does.

    Each pattern's matches are sorted (the original's order is the file system's); `**` matches any
    number of directories. Directories are skipped unless `directories` (native pre-training datasets
    are directories).

    Raises:
        InputError: a pattern that matches no file, or an empty list.
    """
    files: list[str] = []
    for pattern in (p.strip() for p in input_file.split(",")):
        if not pattern:
            continue
        matches = glob.glob(os.path.expanduser(pattern), recursive=True)
        matches = sorted(m for m in matches if directories or os.path.isfile(m))
        if not matches:
            raise InputError(f"{flag}: nothing matches {pattern}; check the path or the glob pattern")
        files.extend(matches)
    if not files:
        raise InputError(f"{flag} is empty; give one or more files or glob patterns, comma-separated")
    return files


def text_size(path: str) -> int:
    """Uncompressed size of a file in bytes (a .gz file's ISIZE trailer, exact below 4 GiB)."""
    size = os.path.getsize(path)
    if path.endswith(".gz") and size >= 18:
        with open(path, "rb") as f:
            f.seek(-4, os.SEEK_END)
            return struct.unpack("<I", f.read(4))[0]
    return size


def _read_error(e: BaseException) -> str:
    """What went wrong reading a file, in words: gzip's EOFError of a file cut short has an empty message."""
    if isinstance(e, EOFError):
        return "it ends in the middle of its gzip stream: the file is cut short"
    if isinstance(e, gzip.BadGzipFile):
        return f"not a gzip file, though its name ends in .gz: {e}"
    return str(e)


def _open_binary(path: str):
    return gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")


def iter_lines(
    path: str,
    encoding: str = "utf-8",
    errors: str = "strict",
    hint: str | None = "--decode_errors=ignore",
    name: str | None = None,
) -> Iterator[str]:
    """The lines of a text file (plain, or gzip when the name ends in .gz), without their newline.

    Lines are split at "\\n" only, as the original's `tf.gfile.GFile.readline` does (a "\\r" before it
    is left to the caller's `strip()`); a last line without a newline is still a line, and a file that
    ends with a newline has no empty line after it. Decoding is done in 1 MB blocks, which is much
    faster than line by line.

    Args:
        path: the file.
        encoding: an ASCII-compatible text encoding (utf-8, latin-1, cp1252, ...).
        errors: "strict" raises on undecodable bytes; "ignore" drops them (the original's
            `convert_to_unicode`); "replace" substitutes U+FFFD.
        hint: the flag that would accept the file, quoted in the error message (None: none does, the
            message says to save the file as UTF-8).
        name: what errors call the file (default `path`): "<stdin>" for the copy `readable_input` made of it,
            whose temporary name means nothing to the user.

    Raises:
        InputError: undecodable bytes with errors="strict", naming the file, line and byte.
    """
    line_no = 0  # lines before the current block
    name = path if name is None else name
    # utf-8-sig drops a BOM before decoding, and its errors' offsets then miss its 3 bytes (a bad byte on
    # line 7 was reported on line 6): the BOM is dropped here instead, and the rest decoded as UTF-8.
    bom = None
    with contextlib.suppress(LookupError):
        if codecs.lookup(encoding).name == "utf-8-sig":
            bom, encoding = codecs.BOM_UTF8, "utf-8"
    try:
        f = _open_binary(path)
    except OSError as e:
        raise InputError(f"{name}: cannot open ({e.strerror or e}); check the path and permissions") from e
    with f:
        for data, last in _line_blocks(f, name):
            if bom is not None:
                data, bom = data.removeprefix(bom), None
            try:
                text = data.decode(encoding, errors)
            except UnicodeDecodeError as e:
                raise undecodable(name, data, e, line_no, encoding, hint) from e
            except LookupError as e:
                raise InputError(f"unknown text encoding {encoding!r}; use e.g. utf-8 or latin-1") from e
            lines = text.split("\n")
            if lines[-1] == "":
                lines.pop()  # the text after the final newline of the block
            line_no += data.count(b"\n")
            yield from lines
            if last:
                return


def _line_blocks(f: IO[bytes], name: str) -> Iterator[tuple[bytes, bool]]:
    """The bytes of `f` in blocks of whole lines (about _BLOCK_BYTES each), each with whether it is the last
    (which may end without a newline); nothing for an empty file."""
    rest = b""
    while True:
        try:
            block = f.read(_BLOCK_BYTES)
        except (OSError, EOFError, zlib.error) as e:
            raise InputError(f"{name}: cannot read ({_read_error(e)}); is the file complete and not corrupt?") from e
        if not block:
            if rest:
                yield rest, True
            return
        block = rest + block
        cut = block.rfind(b"\n") + 1
        if cut == 0:
            rest = block
            continue
        rest = block[cut:]
        yield block[:cut], False


def decode_line(raw: bytes, name: str, line: int, errors: str = "strict", hint: str = "--decode_errors=ignore") -> str:
    """One line of bytes as UTF-8 text; undecodable bytes with errors="strict" are an `InputError` naming
    `name`, the line and the column."""
    try:
        return raw.decode("utf-8", errors)
    except UnicodeDecodeError as e:
        raise undecodable(name, raw, e, line - 1, hint=hint) from None


def format_scores(metrics: dict[str, Any]) -> str:
    """ "key value, ..." of a result dict's numbers (global_step left out: the block says it), for `print_result`."""
    shown = sorted((k, v) for k, v in metrics.items() if k != "global_step" and isinstance(v, (int, float)))
    return ", ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}" for k, v in shown)


# False while a command runs others as its steps (`bert quickstart`): it prints one summary of them all.
_RESULT_BLOCKS = contextvars.ContextVar("result_blocks", default=True)


def print_result(command: str, *lines: str) -> None:
    """The block a command ends with on the terminal: what it computed, what it wrote where and, for a
    trained model, the command that uses it next. On stderr, as the progress bars: stdout may be the
    command's data (`bert embed` without --output_file). Empty lines are left out."""
    if _RESULT_BLOCKS.get():
        print(f"bert {command}: done", *(f"  {line}" for line in lines if line), sep="\n", file=sys.stderr)


@contextlib.contextmanager
def steps_without_result_blocks() -> Iterator[None]:
    """Commands run inside as steps of another print no result block of their own."""
    token = _RESULT_BLOCKS.set(False)
    try:
        yield
    finally:
        _RESULT_BLOCKS.reset(token)


def undecodable(
    name: str | os.PathLike,
    data: bytes,
    e: UnicodeDecodeError,
    lines_before: int = 0,
    encoding: str = "utf-8",
    hint: str | None = "--decode_errors=ignore",
) -> InputError:
    """The one message for bytes of a text input that `encoding` cannot decode: `name`:line, the column and the
    bytes, and the fix (`hint`: the flag that would drop them; None: save the file in the encoding).

    `data` holds whole lines; `lines_before` counts the lines of the input before it.
    """
    line = lines_before + data.count(b"\n", 0, e.start) + 1
    col = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
    enc = "UTF-8" if codecs.lookup(encoding).name in ("utf-8", "utf-8-sig") else encoding
    fix = f"fix the file, or pass {hint} to drop them" if hint else f"save the file as {enc}"
    return InputError(
        f"{name}:{line}: bytes that are not valid {enc} at column {col} ({data[e.start : e.end]!r}); {fix}"
    )


def exit_with_parent(parent_pid: int, interval: float = 0.5) -> None:
    """In a worker process: exit as soon as the process `parent_pid` that started it is gone.

    A killed parent cannot stop its workers, and a worker blocked on its task queue never learns about it
    (it holds the queue's other end itself). A daemon thread watches the parent pid instead.
    """

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(interval)
        os._exit(1)

    if os.getppid() != parent_pid:
        os._exit(1)
    threading.Thread(target=watch, daemon=True, name="exit-with-parent").start()


@contextlib.contextmanager
def readable_input(input_file: str | None, flag: str = "--input_file") -> Iterator[str]:
    """A path to read, more than once if need be: `input_file`, or stdin copied to a temporary file.

    Raises:
        InputError: `input_file` does not exist.
    """
    if input_file is not None:
        if not os.path.isfile(input_file):
            what = "not a regular file (read more than once)" if os.path.exists(input_file) else "no such file"
            raise InputError(f"{flag}={input_file}: {what}; pass an existing file, or omit it to read stdin")
        yield input_file
        return
    fd, tmp = tempfile.mkstemp(prefix="bert-stdin.", suffix=".txt")
    try:
        with os.fdopen(fd, "wb") as f:
            source = sys.stdin.buffer if hasattr(sys.stdin, "buffer") else None
            if source is not None:
                shutil.copyfileobj(source, f)
            else:  # a text stream (e.g. replaced in tests)
                f.write(sys.stdin.read().encode("utf-8"))
        yield tmp
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def head(items: list, limit: int) -> list:
    """The first `limit` items (`--max_train_examples`, `--max_eval_examples`); 0 keeps them all."""
    return items[:limit] if limit else items


def shard_file(path: str | os.PathLike, index: int, count: int) -> str:
    """The output of shard `index` of `count` of a job writing `path`: `emb.npy` -> `emb-00002-of-00008.npy`,
    so that the shards sort in order and name their set."""
    path = Path(path)
    suffixes = "".join(path.suffixes)
    stem = path.name[: len(path.name) - len(suffixes)] if suffixes else path.name
    return str(path.with_name(f"{stem}-{index:05d}-of-{count:05d}{suffixes}"))


def shard_range(total: int, index: int, count: int) -> range:
    """The contiguous share of `total` items (0-based) that shard `index` of `count` takes: consecutive
    shards take consecutive blocks, whose sizes differ by at most one."""
    return range(total * index // count, total * (index + 1) // count)


def count_lines(path: str) -> int:
    """The number of lines `iter_lines(path)` yields (a last line without a newline counts).

    Raises:
        InputError: the file cannot be read, or a .gz file is cut short or not gzip.
    """
    n = 0
    last = b"\n"
    try:
        with _open_binary(path) as f:
            while block := f.read(_BLOCK_BYTES):
                n += block.count(b"\n")
                last = block[-1:]
    except (OSError, EOFError, zlib.error) as e:
        raise InputError(f"{path}: cannot read ({_read_error(e)}); is the file complete and not corrupt?") from None
    return n + (last != b"\n")


@contextlib.contextmanager
def output_file_or_stdout(output_file: str | os.PathLike | None, mode: str = "w") -> Iterator[IO]:
    """A file to write: `output_file`, written atomically, or (None) stdout, written when the block succeeds.

    Either way nothing is seen before the whole output is there: stdout receives a temporary file's
    contents at the end, so an error midway leaves it empty rather than half-written.
    """
    if output_file is not None:
        with atomic_write(output_file, mode) as f:
            yield f
        return
    binary = "b" in mode
    with tempfile.TemporaryFile(
        mode="w+b" if binary else "w+", encoding=None if binary else "utf-8", newline=None if binary else ""
    ) as f:
        yield f
        f.seek(0)
        sys.stdout.flush()
        if binary:
            shutil.copyfileobj(f, sys.stdout.buffer)
        elif hasattr(sys.stdout, "buffer"):  # UTF-8 whatever the console's encoding
            shutil.copyfileobj(f.buffer if hasattr(f, "buffer") else f, sys.stdout.buffer)
        else:
            shutil.copyfileobj(f, sys.stdout)
        sys.stdout.flush()
