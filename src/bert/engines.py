"""`bert embed` inside a data engine's workers: `EmbedBatches`, a callable class that Ray Data's
`map_batches` and Spark's `mapInPandas` (or a pandas UDF) use as it is.

The engine owns the cluster, the reading, the scheduling and the writing; this class only turns a batch of
rows into the same batch with an `embedding` column, the vectors `bert embed` writes for the same texts.
The model is loaded once per worker process, on the first batch (so the object pickled to the workers
holds only its settings), and kept for every later batch and every copy of the object in that process
(Spark unpickles the function afresh for each task).

Ray Data:

    ds = ray.data.read_parquet("corpus/")
    ds = ds.map_batches(EmbedBatches, fn_constructor_kwargs={"model": "minilm"}, concurrency=8,
                        batch_size=1024, batch_format="pyarrow", num_gpus=1)
    ds.write_parquet("vectors/")

Spark:

    fn = EmbedBatches("minilm")
    df.mapInPandas(lambda frames: map(fn, frames), schema=df.schema.add("embedding", "array<float>"))

No engine is imported here: a batch is whatever the engine hands over (a pyarrow Table or RecordBatch, a
pandas DataFrame, or Ray's dict of NumPy arrays) and goes back in the same form.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from bert.errors import InputError
from bert.formats.parquet import EMBEDDING_COLUMN, embedding_array
from bert.inference import Predictor
from bert.input_lines import InputItemError

# The models this process has loaded, by (model, settings): one per worker process, whatever the number of
# copies of an EmbedBatches the engine unpickles there.
_LOADED: dict[str, Predictor] = {}


class EmbedBatches:
    """Rows in, the same rows with an `embedding` column out (`Predictor.embed` of `text_column`).

    The keywords are `bert embed`'s flags of the same names (`pooling`, `normalize`, `dimensions`,
    `prompt_name`, `prompt`, `long_document`, `doc_stride`) and `Predictor.from_pretrained`'s (`device`,
    `max_seq_length`, `batch_size`, `dtype`, `do_lower_case`, `quantize`, `backend`)."""

    def __init__(
        self,
        model: str,
        text_column: str = "text",
        output_column: str = EMBEDDING_COLUMN,
        *,
        pooling: str | None = None,
        normalize: bool | None = None,
        dimensions: int | None = None,
        prompt_name: str | None = None,
        prompt: str | None = None,
        long_document: str = "truncate",
        doc_stride: int | None = None,
        **predictor_settings: Any,
    ) -> None:
        self.model = model
        self.text_column = text_column
        self.output_column = output_column
        self.embed_options: dict[str, Any] = dict(
            pooling=pooling,
            normalize=normalize,
            dimensions=dimensions,
            prompt_name=prompt_name,
            prompt=prompt,
            long_document=long_document,
            doc_stride=doc_stride,
        )
        self.predictor_settings = predictor_settings
        self._predictor: Predictor | None = None

    def __getstate__(self) -> dict[str, Any]:
        # A copy sent to another worker loads the model there, not the weights through the pickle.
        return {**self.__dict__, "_predictor": None}

    @property
    def predictor(self) -> Predictor:
        if self._predictor is None:
            key = repr((self.model, sorted(self.predictor_settings.items())))
            if key not in _LOADED:
                _LOADED[key] = Predictor.from_pretrained(self.model, **self.predictor_settings)
            self._predictor = _LOADED[key]
        return self._predictor

    def embed(self, texts: list[Any]) -> np.ndarray:
        """The vectors of `texts` [rows, dims]; a text that is not a string (a null) names its row."""
        for i, text in enumerate(texts):
            if not isinstance(text, str):
                raise InputError(f"row {i} of the batch: column {self.text_column!r} holds {text!r}, not a text")
        try:
            return self.predictor.embed(texts, **self.embed_options)
        except InputItemError as e:
            raise InputError(f"row {e.index} of the batch: {e.reason}") from None

    def __call__(self, batch: Any) -> Any:
        if isinstance(batch, dict):  # Ray's batch_format="numpy"
            vectors = self.embed(list(np.asarray(batch[self.text_column]).tolist()))
            return {**batch, self.output_column: vectors}
        if hasattr(batch, "append_column"):  # a pyarrow Table or RecordBatch
            vectors = self.embed(batch.column(self.text_column).to_pylist())
            return batch.append_column(self.output_column, embedding_array(vectors))
        if hasattr(batch, "assign"):  # a pandas DataFrame
            vectors = self.embed(batch[self.text_column].tolist())
            return batch.assign(**{self.output_column: list(vectors)})
        raise TypeError(
            f"a batch of rows is a pyarrow Table, a pandas DataFrame or a dict of arrays, not {type(batch)}"
        )
