"""Embedding matrices on disk: the `.npy` file `bert embed --output_file=x.npy` writes, opened for reading.

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
"""

from __future__ import annotations

import os
import stat
import tokenize
from pathlib import Path

import numpy as np
from numpy.lib import format as npy

from bert.errors import InputError

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
