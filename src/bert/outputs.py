"""Claiming a command's outputs before it works: one place for what every command does with its paths.

A run claims its outputs (`claim`, as a context manager) before any work:

- every output path is resolved and checked: a file output must not be a directory (nor a device), a
  directory output must not be a file, the nearest existing parent must be a writable directory, and no
  output may be one of the run's inputs (`bert tokenize --input_file=x.txt --output_file=x.txt` would
  replace the user's text), nor an existing file of an input directory (`bert fill-mask
  --output_file=MODEL/vocab.txt` would replace the model's vocabulary);
- each output is locked for the run: an exclusive `flock` on a lock file (`OUTPUT_DIR/.lock` for a
  directory, `.NAME.lock` beside a file) that names the holder's pid, host, command and start time. A
  second run on the same output stops with one line naming the holder; a lock left by a run that died
  (the kernel released its `flock`) is taken over with a warning. Where `flock` is not supported the
  lock file's content decides: a pid that is dead on this host is stale, anything else is refused;
- the temporary names that a killed run of the same output leaves (`.NAME.XXXXXXXX.tmp` files of
  `utils.atomic_write`, `.NAME.tmp-XXXXXXXX` and `.NAME.old-PID` directories of atomic directory
  writes) are removed: while the lock is held nobody else can be writing them;
- on leaving, the locks are released, and directories the claim created are removed when nothing was
  written into them (a run that fails its checks leaves no empty output directory behind).

`os_error_message` turns an `OSError` raised while writing (a full disk, a read-only file system, a
permission, a path of the wrong kind) into the one line the CLI prints, naming the path, the flag it
came from and the fix.

No torch here: `bert tokenize` claims its output too.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import json
import logging
import os
import re
import shutil
import socket
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from bert.errors import InputError

logger = logging.getLogger(__name__)

LOCK_NAME = ".lock"
# The outputs this process holds: a nested claim of one of them (a command claims its output directory
# before reading its inputs, the training loop claims it again) neither locks nor cleans it again.
_HELD: set[tuple[str, Path]] = set()
# The temporary names of this package's atomic writes: `.NAME.XXXXXXXX.tmp` (`utils.atomic_write`, from
# `tempfile.mkstemp`), `.NAME.tmp-XXXXXXXX` (atomic directories, from `tempfile.mkdtemp`) and
# `.NAME.old-PID` (a directory being replaced).
TEMP_NAME = re.compile(r"^\.(?P<base>.+)\.(?:[a-z0-9_]{8}\.tmp|tmp-[A-Za-z0-9_]+|old-\d+)$")


@dataclass
class Output:
    """One output of a run: `flag` names it in messages; `kind` is "file", "dir" (a directory the run
    writes into) or "tree" (a directory replaced as a whole, locked and cleaned beside it like a file);
    `derived` are the names of files written beside a file output (e.g. `NAME.args.json`), whose
    temporary names are cleaned too."""

    flag: str
    path: Path
    kind: str
    derived: tuple[str, ...] = ()


@dataclass
class Claim:
    """What a run holds while it works: its checked outputs and their locks."""

    command: str
    outputs: list[Output]
    _locks: list[_Lock] = field(default_factory=list)
    _created: list[Path] = field(default_factory=list)

    def release(self) -> None:
        for lock in reversed(self._locks):
            lock.release()
        self._locks.clear()
        for d in reversed(self._created):  # deepest first
            with contextlib.suppress(OSError):
                d.rmdir()  # only when empty: the run wrote nothing there
        self._created.clear()


def _resolved(path: str | os.PathLike) -> Path:
    return Path(os.path.realpath(os.path.expanduser(os.fspath(path))))


def _nearest_existing(path: Path) -> Path:
    p = path
    while not os.path.lexists(p):
        p = p.parent
    return p


def _read_only(path: Path) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def _check_writable_dir(directory: Path, out: Output) -> None:
    """`directory` (an existing ancestor of the output) must be a directory this process can write into."""
    if not directory.is_dir():
        raise InputError(f"{out.flag}={out.path}: {directory} is a file, not a directory; choose another {out.flag}")
    if _read_only(directory):
        raise InputError(f"{out.flag}={out.path}: {directory} is on a read-only file system; choose another {out.flag}")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise InputError(
            f"{out.flag}={out.path}: no permission to write into {directory}; choose another {out.flag} "
            "or change the directory's permissions"
        )


def check_output(out: Output) -> None:
    """Check the kind of `out.path` and that it can be written (see the module docstring)."""
    path = out.path
    if out.kind == "tree":
        if path.exists() and not path.is_dir():
            raise InputError(f"{out.flag}={path} is a file; give a directory")
        _check_writable_dir(_nearest_existing(path.parent), out)
    elif out.kind == "file":
        if path.is_dir():
            raise InputError(f"{out.flag}={path} is a directory; give a file name (e.g. {path / 'output.txt'})")
        if path.exists() and not path.is_file():
            raise InputError(f"{out.flag}={path} is not a regular file; give the name of a file to write")
        _check_writable_dir(_nearest_existing(path.parent), out)
    else:
        if path.exists() and not path.is_dir():
            raise InputError(f"{out.flag}={path} is a file; give a directory (it is created when missing)")
        _check_writable_dir(_nearest_existing(path), out)


def _same_path(a: Path, b: Path) -> bool:
    if a == b:
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _input_paths(inputs: Mapping[str, Any]) -> Iterator[tuple[str, Path]]:
    for flag, value in inputs.items():
        if value is None:
            continue
        values = value if isinstance(value, (list, tuple)) else [value]
        for v in values:
            if v is not None and str(v) != "":
                yield flag, _resolved(v)


def _inside(path: Path, directory: Path) -> bool:
    return directory in path.parents


def check_not_an_input(out: Output, inputs: Mapping[str, Any], inputs_inside: bool = True) -> None:
    """An output that is also an input of the run would be replaced by the run's result: the input itself, a
    file that already exists in an input directory (a model's `vocab.txt`, its weights), or (`inputs_inside`
    False: a directory whose files the run replaces) a directory holding an input."""
    for flag, path in _input_paths(inputs):
        if _same_path(out.path, path):
            raise InputError(
                f"{out.flag}={out.path} is also {flag}: writing it would replace the input; choose another {out.flag}"
            )
        if out.kind == "file" and path.is_dir() and _inside(out.path, path) and os.path.lexists(out.path):
            raise InputError(
                f"{out.flag}={out.path} is a file of {flag}={path}: writing it would replace part of the input; "
                f"choose another {out.flag}"
            )
        if out.kind != "file" and not inputs_inside and _inside(path, out.path):
            raise InputError(
                f"{out.flag}={out.path} holds {flag}={path}: writing into it would replace the input; choose "
                f"another {out.flag}"
            )


# ------------------------------------------------------------------------------------------------ locks
def _holder_info(command: str) -> dict[str, Any]:
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "command": f"bert {command}",
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def _describe(holder: dict[str, Any]) -> str:
    what = holder.get("command", "another run")
    return f"{what}, pid {holder.get('pid', '?')} on {holder.get('host', '?')}, since {holder.get('started', '?')}"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# The errors of a file system without `flock`.
_NO_FLOCK = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)

_T = TypeVar("_T")


def _open_locked(path: Path, acquire: Callable[[int], _T]) -> tuple[int, _T] | None:
    """`path` opened (created if missing) and locked by `acquire(fd)`, with what `acquire` returned; None when
    ten tries each lost the file to its holder's release. The holder before us unlinks the file when it
    releases, and a lock taken on an unlinked file locks nothing: the name must still lead to the file held."""
    for _ in range(10):
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            result = acquire(fd)
            if os.fstat(fd).st_ino == os.stat(path).st_ino:
                return fd, result
        except FileNotFoundError:
            pass
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)
    return None


@contextlib.contextmanager
def waiting_lock(path: Path, waiting: str) -> Iterator[None]:
    """An exclusive lock on `path` for the block, waiting while another process holds it (logged once as
    "waiting for another run WAITING"): processes that share a cache fill an entry one at a time, and the
    later ones find it filled. The kernel releases a dead process's lock; the file is removed on release.
    Where the file system has no `flock`, the block runs unguarded."""

    def acquire(fd: int) -> None:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            logger.info("waiting for another run %s", waiting)
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError as e:
            if e.errno not in _NO_FLOCK:
                raise

    locked = _open_locked(path, acquire)
    if locked is None:
        raise InputError(f"cannot take the lock {path}; try again")
    fd, _ = locked
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)  # while still holding it: see _open_locked
        os.close(fd)


class _Lock:
    """An exclusive lock on `path` for the run (see the module docstring)."""

    def __init__(self, path: Path, out: Output, command: str):
        self.path, self.out = path, out
        self.fd: int | None = None
        locked = _open_locked(path, self._acquire)
        if locked is None:
            raise InputError(f"{out.flag}={out.path}: cannot take the lock {path}; try again")
        fd, previous = locked
        self.fd = fd
        if previous and previous.get("pid") != os.getpid():
            logger.warning(
                "%s: taking over the lock of a run that ended without releasing it (%s); its leftovers are removed",
                out.path,
                _describe(previous),
            )
        data = json.dumps(_holder_info(command)).encode()
        os.ftruncate(fd, 0)
        os.pwrite(fd, data + b"\n", 0)

    def _acquire(self, fd: int) -> dict[str, Any] | None:
        """Lock `fd`; returns what the file said about an earlier holder (None when it was empty)."""
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            flock = True
        except BlockingIOError:
            holder = _read_holder(fd)
            raise InputError(
                f"{self.out.flag}={self.out.path} is in use by another run ({_describe(holder)}); wait for it to "
                f"finish, or choose another {self.out.flag}"
            ) from None
        except OSError as e:
            if e.errno not in _NO_FLOCK:
                raise
            flock = False  # this file system has no flock: the file's content decides
        previous = _read_holder(fd)
        if not flock and previous:
            same_host = previous.get("host") == socket.gethostname()
            pid = previous.get("pid")
            if not same_host or (isinstance(pid, int) and pid != os.getpid() and _pid_alive(pid)):
                raise InputError(
                    f"{self.out.flag}={self.out.path} is in use by another run ({_describe(previous)}); wait for "
                    f"it to finish, or delete {self.path} if that run is gone"
                )
        return previous or None

    def release(self) -> None:
        if self.fd is None:
            return
        with contextlib.suppress(OSError):
            os.unlink(self.path)  # while still holding it: see __init__
        os.close(self.fd)
        self.fd = None


def _read_holder(fd: int) -> dict[str, Any]:
    try:
        raw = os.pread(fd, 4096, 0)
        holder = json.loads(raw.decode("utf-8")) if raw.strip() else {}
    except (OSError, ValueError):
        return {"command": "an unknown run"}
    return holder if isinstance(holder, dict) else {"command": "an unknown run"}


# -------------------------------------------------------------------------------------------- cleaning
def remove_temporaries(directory: Path, bases: Iterable[str] | None = None) -> list[Path]:
    """Remove this package's temporary names in `directory` (all of them when `bases` is None, else those of
    the given final names); returns what was removed."""
    removed: list[Path] = []
    if not directory.is_dir():
        return removed
    wanted = None if bases is None else set(bases)
    for p in directory.iterdir():
        m = TEMP_NAME.match(p.name)
        if m is None or (wanted is not None and m.group("base") not in wanted):
            continue
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                p.unlink()
        removed.append(p)
    return removed


def _clean(out: Output) -> None:
    if out.kind == "dir":
        removed = remove_temporaries(out.path)
        removed += remove_temporaries(out.path.parent, [out.path.name])
    else:
        removed = remove_temporaries(out.path.parent, [out.path.name, *out.derived])
    if removed:
        logger.warning("removed what an interrupted run left: %s", ", ".join(str(p) for p in removed))


@contextlib.contextmanager
def staged_directory(path: str | os.PathLike) -> Iterator[Path]:
    """A temporary directory `.NAME.tmp-XXXXXXXX` beside `path` to write a set of files into; when the block
    succeeds its files are moved into `path` (created when missing) one `os.replace` each, so every file
    appears whole, and files of `path` with other names are kept. On failure nothing of it appears."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    try:
        yield tmp
        path.mkdir(exist_ok=True)
        for p in sorted(tmp.iterdir()):
            os.replace(p, path / p.name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def atomic_directory(path: Path) -> Iterator[Path]:
    """Yield a temporary directory beside `path`, renamed to `path` when the block succeeds."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    try:
        yield tmp
        if path.exists():
            old = path.with_name(f".{path.name}.old-{os.getpid()}")
            os.replace(path, old)
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


# ----------------------------------------------------------------------------------------------- claim
def _make_dirs(path: Path, created: list[Path]) -> None:
    missing = []
    p = path
    while not os.path.lexists(p):
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        d.mkdir()
        created.append(d)


def _outputs(
    files: Mapping[str, str | os.PathLike | Sequence[str | os.PathLike] | None],
    dirs: Mapping[str, str | os.PathLike | None],
    trees: Mapping[str, str | os.PathLike | None],
    derived: Mapping[str, Iterable[str]],
) -> list[Output]:
    """`claim`'s outputs, each path resolved (the unset ones left out)."""
    outs = []
    tables: tuple[tuple[str, Mapping[str, Any]], ...] = (("file", files), ("dir", dirs), ("tree", trees))
    for kind, table in tables:
        for flag, value in table.items():
            values = [value] if value is None or isinstance(value, (str, os.PathLike)) else value
            for v in values:
                if v is None or str(v) == "":
                    continue
                path = _resolved(v)
                suffixes = tuple(derived.get(flag, ()))
                outs.append(Output(flag, path, kind, tuple(path.name + s for s in suffixes)))
    return outs


@contextlib.contextmanager
def claim(
    command: str,
    files: Mapping[str, str | os.PathLike | Sequence[str | os.PathLike] | None] | None = None,
    dirs: Mapping[str, str | os.PathLike | None] | None = None,
    trees: Mapping[str, str | os.PathLike | None] | None = None,
    inputs: Mapping[str, Any] | None = None,
    derived: Mapping[str, Iterable[str]] | None = None,
    lock: bool = True,
    inputs_inside: bool = True,
) -> Iterator[Claim]:
    """Check, lock and clean the outputs of a run of `bert COMMAND` for the duration of the block.

    Args:
        command: the subcommand, named in the lock file.
        files: {flag: path or list of paths} of file outputs (None values, e.g. stdout, are skipped).
        dirs: {flag: path} of directory outputs (created when missing).
        trees: {flag: path} of directories the run replaces as a whole (a native dataset).
        inputs: {flag: path or list of paths} the run reads; no output may be one of them.
        derived: {flag: suffixes} of files written beside a file output (e.g. {"--output_file":
            [".args.json"]}).
        lock: False checks the paths only (the other ranks of a distributed run).
        inputs_inside: False refuses a directory output that holds one of the inputs (`bert convert` replaces
            its files by name); training runs read what their own output directory holds when they resume.

    Raises:
        InputError: a path of the wrong kind, not writable, also an input, or in use by another run.
    """
    outs = _outputs(files or {}, dirs or {}, trees or {}, derived or {})
    for out in outs:
        check_output(out)
        check_not_an_input(out, inputs or {}, inputs_inside)
    result = Claim(command, outs)
    held: list[tuple[str, Path]] = []
    try:
        if lock:
            for out in outs:
                if (out.kind, out.path) in _HELD:
                    continue
                directory = out.path if out.kind == "dir" else out.path.parent
                _make_dirs(directory, result._created)
                name = LOCK_NAME if out.kind == "dir" else f".{out.path.name}.lock"
                result._locks.append(_Lock(directory / name, out, command))
                _HELD.add((out.kind, out.path))
                held.append((out.kind, out.path))
                _clean(out)
        yield result
    except OSError as e:
        if e.filename is None and outs:
            e.filename = str(outs[0].path)  # a write error without a name: it happened under the outputs
        raise
    finally:
        _HELD.difference_update(held)
        result.release()


# ------------------------------------------------------------------------------------------ OS errors
def _flag_of(path: str, args: object) -> str | None:
    """The flag of `args` whose value is `path` or a directory above it."""
    if args is None or not dataclasses.is_dataclass(args):
        return None
    target = _resolved(path)
    best: tuple[int, str] | None = None
    for f in dataclasses.fields(args):
        value = getattr(args, f.name, None)
        if not isinstance(value, (str, os.PathLike)) or not str(value):
            continue
        for part in str(value).split(","):
            if not part.strip():
                continue
            base = _resolved(part.strip())
            if target == base or base in target.parents:
                depth = len(base.parts)
                if best is None or depth > best[0]:
                    best = (depth, f.metadata.get("flag", f"--{f.name}"))
    return best[1] if best else None


def final_path(path: str) -> str:
    """`path` with the temporary names of atomic writes in it replaced by the names they become
    (`.checkpoint-4.tmp-x1y2z3w4/training_state.pt` -> `checkpoint-4/training_state.pt`)."""
    parts = Path(path).parts
    return str(Path(*[(m.group("base") if (m := TEMP_NAME.match(part)) else part) for part in parts]))


def os_error_message(e: OSError, args: object = None) -> str:
    """One line for an `OSError` met while reading or writing: what, where, which flag, and the fix."""
    path = final_path(str(e.filename)) if e.filename is not None else None
    flag = _flag_of(path, args) if path else None
    where = f" {path}" if path else ""
    choose = f"choose another {flag}" if flag else "choose another output location"
    code = e.errno
    if code in (errno.ENOSPC, errno.EDQUOT):
        return f"no space left on device while writing{where}; free space or {choose}"
    if code == errno.EROFS:
        return f"cannot write{where}: read-only file system; {choose}"
    if code in (errno.EACCES, errno.EPERM):
        return f"permission denied:{where}; {choose}, or change its permissions"
    if code == errno.EISDIR:
        return f"{path} is a directory where a file is expected; {choose}"
    if code == errno.ENOTDIR:
        return f"a part of {path} is a file where a directory is expected; {choose}"
    if code == errno.ENOENT:
        return f"no such file or directory:{where}; check {flag or 'the path'}"
    if code == errno.EIO:
        return f"input/output error on{where} (a failing disk or network file system); {choose}"
    reason = e.strerror or str(e)
    return f"{reason}{':' + where if where else ''}" + (f" ({flag})" if flag else "")
