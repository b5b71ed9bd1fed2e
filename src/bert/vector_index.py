"""FAISS indexes of stored embeddings: built by `bert index`, searched by `bert search --index`.

An index directory holds three files, written together (`bert index` renames the directory into place whole):
- `index.faiss`: the FAISS index (`faiss.write_index`), its vector i the corpus row i;
- `ids.jsonl`: one JSON value per line, the id of row i on line i (read a line at a time for the rows found,
  never held whole);
- `manifest.json`: what the index holds and how it was made (`IndexSpec.params`, the metric, dims, rows, the
  embeddings files and the model digest and flags they were made with), read back by `open_index`.

The metric is the cosine, as `bert search`'s exact path scores (`retrieval.TopK`): every vector, of the corpus
and of the queries, is scaled to unit length (`unit_rows`) and the index scores inner products. So a `flat`
index finds what the exact search finds; the others trade recall for speed and memory.

Binary vectors (`bert embed --precision=binary` or `ubinary`: one sign bit a component) go into a FAISS binary
index (flat or hnsw) of their bits, searched by Hamming distance with the query's sign bits; the
`rescore_multiplier` x k nearest are then rescored with the float query against each document's bits read as
+1/-1 (`rescore`), the rescoring of sentence-transformers' binary quantization: 32 times smaller vectors, the
query's magnitudes kept. The score is the cosine of the query with that +1/-1 vector.

faiss is an optional dependency (the `index` extra), imported only here and only when an index is built or
read (`faiss_module`).
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from bert.errors import InputError
from bert.utils import load_json_file, progress

logger = logging.getLogger(__name__)

INDEX_TYPES = ("flat", "ivf_flat", "ivf_pq", "hnsw")
# The vectors' number formats an index takes (`bert embed --precision`) with the dtype bert embed stores each in
# (binary's sign bits shifted by -128 into int8), and the types a binary index can be.
PRECISION_DTYPES = {"float32": "float32", "binary": "int8", "ubinary": "uint8"}
INDEX_PRECISIONS = tuple(PRECISION_DTYPES)
BINARY_INDEX_TYPES = ("flat", "hnsw")
# Candidates a binary index hands to the float rescoring, per result, unless told (sentence-transformers' default).
DEFAULT_RESCORE_MULTIPLIER = 4
INDEX_FILE = "index.faiss"
IDS_FILE = "ids.jsonl"
MANIFEST_FILE = "manifest.json"
METRIC = "cosine: the inner product of vectors scaled to unit length"
HAMMING_METRIC = (
    "Hamming distance of the sign bits, the candidates rescored by the cosine of the float query with +1/-1 bits"
)
# What an index needs at least per cluster to train on (FAISS warns below 39 points a centroid).
POINTS_PER_CENTROID = 39
# What bert search --index visits unless told (--nprobe, --ef_search): a recall near the exact search's on
# corpora of a few thousand to a few million vectors (efSearch 128 on the graph below: recall@10 0.988 on a
# million vectors, 0.974 at 64).
DEFAULT_NPROBE = 16
DEFAULT_EF_SEARCH = 128
# The hnsw graph: links a node, and the candidates considered when linking one. On a million 384-dimension
# vectors of all-MiniLM-L6-v2 (bench/bench_index_1m.py) efConstruction 128 against FAISS's 40 built 1.8x longer
# and moved recall@10 at efSearch 128 from 0.973 to 0.988 at the same queries/s.
DEFAULT_HNSW_M = 32
DEFAULT_EF_CONSTRUCTION = 128


def faiss_module() -> Any:
    """The `faiss` module, or one line saying which extra installs it."""
    try:
        import faiss  # optional: only indexes need it
    except ImportError:
        raise InputError("FAISS indexes need faiss: pip install 'bert[index]' (faiss-cpu)") from None
    return faiss


class StoredVectors(Protocol):
    """What `bert.formats.embeddings.open_embeddings` returns: rows read in ranges."""

    def __len__(self) -> int: ...

    @property
    def dims(self) -> int: ...

    def rows(self, start: int, stop: int) -> np.ndarray: ...


def unit_rows(vectors: np.ndarray) -> np.ndarray:
    """`vectors` [N, D] scaled to unit length, as `torch.nn.functional.normalize` scales them (a zero row stays
    zero), float32 and C-contiguous, as FAISS takes them."""
    x = np.asarray(vectors, dtype=np.float32)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return np.ascontiguousarray(x / np.maximum(norms, 1e-12), dtype=np.float32)


def is_binary(precision: str) -> bool:
    return precision in ("binary", "ubinary")


def binary_codes(rows: np.ndarray, precision: str) -> np.ndarray:
    """Stored binary vectors as FAISS takes them: uint8 bytes of sign bits (ubinary's; binary's are those - 128)."""
    x = np.asarray(rows)
    codes = (x.astype(np.int16) + 128).astype(np.uint8) if precision == "binary" else x.astype(np.uint8, copy=False)
    return np.ascontiguousarray(codes)


def padded_queries(queries: np.ndarray, bits: int) -> np.ndarray:
    """Unit-length float queries [Q, D] padded with zeros to the index's `bits` (D rounded up to bytes, as
    `bert embed` packs them): a pad bit of a document then adds nothing to its score."""
    unit = unit_rows(queries)
    return np.pad(unit, ((0, 0), (0, bits - unit.shape[1])))


def rescore(query: np.ndarray, codes: np.ndarray, dims: int) -> np.ndarray:
    """The cosine of the float `query` [bits] (`padded_queries`, `dims` real components) with each document of
    `codes` [C, bits / 8] read as +1/-1 per bit."""
    signs = np.unpackbits(codes, axis=1).astype(np.float32) * 2 - 1
    return (signs @ query) / np.float32(math.sqrt(dims))


@dataclass(frozen=True)
class IndexSpec:
    """An index type and its parameters: `nlist` inverted lists (ivf_*), `m` sub-quantizers of `nbits` bits
    (ivf_pq), `hnsw_m` links a node and `ef_construction` (hnsw). `nlist` None: 4 x sqrt(rows), the usual rule,
    at most the training sample / 39; `m` None: dims / 8 (a vector in dims bytes / 8 x nbits / 8). `precision`:
    the stored vectors' (binary and ubinary make a binary index of `dims` bits: flat or hnsw)."""

    index_type: str
    nlist: int | None = None
    m: int | None = None
    nbits: int = 8
    hnsw_m: int = DEFAULT_HNSW_M
    ef_construction: int = DEFAULT_EF_CONSTRUCTION
    precision: str = "float32"

    def resolved(self, dims: int, rows: int, train_rows: int) -> IndexSpec:
        """This spec with its defaults filled in for `rows` vectors of `dims` (`train_rows` to train on), checked."""
        if self.index_type not in INDEX_TYPES:
            raise InputError(f"--index_type={self.index_type} must be one of {', '.join(INDEX_TYPES)}")
        if self.precision not in INDEX_PRECISIONS:
            raise InputError(
                f"--precision={self.precision} vectors are not indexed (their ranges are per corpus); index "
                "float32 vectors, or binary or ubinary ones"
            )
        if is_binary(self.precision) and self.index_type not in BINARY_INDEX_TYPES:
            raise InputError(
                f"--index_type={self.index_type} is for float vectors; --precision={self.precision} vectors are "
                f"indexed {' or '.join(BINARY_INDEX_TYPES)}"
            )
        nlist, m = self.nlist, self.m
        if self.index_type.startswith("ivf"):
            if nlist is None:
                nlist = max(1, min(round(4 * math.sqrt(rows)), train_rows // POINTS_PER_CENTROID))
            if nlist > train_rows:
                raise InputError(
                    f"--nlist={nlist} clusters need at least as many vectors to train on, there are {train_rows}; "
                    "lower --nlist or raise --train_sample"
                )
        if self.index_type == "ivf_pq":
            if m is None:
                m = max(1, dims // 8)
                while dims % m:
                    m -= 1
            if dims % m:
                raise InputError(f"--m={m} must divide the vectors' {dims} dimensions; give a divisor of {dims}")
            if 2**self.nbits > train_rows:
                raise InputError(
                    f"--nbits={self.nbits} needs {2**self.nbits} vectors to train each sub-quantizer, there are "
                    f"{train_rows}; lower --nbits or raise --train_sample"
                )
        return IndexSpec(self.index_type, nlist, m, self.nbits, self.hnsw_m, self.ef_construction, self.precision)

    def params(self) -> dict[str, Any]:
        """The parameters that shape this index type (for the manifest)."""
        params: dict[str, dict[str, Any]] = {
            "flat": {},
            "ivf_flat": {"nlist": self.nlist},
            "ivf_pq": {"nlist": self.nlist, "m": self.m, "nbits": self.nbits},
            "hnsw": {"hnsw_m": self.hnsw_m, "ef_construction": self.ef_construction},
        }
        return params[self.index_type]

    def new(self, dims: int, seed: int) -> Any:
        """An empty FAISS index of this spec (resolved) for `dims`-dimensional vectors, scoring inner products
        (binary ones: `dims` bits, by Hamming distance)."""
        faiss = faiss_module()
        if is_binary(self.precision):
            if self.index_type == "flat":
                return faiss.IndexBinaryFlat(dims)
            binary = faiss.IndexBinaryHNSW(dims, self.hnsw_m)
            binary.hnsw.efConstruction = self.ef_construction
            return binary
        ip = faiss.METRIC_INNER_PRODUCT
        if self.index_type == "flat":
            return faiss.IndexFlatIP(dims)
        if self.index_type == "hnsw":
            index = faiss.IndexHNSWFlat(dims, self.hnsw_m, ip)
            index.hnsw.efConstruction = self.ef_construction
            return index
        quantizer = faiss.IndexFlatIP(dims)
        if self.index_type == "ivf_flat":
            index = faiss.IndexIVFFlat(quantizer, dims, self.nlist, ip)
        else:
            index = faiss.IndexIVFPQ(quantizer, dims, self.nlist, self.m, self.nbits, ip)
            index.pq.cp.seed = seed
            # FAISS prints a warning per sub-quantizer for a small sample; build_index logs one line instead.
            index.pq.cp.min_points_per_centroid = 1
        index.cp.seed = seed  # the k-means of the inverted lists, from --seed rather than FAISS's fixed one
        index.cp.min_points_per_centroid = 1
        return index


def sample_rows(rows: int, size: int, seed: int) -> np.ndarray:
    """A sorted sample of `size` of the row numbers 0..rows-1 (all of them when there are no more), drawn with
    `seed`, so one seed gives one training set."""
    if rows <= size:
        return np.arange(rows)
    return np.sort(np.random.default_rng(seed).choice(rows, size, replace=False))


def _chunks(total: int, size: int) -> Iterator[tuple[int, int]]:
    for start in range(0, total, size):
        yield start, min(start + size, total)


def build_index(
    stored: StoredVectors,
    spec: IndexSpec,
    train_sample: int,
    seed: int,
    chunk_size: int,
    added: Callable[[int, int], None] = lambda start, stop: None,
) -> tuple[Any, IndexSpec, int]:
    """(the FAISS index of every row of `stored`, the resolved spec, the rows trained on).

    The training sample (`sample_rows`) is gathered in one pass over the vectors, a chunk at a time; then the
    rows are added `chunk_size` at a time, `added(start, stop)` called after each. Memory: the sample, one chunk
    and the index."""
    rows = len(stored)
    if rows == 0:
        raise InputError("the embeddings hold no vectors; embed a corpus first")
    needs_training = spec.index_type.startswith("ivf")
    picked = sample_rows(rows, train_sample, seed) if needs_training else np.arange(0)
    spec = spec.resolved(stored.dims, rows, len(picked) if needs_training else rows)
    binary = is_binary(spec.precision)
    index = spec.new(stored.dims * 8 if binary else stored.dims, seed)
    if needs_training:
        sample = []
        with progress(total=len(picked), unit="vector", desc="index: training sample") as bar:
            for start, stop in _chunks(rows, chunk_size):
                lo, hi = np.searchsorted(picked, [start, stop])
                if lo < hi:
                    sample.append(stored.rows(start, stop)[picked[lo:hi] - start])
                    bar.update(int(hi - lo))
        centroids = max(spec.nlist or 1, 2**spec.nbits if spec.index_type == "ivf_pq" else 1)
        if len(picked) < POINTS_PER_CENTROID * centroids:
            logger.warning(
                "training %d centroids on %d vectors; FAISS advises %d (raise --train_sample, or lower --nlist%s)",
                centroids,
                len(picked),
                POINTS_PER_CENTROID * centroids,
                " or --nbits" if spec.index_type == "ivf_pq" else "",
            )
        train = unit_rows(np.concatenate(sample))
        del sample
        index.train(train)
        del train
    with progress(total=rows, unit="vector", desc=f"index: adding to {spec.index_type}") as bar:
        for start, stop in _chunks(rows, chunk_size):
            chunk = stored.rows(start, stop)
            index.add(binary_codes(chunk, spec.precision) if binary else unit_rows(chunk))
            added(start, stop)
            bar.update(stop - start)
    return index, spec, len(picked)


@dataclass
class VectorIndex:
    """An index directory opened for search (`open_index`)."""

    directory: Path
    manifest: dict[str, Any]
    index: Any
    name: str

    _codes: np.ndarray | None = None

    @property
    def index_type(self) -> str:
        return str(self.manifest["index_type"])

    @property
    def precision(self) -> str:
        """The indexed vectors' number format (float32 in manifests written before binary indexes)."""
        return str(self.manifest.get("precision", "float32"))

    def codes(self) -> np.ndarray:
        """A binary index's stored bits [rows, bits / 8] (one copy, made on first use), for the rescoring."""
        if self._codes is None:
            faiss = faiss_module()
            flat = self.index if self.index_type == "flat" else faiss.downcast_IndexBinary(self.index.storage)
            self._codes = faiss.vector_to_array(flat.xb).reshape(-1, self.index.code_size)
        return self._codes

    def hamming_search(self, queries: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
        """(rows [Q, n], Hamming distances [Q, n]) of the `n` nearest documents by their bits to the sign bits of
        the float `queries` (`padded_queries`); row -1 where the index has fewer."""
        distances, rows = self.index.search(np.packbits(queries > 0, axis=1), n)
        return rows, distances

    def search(
        self,
        queries: np.ndarray,
        k: int,
        nprobe: int | None,
        ef_search: int | None,
        rescore_multiplier: int | None = None,
        block: int = 1024,
    ) -> list[list[tuple[int, float]]]:
        """Per query, [(corpus row, cosine), ...] best first, at most `k` (an IVF index with few lists probed
        may find fewer). `nprobe`: the inverted lists an IVF index visits; `ef_search`: HNSW's candidate list;
        `rescore_multiplier`: a binary index's candidates per result, rescored with the float query."""
        binary = is_binary(self.precision)
        if rescore_multiplier is not None and not binary:
            raise InputError(
                f"--rescore_multiplier applies to indexes of binary vectors; {self.name} holds {self.precision} ones"
            )
        fetch = k * (rescore_multiplier or DEFAULT_RESCORE_MULTIPLIER) if binary else k
        if nprobe is not None and not self.index_type.startswith("ivf"):
            raise InputError(f"--nprobe applies to ivf_flat and ivf_pq indexes; {self.name} is {self.index_type}")
        if ef_search is not None and self.index_type != "hnsw":
            raise InputError(f"--ef_search applies to hnsw indexes; {self.name} is {self.index_type}")
        if self.index_type.startswith("ivf"):
            nlist = int(self.index.nlist)
            if nprobe is not None and nprobe > nlist:
                raise InputError(
                    f"--nprobe={nprobe} is more than the {nlist} lists of {self.name}; give at most {nlist}"
                )
            self.index.nprobe = nprobe if nprobe is not None else min(nlist, DEFAULT_NPROBE)
        if self.index_type == "hnsw":
            # FAISS looks at max(efSearch, k) candidates anyway; the default keeps a margin over k.
            self.index.hnsw.efSearch = ef_search if ef_search is not None else max(DEFAULT_EF_SEARCH, fetch)
        out: list[list[tuple[int, float]]] = []
        with progress(total=len(queries), unit="query", desc=f"search: {self.index_type} index") as bar:
            for start, stop in _chunks(len(queries), block):
                if binary:
                    out += self._rescored(queries[start:stop], k, fetch)
                else:
                    scores, rows = self.index.search(unit_rows(queries[start:stop]), k)
                    for r, s in zip(rows.tolist(), scores.tolist()):
                        out.append([(row, score) for row, score in zip(r, s) if row >= 0])
                bar.update(stop - start)
        return out

    def _rescored(self, queries: np.ndarray, k: int, fetch: int) -> list[list[tuple[int, float]]]:
        """The `fetch` Hamming-nearest of each query, rescored (`rescore`), the best `k` (ties in Hamming order)."""
        bits = int(self.index.d)
        if (queries.shape[1] + 7) // 8 * 8 != bits:
            raise InputError(
                f"{self.name} holds vectors of {bits} bits, the queries have {queries.shape[1]} dimensions; "
                "search with the --dimensions the corpus was embedded with"
            )
        padded = padded_queries(queries, bits)
        rows, _ = self.hamming_search(padded, min(fetch, int(self.index.ntotal)))
        codes = self.codes()
        out = []
        for query, found in zip(padded, rows):
            found = found[found >= 0]
            scores = rescore(query, codes[found], queries.shape[1])
            best = np.argsort(-scores, kind="stable")[:k]
            out.append([(int(found[i]), float(scores[i])) for i in best])
        return out

    def ids(self, rows: set[int]) -> dict[int, Any]:
        """The ids of `rows`, read from `ids.jsonl` a line at a time."""
        found: dict[int, Any] = {}
        with open(self.directory / IDS_FILE, encoding="utf-8") as f:
            for row, line in enumerate(f):
                if row in rows:
                    found[row] = json.loads(line)
        missing = rows - found.keys()
        if missing:
            raise InputError(f"{self.name}: {IDS_FILE} has no line {min(missing) + 1}; build the index again")
        return found


def open_index(directory: str, name: str) -> VectorIndex:
    """The index `bert index` wrote in `directory` (`name` in errors: the flag and path), its files checked."""
    path = Path(directory)
    fix = "give the --output_dir of bert index"
    if not path.is_dir():
        raise InputError(f"{name}: no such directory; {fix}")
    for file in (MANIFEST_FILE, INDEX_FILE, IDS_FILE):
        if not (path / file).is_file():
            raise InputError(f"{name} has no {file}; {fix}")
    manifest = load_json_file(path / MANIFEST_FILE, name)
    missing = {"index_type", "dims", "rows", "model_digest", "metric"} - set(manifest)
    if missing:
        raise InputError(f"{name}/{MANIFEST_FILE} lacks {', '.join(sorted(missing))}; build the index again")
    faiss = faiss_module()
    read = faiss.read_index_binary if is_binary(str(manifest.get("precision"))) else faiss.read_index
    try:
        index = read(str(path / INDEX_FILE))
    except RuntimeError as e:
        first = str(e).strip().splitlines()[-1][:160] if str(e).strip() else "unreadable"
        raise InputError(
            f"{name}/{INDEX_FILE} is not a readable FAISS index ({first}); build the index again"
        ) from None
    if index.ntotal != manifest["rows"] or index.d != manifest["dims"]:
        raise InputError(
            f"{name}/{INDEX_FILE} holds {index.ntotal} vectors of {index.d}, its manifest says {manifest['rows']} of "
            f"{manifest['dims']}; build the index again"
        )
    return VectorIndex(path, manifest, index, name)
