"""Embedding matrices on disk: the `.npy` file `bert embed --output_file=x.npy` writes, its Parquet file
(`--output_file=x.parquet`: an `embedding` column after the ids), or the shards `x-0000i-of-0000N.npy` (.parquet)
of `bert embed --num_shards=N`, opened for reading (`open_embeddings`).

The one reader of them (`bert search --corpus_embeddings`, `bert index`, and any later command that takes stored
vectors):
everything about the file is checked before a vector is used, each fault one `InputError` naming the file.

- a regular file only, judged by `os.stat` before it is opened (a FIFO would block `open` for ever, a
  directory or a device is no matrix);
- a NumPy `.npy` file by its magic bytes, whatever its name: an `.npz` or Parquet file, text or random bytes
  are named as what they are;
- its header read with NumPy's own parser, never `allow_pickle`: an object array (pickled Python objects,
  whose payload would run on load) is refused from its header, unread;
- a float32 matrix [rows, dims >= 1], as `bert embed` writes it (or, where the reader takes them, the int8 or uint8
  matrix of its --precision=binary or ubinary: `dtypes`), and exactly the bytes its header promises (a
  file cut short is refused before it is mapped, not found out by `mmap`);
- the rows memory-mapped, so a search holds one chunk at a time, and each chunk checked as it is read
  (`rows`): a NaN or infinite component blames the file and the row, not the model.
- a Parquet file (by its suffix): an `embedding` column of fixed-size float32 lists, read a row group at a
  time; its other column, when there is one, is the ids (`ids`), as `bert embed --id_column` wrote them;
- shards: asked for `x.npy` that is not there, the reader takes `x-*-of-N.npy` when all N of one set are
  there (one missing, or two sets, is an error naming them), read in order as one matrix of equal widths.
"""

from __future__ import annotations

import os
import re
import stat
import tokenize
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from numpy.lib import format as npy

from bert.errors import InputError
from bert.formats.parquet import EMBEDDING_COLUMN, SPAN_COLUMNS, is_parquet, pyarrow, row_batches
from bert.utils import shard_file

# What a file that is not a .npy is, by its first bytes.
_OTHER_FORMATS = {b"PK\x03\x04": "a zip archive (an .npz?)", b"PAR1": "a Parquet file", b"\x1f\x8b": "a gzip file"}
_FIX = "give the .npy (or .parquet) file `bert embed --output_file=x.npy` wrote"
# What NumPy's header parser raises for a damaged header: its own checks (ValueError), and the Python literal
# parsers it hands the header to (a header of another Python version is tokenized first).
_HEADER_ERRORS = (ValueError, TypeError, SyntaxError, tokenize.TokenError, OSError, EOFError)


def _regular_file_size(path: Path, name: str) -> int:
    """The size of `path`, a regular file (judged before it is opened: a FIFO would block `open` for ever)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise InputError(f"{name}: no such file; {_FIX}") from None
    except OSError as e:
        raise InputError(f"{name}: cannot read ({e.strerror or e}); check the path and permissions") from None
    if not stat.S_ISREG(st.st_mode):
        kind = "a directory" if stat.S_ISDIR(st.st_mode) else "a FIFO" if stat.S_ISFIFO(st.st_mode) else "not a file"
        raise InputError(f"{name} is {kind}, not a regular file; {_FIX}")
    return st.st_size


FLOAT32 = (np.dtype(np.float32),)
# What `bert embed --precision=binary` and `ubinary` write: a sign bit a component, 8 a byte.
FLOAT32_OR_BITS = (np.dtype(np.float32), np.dtype(np.int8), np.dtype(np.uint8))


def _kinds(dtypes: tuple[np.dtype, ...]) -> str:
    return " or ".join(str(d) for d in dtypes)


class EmbeddingsFile:
    """A float32 matrix [rows, dims] in a `.npy` file (or another of `dtypes`), checked (module docstring) and
    memory-mapped.

    `name` is what errors call the file (the flag and path, e.g. "--corpus_embeddings=x.npy")."""

    def __init__(self, path: str | os.PathLike, name: str, dtypes: tuple[np.dtype, ...] = FLOAT32):
        self.path, self.name = Path(path), name
        size = _regular_file_size(self.path, name)
        with open(self.path, "rb") as f:
            shape, fortran_order, dtype = self._header(f)
            offset = f.tell()
        if len(shape) != 2 or dtype not in dtypes:
            raise InputError(f"{name} holds a {dtype} array of shape {shape}, not a {_kinds(dtypes)} matrix; {_FIX}")
        self.dtype = np.dtype(dtype)
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
            else np.zeros(self.shape, dtype=dtype)  # mmap cannot map zero bytes
        )

    def __len__(self) -> int:
        return self.shape[0]

    @property
    def dims(self) -> int:
        return self.shape[1]

    def rows(self, start: int, stop: int) -> np.ndarray:
        """Rows `start` to `stop` (0-based, as `bert search` numbers records), read into memory and checked finite."""
        # C order whatever the file's: a Fortran-ordered file then scores bit for bit as its C-ordered copy.
        return _finite(np.ascontiguousarray(self._array[start:stop], dtype=self.dtype), start, self.name)

    def ids(self, start: int, stop: int) -> list | None:
        """A .npy matrix holds no ids: None."""
        return None

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


def _finite(chunk: np.ndarray, start: int, name: str) -> np.ndarray:
    """`chunk` (rows from `start` of the file `name`), refused when a component is NaN or infinite."""
    if chunk.dtype.kind != "f":  # bits: always finite
        return chunk
    bad = ~np.isfinite(chunk).all(axis=1)
    if bad.any():
        row = start + int(np.argmax(bad))
        raise InputError(
            f"{name}: row {row} (counting from 0) holds NaN or infinity; embed the corpus again, or fix that row"
        )
    return chunk


class ParquetEmbeddings:
    """The `embedding` column of a Parquet file `bert embed` wrote (`EmbeddingsFile`'s interface), with the ids of
    its other column when there is one."""

    def __init__(self, path: str | os.PathLike, name: str, dtypes: tuple[np.dtype, ...] = FLOAT32):
        self.path, self.name = Path(path), name
        self.pa, pq = pyarrow()
        _regular_file_size(self.path, name)  # a FIFO is refused before pyarrow opens it
        try:
            self._file = pq.ParquetFile(self.path)
        except (self.pa.ArrowException, OSError) as e:
            raise InputError(f"{name}: not a readable Parquet file ({e}); {_FIX}") from None
        schema = self._file.schema_arrow
        if EMBEDDING_COLUMN not in schema.names:
            raise InputError(
                f"{name} has no column {EMBEDDING_COLUMN!r} (its columns: {', '.join(schema.names)}); {_FIX}"
            )
        kind = schema.field(EMBEDDING_COLUMN).type
        numeric = {self.pa.from_numpy_dtype(d): d for d in dtypes}
        if not self.pa.types.is_fixed_size_list(kind) or kind.value_type not in numeric:
            raise InputError(
                f"{name}: column {EMBEDDING_COLUMN!r} holds {kind}, not fixed-size {_kinds(dtypes)} lists; {_FIX}"
            )
        self.dtype = numeric[kind.value_type]
        others = [n for n in schema.names if n not in (EMBEDDING_COLUMN, *SPAN_COLUMNS)]
        if len(others) > 1:
            raise InputError(
                f"{name} has columns {others} beside {EMBEDDING_COLUMN!r} (and {' and '.join(SPAN_COLUMNS)}): at most "
                f"one, the ids; {_FIX}"
            )
        self.id_column = others[0] if others else None
        self.shape: tuple[int, int] = (int(self._file.metadata.num_rows), int(kind.list_size))

    def __len__(self) -> int:
        return self.shape[0]

    @property
    def dims(self) -> int:
        return self.shape[1]

    def rows(self, start: int, stop: int) -> np.ndarray:
        pieces = [np.zeros((0, self.dims), dtype=self.dtype)]
        for first, batch in row_batches(self._file, range(start, stop), stop - start, [EMBEDDING_COLUMN]):
            column = batch.column(0)
            if column.null_count:
                row = first + next(i for i, v in enumerate(column.is_null().to_pylist()) if v)
                raise InputError(f"{self.name}: row {row} (counting from 0) has no embedding; embed the corpus again")
            pieces.append(column.flatten().to_numpy(zero_copy_only=False).reshape(-1, self.dims))
        return _finite(np.concatenate(pieces).astype(self.dtype, copy=False), start, self.name)

    def ids(self, start: int, stop: int) -> list | None:
        """The ids of rows `start` to `stop` (Python values, as the id column holds them), or None."""
        if self.id_column is None:
            return None
        out: list = []
        for _, batch in row_batches(self._file, range(start, stop), stop - start, [self.id_column]):
            out += batch.column(0).to_pylist()
        return out


class ShardedEmbeddings:
    """The shards of one `bert embed --num_shards=N` run, read in order as one matrix (`EmbeddingsFile`'s
    interface: `len`, `dims`, `rows` with rows numbered across the shards)."""

    def __init__(self, parts: list[EmbeddingsFile | ParquetEmbeddings], name: str):
        self.parts, self.name = parts, name
        kinds = sorted({str(part.dtype) for part in parts})
        if len(kinds) > 1:
            raise InputError(
                f"{name}: its shards hold vectors of different number formats ({', '.join(kinds)}); embed them "
                "again with one --precision"
            )
        widths = {part.dims for part in parts}
        if len(widths) > 1:
            raise InputError(f"{name}: its shards hold vectors of different widths {sorted(widths)}; {_FIX}")
        self.dtype = parts[0].dtype
        self.starts = np.cumsum([0] + [len(part) for part in parts])

    def __len__(self) -> int:
        return int(self.starts[-1])

    @property
    def dims(self) -> int:
        return self.parts[0].dims

    def _spans(self, start: int, stop: int) -> Iterator[tuple[EmbeddingsFile | ParquetEmbeddings, int, int]]:
        for part, first in zip(self.parts, self.starts[:-1]):
            lo, hi = max(start - first, 0), min(stop - first, len(part))
            if lo < hi:
                yield part, int(lo), int(hi)

    def rows(self, start: int, stop: int) -> np.ndarray:
        # a bad row is named by its shard and its number there
        pieces = [part.rows(lo, hi) for part, lo, hi in self._spans(start, stop)]
        return np.concatenate(pieces) if pieces else np.zeros((0, self.dims), dtype=self.dtype)

    def ids(self, start: int, stop: int) -> list | None:
        pieces = [part.ids(lo, hi) for part, lo, hi in self._spans(start, stop)]
        if any(p is None for p in pieces) or not pieces:
            return None
        return [key for piece in pieces for key in piece or ()]


def _open_one(path: str, name: str, dtypes: tuple[np.dtype, ...]) -> EmbeddingsFile | ParquetEmbeddings:
    return ParquetEmbeddings(path, name, dtypes) if is_parquet(path) else EmbeddingsFile(path, name, dtypes)


def open_embeddings(
    path: str, name: str, dtypes: tuple[np.dtype, ...] = FLOAT32
) -> EmbeddingsFile | ParquetEmbeddings | ShardedEmbeddings:
    """The embeddings `path` names: the file, or else the complete set of its shards (module docstring); their
    number format one of `dtypes` (float32 unless the reader takes binary vectors too)."""
    stored = _open_one(path, name, dtypes) if os.path.lexists(path) else _open_shards(path, name, dtypes)
    if stored.dims < 1:  # rows of no component: an index of them is built, and no query can ever search it
        raise InputError(f"{name} holds vectors of 0 components; {_FIX}")
    return stored


def _open_shards(path: str, name: str, dtypes: tuple[np.dtype, ...]) -> ShardedEmbeddings:
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
    return ShardedEmbeddings([_open_one(shard, f"{name} (shard {shard})", dtypes) for shard in shards], name)
