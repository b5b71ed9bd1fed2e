"""Small helpers shared by the commands: atomic file writes, seeding, logging set-up."""

from __future__ import annotations

import contextlib
import logging
import os
import random
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO


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


def set_seed(seed: int) -> None:
    """Seed Python, NumPy and torch (all devices) from one integer."""
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def setup_logging(output_dir: str | os.PathLike | None = None, log_name: str = "log.txt") -> None:
    """Log INFO to stderr and, when an output directory is given, to a file inside it."""
    handlers: list[logging.Handler] = [logging.StreamHandler()]
    if output_dir is not None:
        Path(output_dir).mkdir(parents=True, exist_ok=True)
        handlers.append(logging.FileHandler(Path(output_dir) / log_name, encoding="utf-8"))
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        handlers=handlers,
        force=True,
    )


def write_run_info(output_dir: str | os.PathLike, command: str, args: object) -> Path:
    """Record what a command did in `output_dir/args.json`: its resolved arguments and command line."""
    import dataclasses
    import json
    import sys
    import time

    from bert import __version__

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
    import gzip
    import json

    from bert.errors import InputError

    p = Path(path)
    if not p.is_file():
        raise InputError(f"{what} {path}: no such file; check the path")
    opener = gzip.open if p.suffix == ".gz" else open
    try:
        with opener(p, "rt", encoding="utf-8") as f:
            return json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError, OSError, EOFError) as e:
        raise InputError(f"{what} {path} is not valid JSON ({e}); give a UTF-8 .json or .json.gz file") from None
