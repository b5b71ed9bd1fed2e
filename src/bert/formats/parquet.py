"""Parquet files of texts and of embeddings (`bert embed --input_file=X.parquet --output_file=Y.parquet`).

Parquet is what Ray Data, Spark, DuckDB and the Hub's datasets write a corpus as. pyarrow is an optional
dependency (the `parquet` extra), imported only when a Parquet file is read or written.

- `ParquetTexts`: a text column (and an id column, kept as it is) read a batch at a time from the row groups
  that hold the rows asked for, never the whole file; a missing column names the file and the columns it has,
  a text that is null or not a string names its row.
- `EmbeddingWriter`: the vectors as an `embedding` column of fixed-size lists (float32, or the integer type
  of a quantized precision), after the id column when there is one (and late chunking's span columns), written
  row group by row group into an open binary file (the caller's atomic write).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import IO, Any

import numpy as np

from bert.errors import InputError

PARQUET_SUFFIX = ".parquet"
EMBEDDING_COLUMN = "embedding"
# --late_chunking's characters of its document that each chunk holds, start and stop (exclusive).
SPAN_COLUMNS = ("start", "stop")


def is_parquet(path: str | os.PathLike | None) -> bool:
    """Whether `path` names a Parquet file (by its suffix, as Spark, Ray and DuckDB name theirs)."""
    return path is not None and os.fspath(path).lower().endswith(PARQUET_SUFFIX)


def pyarrow() -> tuple[Any, Any]:
    """(pyarrow, pyarrow.parquet), or one line saying which extra installs them."""
    try:
        import pyarrow as pa  # optional: only Parquet files need it
        import pyarrow.parquet as pq
    except ImportError:
        raise InputError("Parquet files need pyarrow: pip install 'bert[parquet]'") from None
    return pa, pq


def row_batches(file: Any, rows: range, size: int, columns: list[str]) -> Iterator[tuple[int, Any]]:
    """(first row, record batch) of the 0-based rows `rows` of the open `pyarrow.parquet.ParquetFile` `file`, at
    most `size` rows each, reading only the row groups that hold them."""
    groups, starts, start = [], [], 0
    meta = file.metadata
    for g in range(meta.num_row_groups):
        n = meta.row_group(g).num_rows
        if start < rows.stop and start + n > rows.start:
            groups.append(g)
            starts.append(start)
        start += n
    if not groups or not rows:
        return
    row = starts[0]
    for batch in file.iter_batches(batch_size=size, row_groups=groups, columns=columns):
        lo, hi = max(rows.start - row, 0), min(rows.stop - row, batch.num_rows)
        if lo < hi:
            yield row + lo, batch.slice(lo, hi - lo)
        row += batch.num_rows
        if row >= rows.stop:
            return


class ParquetTexts:
    """The texts (column `text_column`) and ids (`id_column`, optional) of the Parquet file `path`; `flag`
    names the file in errors."""

    def __init__(self, path: str, text_column: str, id_column: str | None, flag: str = "--input_file") -> None:
        self.pa, pq = pyarrow()
        self.path = path
        self.flag = flag
        try:
            self._file = pq.ParquetFile(path)
        except (self.pa.ArrowException, OSError) as e:
            raise InputError(f"{flag}={path}: not a readable Parquet file ({e}); give a .parquet file") from None
        schema = self._file.schema_arrow
        for name, which in ((text_column, "--text_column"), (id_column, "--id_column")):
            if name is not None and name not in schema.names:
                raise InputError(
                    f"{flag}={path} has no column {name!r} ({which}); its columns: {', '.join(schema.names)}"
                )
        text_type = schema.field(text_column).type
        if not (self.pa.types.is_string(text_type) or self.pa.types.is_large_string(text_type)):
            raise InputError(
                f"{flag}={path}: column {text_column!r} (--text_column) holds {text_type}, not strings; "
                "name the column of the texts"
            )
        self.text_column = text_column
        self.id_column = id_column
        self.id_field = schema.field(id_column) if id_column is not None else None
        self.rows: int = self._file.metadata.num_rows

    def chunks(self, rows: range, size: int) -> Iterator[tuple[int, list[str], Any]]:
        """(first row, texts, ids: a pyarrow array or None) of the 0-based rows `rows`, `size` at most at a time.

        Raises:
            InputError: a text is null or not a string (naming its row).
        """
        columns = [self.text_column] + ([self.id_column] if self.id_column is not None else [])
        for first, batch in row_batches(self._file, rows, size, columns):
            texts = batch.column(0).to_pylist()
            for i, text in enumerate(texts):
                if not isinstance(text, str):
                    raise InputError(
                        f"{self.flag}={self.path} row {first + i} (0-based): column {self.text_column!r} is null; "
                        "drop or fill the rows without text"
                    )
            yield first, texts, batch.column(1) if self.id_column is not None else None

    def ids(self, rows: range, size: int) -> Iterator[Any]:
        """The id column of the rows `rows`, in pyarrow arrays of `size` rows at most (as `chunks` cuts them)."""
        assert self.id_column is not None
        for _, batch in row_batches(self._file, rows, size, [self.id_column]):
            yield batch.column(0)


def embedding_array(vectors: np.ndarray) -> Any:
    """The rows of `vectors` [rows, width] as a pyarrow array of fixed-size lists (the `embedding` column)."""
    pa, _ = pyarrow()
    values = pa.array(np.ascontiguousarray(vectors).reshape(-1))
    return pa.FixedSizeListArray.from_arrays(values, vectors.shape[1])


class EmbeddingWriter:
    """Rows of (id, embedding) written as Parquet into the open binary file `out`; `close` writes the footer.
    With `spans`, each row's span (SPAN_COLUMNS, int64) goes after the id."""

    def __init__(
        self, out: IO[bytes], width: int, dtype: np.dtype, id_field: Any | None = None, spans: bool = False
    ) -> None:
        self.pa, pq = pyarrow()
        self.width = width
        value_type = self.pa.from_numpy_dtype(np.dtype(dtype))
        fields = (
            ([id_field] if id_field is not None else [])
            + ([self.pa.field(name, self.pa.int64()) for name in SPAN_COLUMNS] if spans else [])
            + [self.pa.field(EMBEDDING_COLUMN, self.pa.list_(value_type, width))]
        )
        self.schema = self.pa.schema(fields)
        self._writer = pq.ParquetWriter(out, self.schema)

    def write(self, vectors: np.ndarray, ids: Any | None = None, spans: np.ndarray | None = None) -> None:
        """`ids`: a pyarrow array, or a Python list of the id column's type; `spans`: [rows, 2] (start, stop)."""
        if isinstance(ids, list):
            ids = self.pa.array(ids, self.schema.field(0).type)
        columns = [ids] if ids is not None else []
        columns += [self.pa.array(c) for c in spans.T] if spans is not None else []
        columns.append(embedding_array(vectors))
        self._writer.write_table(self.pa.Table.from_arrays(columns, schema=self.schema))

    def close(self) -> None:
        self._writer.close()
