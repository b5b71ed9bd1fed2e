"""Small helpers below everything else: atomic file writes, reading text files (plain or gzipped, globs,
undecodable bytes named by line), a command's log file and progress bars, and the record of what a
command did. No torch here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import gzip
import json
import logging
import os
import sys
import tempfile
import time
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
    and removes the temporary file, so nothing half-written is ever seen under the final name.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
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
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


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
    except InputError:
        # Bad input stops the command with nothing written: the log file it started goes too.
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
    second, so logs hold a few updates per stage; `TQDM_DISABLE=1` hides every bar.
    """
    interactive = getattr(sys.stderr, "isatty", lambda: False)()
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
        "args": dataclasses.asdict(args) if dataclasses.is_dataclass(args) else dict(vars(args)),
        "argv": sys.argv,
        "bert_version": __version__,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    path = Path(output_dir) / "args.json"
    with atomic_write(path) as f:
        json.dump(info, f, indent=2, sort_keys=True, default=str)
        f.write("\n")
    return path


def load_json_file(path: str | os.PathLike, what: str):
    """Parse a JSON (or gzipped JSON) file; `what` names it in errors, e.g. "--predict_file" or "dataset"."""
    p = Path(path)
    if not p.is_file():
        raise InputError(f"{what} {path}: no such file; check the path")
    opener = gzip.open if p.suffix == ".gz" else open
    try:
        with opener(p, "rt", encoding="utf-8") as f:
            return json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError, OSError, EOFError) as e:
        raise InputError(f"{what} {path} is not valid JSON ({e}); give a UTF-8 .json or .json.gz file") from None


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


def _open_binary(path: str):
    return gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")


def iter_lines(
    path: str, encoding: str = "utf-8", errors: str = "strict", hint: str = "--decode_errors=ignore"
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
        hint: the flag that would accept the file, quoted in the error message.

    Raises:
        InputError: undecodable bytes with errors="strict", naming the file, line and byte.
    """
    line_no = 0  # lines before the current block
    try:
        f = _open_binary(path)
    except OSError as e:
        raise InputError(f"{path}: cannot open ({e.strerror or e}); check the path and permissions") from e
    with f:
        rest = b""
        while True:
            try:
                block = f.read(_BLOCK_BYTES)
            except (OSError, EOFError, gzip.BadGzipFile) as e:
                raise InputError(f"{path}: cannot read ({e}); is the file complete and not corrupt?") from e
            if not block:
                data, rest = rest, b""
                if not data:
                    return
            else:
                block = rest + block
                cut = block.rfind(b"\n") + 1
                if cut == 0:
                    rest = block
                    continue
                data, rest = block[:cut], block[cut:]
            try:
                text = data.decode(encoding, errors)
            except UnicodeDecodeError as e:
                bad_line = line_no + data.count(b"\n", 0, e.start) + 1
                col = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
                raise InputError(
                    f"{path}:{bad_line}: bytes that are not valid {encoding} at column {col} "
                    f"({data[e.start : e.end]!r}); fix the file, or pass {hint} to drop them"
                ) from e
            except LookupError as e:
                raise InputError(f"unknown text encoding {encoding!r}; use e.g. utf-8 or latin-1") from e
            lines = text.split("\n")
            if lines[-1] == "":
                lines.pop()  # the text after the final newline of the block
            line_no += data.count(b"\n")
            yield from lines
            if not block:
                return
