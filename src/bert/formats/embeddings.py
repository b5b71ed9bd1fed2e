"""Embedding matrices on disk: the `.npy` file `bert embed --output_file=x.npy` writes, or the shards
`x-0000i-of-0000N.npy` of `bert embed --num_shards=N`, opened for reading (`open_embeddings`).

The one reader of them (`bert search --corpus_embeddings`, and any later command that takes stored vectors):
everything about the file is checked before a vector is used, each fault one `InputError` naming the file.

- a regular file only, judged by `os.stat` before it is opened (a FIFO would block `open` for ever, a
  directory or a device is no matrix);
- a NumPy `.npy` file by its magic bytes, whatever its name: an `.npz` or Parquet file, text or random bytes
  are named as what they are;
- its header read with NumPy's own parser, never `allow_pickle`: an object array (pickled Python objects,
  whose payload would run on load) is refused from its header, unread;
- a float32 matrix [rows, dims], as `bert embed` writes it, and exactly the bytes its header promises (a
  file cut short is refused before it is mapped, not found out by `mmap`);
- the rows memory-mapped, so a search holds one chunk at a time, and each chunk checked as it is read
  (`rows`): a NaN or infinite component blames the file and the row, not the model.
- shards: asked for `x.npy` that is not there, the reader takes `x-*-of-N.npy` when all N of one set are
  there (one missing, or two sets, is an error naming them), read in order as one matrix of equal widths.
"""

from __future__ import annotations

import os
import re
import stat
import tokenize
from pathlib import Path

import numpy as np
from numpy.lib import format as npy

from bert.errors import InputError
from bert.utils import shard_file

# What a file that is not a .npy is, by its first bytes.
_OTHER_FORMATS = {b"PK\x03\x04": "a zip archive (an .npz?)", b"PAR1": "a Parquet file", b"\x1f\x8b": "a gzip file"}
_FIX = "give the .npy file `bert embed --output_file=x.npy` wrote"
# What NumPy's header parser raises for a damaged header: its own checks (ValueError), and the Python literal
# parsers it hands the header to (a header of another Python version is tokenized first).
_HEADER_ERRORS = (ValueError, TypeError, SyntaxError, tokenize.TokenError, OSError, EOFError)


class EmbeddingsFile:
    """A float32 matrix [rows, dims] in a `.npy` file, checked (module docstring) and memory-mapped.

    `name` is what errors call the file (the flag and path, e.g. "--corpus_embeddings=x.npy")."""

    def __init__(self, path: str | os.PathLike, name: str):
        self.path, self.name = Path(path), name
        size = self._regular_file_size()
        with open(self.path, "rb") as f:
            shape, fortran_order, dtype = self._header(f)
            offset = f.tell()
        if len(shape) != 2 or dtype != np.float32:
            raise InputError(f"{name} holds a {dtype} array of shape {shape}, not a float32 matrix; {_FIX}")
        expected = offset + shape[0] * shape[1] * dtype.itemsize
        if size != expected:
            what = "is cut short" if size < expected else "has bytes after its matrix"
            raise InputError(f"{name} {what}: {size} bytes where its header promises {expected}; {_FIX}")
        self.shape: tuple[int, int] = (int(shape[0]), int(shape[1]))
        self._array = (
            np.memmap(
                self.path, dtype=dtype, mode="r", offset=offset, shape=self.shape, order="F" if fortran_order else "C"
            )
            if shape[0] * shape[1]
            else np.zeros(self.shape, dtype=np.float32)  # mmap cannot map zero bytes
        )

    def __len__(self) -> int:
        return self.shape[0]

    @property
    def dims(self) -> int:
        return self.shape[1]

    def rows(self, start: int, stop: int) -> np.ndarray:
        """Rows `start` to `stop` (0-based, as `bert search` numbers records), read into memory and checked finite."""
        chunk = np.array(self._array[start:stop], dtype=np.float32)
        bad = ~np.isfinite(chunk).all(axis=1)
        if bad.any():
            row = start + int(np.argmax(bad))
            raise InputError(
                f"{self.name}: row {row} (counting from 0) holds NaN or infinity; embed the corpus again, or fix "
                "that row"
            )
        return chunk

    def _regular_file_size(self) -> int:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            raise InputError(f"{self.name}: no such file; {_FIX}") from None
        except OSError as e:
            raise InputError(f"{self.name}: cannot read ({e.strerror or e}); check the path and permissions") from None
        if not stat.S_ISREG(st.st_mode):
            kind = (
                "a directory" if stat.S_ISDIR(st.st_mode) else "a FIFO" if stat.S_ISFIFO(st.st_mode) else "not a file"
            )
            raise InputError(f"{self.name} is {kind}, not a regular file; {_FIX}")
        return st.st_size

    def _header(self, f) -> tuple[tuple[int, ...], bool, np.dtype]:
        head = f.read(len(npy.MAGIC_PREFIX))
        if head != npy.MAGIC_PREFIX:
            other = next((what for magic, what in _OTHER_FORMATS.items() if head.startswith(magic)), None)
            raise InputError(f"{self.name} is {other or 'not a NumPy .npy file'}; {_FIX}")
        f.seek(0)
        try:
            version = npy.read_magic(f)
            read = npy.read_array_header_1_0 if version == (1, 0) else npy.read_array_header_2_0
            shape, fortran_order, dtype = read(f)
        except _HEADER_ERRORS as e:
            raise InputError(f"{self.name}: a damaged .npy header ({str(e).splitlines()[0][:120]}); {_FIX}") from None
        if dtype.hasobject:
            raise InputError(f"{self.name} holds Python objects (pickled), which are never loaded; {_FIX}")
        return shape, fortran_order, dtype


class ShardedEmbeddings:
    """The shards of one `bert embed --num_shards=N` run, read in order as one matrix (`EmbeddingsFile`'s
    interface: `len`, `dims`, `rows` with rows numbered across the shards)."""

    def __init__(self, parts: list[EmbeddingsFile], name: str):
        self.parts, self.name = parts, name
        widths = {part.dims for part in parts}
        if len(widths) > 1:
            raise InputError(f"{name}: its shards hold vectors of different widths {sorted(widths)}; {_FIX}")
        self.starts = np.cumsum([0] + [len(part) for part in parts])

    def __len__(self) -> int:
        return int(self.starts[-1])

    @property
    def dims(self) -> int:
        return self.parts[0].dims

    def rows(self, start: int, stop: int) -> np.ndarray:
        pieces = []
        for part, first in zip(self.parts, self.starts[:-1]):
            lo, hi = max(start - first, 0), min(stop - first, len(part))
            if lo < hi:  # a bad row is named by its shard and its number there
                pieces.append(part.rows(int(lo), int(hi)))
        return np.concatenate(pieces) if pieces else np.zeros((0, self.dims), dtype=np.float32)


def open_embeddings(path: str, name: str) -> EmbeddingsFile | ShardedEmbeddings:
    """The embeddings `path` names: the file, or else the complete set of its shards (module docstring)."""
    if os.path.lexists(path):
        return EmbeddingsFile(path, name)
    pattern = Path(shard_file(path, 0, 1))
    # shard_file's name with the index and the count as wildcards
    stem, suffix = pattern.name.rsplit("-00000-of-00001", 1)
    found: dict[int, set[int]] = {}
    if pattern.parent.is_dir():
        shard_re = re.compile(re.escape(stem) + r"-(\d{5})-of-(\d{5})" + re.escape(suffix) + "$")
        for entry in os.listdir(pattern.parent):
            m = shard_re.match(entry)
            if m:
                found.setdefault(int(m.group(2)), set()).add(int(m.group(1)))
    if not found:
        raise InputError(f"{name}: no such file, nor shards {pattern.parent / (stem + '-*-of-*' + suffix)}; {_FIX}")
    if len(found) > 1:
        raise InputError(f"{name}: shards of {len(found)} different runs ({sorted(found)} shards); keep one set")
    [(count, indices)] = found.items()
    missing = sorted(set(range(count)) - indices)
    if missing:
        raise InputError(f"{name}: shard {shard_file(path, missing[0], count)} of {count} is missing; embed it")
    shards = [shard_file(path, i, count) for i in range(count)]
    return ShardedEmbeddings([EmbeddingsFile(shard, f"{name} (shard {shard})") for shard in shards], name)
