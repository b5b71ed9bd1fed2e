"""`bert index`: a FAISS index of the vectors `bert embed` wrote, for `bert search --index`
(`bert.vector_index`: the index types, training, adding, the directory's files).

The vectors are read with `bert.formats.embeddings.open_embeddings` (one .npy or .parquet file, or its shards),
a chunk at a time; the index directory is written whole under a temporary name and renamed into place.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bert.commands.embed import MANIFEST_SUFFIX, EmbedArgs, model_digest, read_shard_manifest
from bert.commands.search import SearchArgs
from bert.errors import InputError
from bert.flags import same_as
from bert.formats.embeddings import FLOAT32_OR_BITS, open_embeddings
from bert.outputs import atomic_directory, claim
from bert.utils import print_result
from bert.vector_index import (
    DEFAULT_EF_CONSTRUCTION,
    DEFAULT_HNSW_M,
    HAMMING_METRIC,
    IDS_FILE,
    INDEX_FILE,
    INDEX_TYPES,
    MANIFEST_FILE,
    METRIC,
    PRECISION_DTYPES,
    IndexSpec,
    build_index,
    faiss_module,
    is_binary,
)

logger = logging.getLogger(__name__)

DEFAULT_TRAIN_SAMPLE = 100000
# The flags of one index type or two: given for another type, they are refused rather than ignored.
TYPE_FLAGS = {
    "nlist": ("ivf_flat", "ivf_pq"),
    "train_sample": ("ivf_flat", "ivf_pq"),
    "m": ("ivf_pq",),
    "nbits": ("ivf_pq",),
    "hnsw_m": ("hnsw",),
    "ef_construction": ("hnsw",),
}


@dataclass
class IndexArgs:
    """Build a FAISS index of the vectors `bert embed` wrote, for `bert search --index=DIR`.

    --corpus_embeddings is x.npy or x.parquet (its id column kept), or the shards x-0000i-of-0000N of
    `bert embed --num_shards=N` when x is not there. The index scores the cosine (every vector scaled to unit
    length, inner product), as `bert search` does: flat is exact; ivf_flat and ivf_pq cluster the vectors into
    --nlist lists, trained on a seeded sample of --train_sample vectors (ivf_pq also compresses each vector to
    --m codes of --nbits bits); hnsw is a graph of --hnsw_m links a node. Vectors of `bert embed
    --precision=binary` or `ubinary` (give the same --precision here) make a FAISS binary index, flat or hnsw,
    of their bits (Hamming distance; bert search rescores its candidates with the float query).

    Memory: the --train_sample vectors while training (4 x dims bytes each), one --chunk_size of vectors while
    adding, and the index itself: 4 x dims bytes a vector for flat and ivf_flat (+8 for the list's id), about
    4 x dims + 8 x --hnsw_m for hnsw, --m x --nbits / 8 + 8 for ivf_pq; binary: dims / 8 (flat), + 8 x --hnsw_m.

    Output, in --output_dir (written whole, then renamed into place): index.faiss; ids.jsonl (line i: the id of
    row i: --corpus's ids, else a Parquet file's id column, else the row number as a string, as bert search
    names records without ids); manifest.json (index type and parameters, metric, dims, rows, the files read,
    and the model digest and flags of the vectors, from the shards' manifests or --model, which bert search
    --index compares with its query model).
    """

    corpus_embeddings: str = field(
        metadata={
            "help": "The vectors of `bert embed --output_file=x.npy` (or x.parquet), or its shards "
            "x-0000i-of-0000N.npy (.parquet) when x is not there; float32."
        }
    )
    output_dir: str = field(metadata={"help": "The index directory to write (replaced whole when it exists)."})
    index_type: str = field(
        default="hnsw",
        metadata={
            "help": "flat (exact inner product), ivf_flat (--nlist lists, exact within them), ivf_pq (--nlist "
            "lists of product-quantized codes: --m x --nbits bits a vector) or hnsw (a graph, --hnsw_m links).",
            "choices": list(INDEX_TYPES),
        },
    )
    nlist: int | None = field(
        default=None,
        metadata={
            "positive": True,
            "help": "Inverted lists of ivf_flat/ivf_pq; default 4 x sqrt(rows), at most the training sample / 39.",
        },
    )
    m: int | None = field(
        default=None,
        metadata={
            "positive": True,
            "help": "Sub-quantizers of ivf_pq (a divisor of the dimensions); default dims / 8, or the divisor below.",
        },
    )
    nbits: int | None = field(
        default=None, metadata={"min": 1, "max": 16, "help": "Bits of each ivf_pq code; default 8."}
    )
    hnsw_m: int | None = field(
        default=None, metadata={"min": 2, "help": f"Links a node of the hnsw graph; default {DEFAULT_HNSW_M}."}
    )
    ef_construction: int | None = field(
        default=None,
        metadata={
            "positive": True,
            "help": f"Candidates hnsw considers when linking a new vector; default {DEFAULT_EF_CONSTRUCTION}.",
        },
    )
    train_sample: int | None = field(
        default=None,
        metadata={
            "positive": True,
            "help": f"Vectors ivf_flat/ivf_pq train on: a --seed-drawn sample of the rows (all when fewer); "
            f"default {DEFAULT_TRAIN_SAMPLE}.",
        },
    )
    seed: int = field(default=12345, metadata={"help": "The random seed of the training sample and the k-means."})
    chunk_size: int = field(
        default=10000, metadata={"positive": True, "help": "Vectors read and added to the index at a time."}
    )
    corpus: str | None = same_as(SearchArgs, "corpus")
    model: str | None = field(
        default=None,
        metadata={
            "model": True,
            "help": "The model that embedded the vectors, recorded by its digest (needed when no shard manifest "
            "says; checked against them when one does).",
        },
    )
    backend: str = same_as(SearchArgs, "backend")
    # The vectors' format as bert embed wrote them: checked against their dtype and their shards' manifests.
    precision: str = same_as(EmbedArgs, "precision")


def run_index(args: IndexArgs) -> dict[str, Any]:
    """Build the index; returns {"rows", "dims", "index_type", "output_dir", "bytes"}."""
    for flag, types in TYPE_FLAGS.items():
        if getattr(args, flag) is not None and args.index_type not in types:
            raise InputError(f"--{flag} applies to --index_type={' or '.join(types)}; drop it for {args.index_type}")
    inputs = {"--corpus_embeddings": args.corpus_embeddings, "--corpus": args.corpus, "--model": args.model}
    with claim("index", trees={"--output_dir": args.output_dir}, inputs=inputs, inputs_inside=False):
        return _run(args)


def _embedding_manifests(stored: Any, name: str) -> list[dict[str, Any]]:
    """The manifests `bert embed --num_shards` wrote beside each shard (none for an unsharded file)."""
    paths = [part.path for part in getattr(stored, "parts", [stored])]
    found = [Path(str(p) + MANIFEST_SUFFIX) for p in paths]
    present = [p for p in found if p.is_file()]
    if present and len(present) != len(found):
        missing = next(p for p in found if not p.is_file())
        raise InputError(f"{name}: {missing.name} is missing beside its shard; embed that shard again")
    return [read_shard_manifest(p, name) for p in present]


def _check_precision(args: IndexArgs, stored: Any, manifests: list[dict[str, Any]], name: str) -> None:
    """--precision is what the shards' manifests record and what the vectors' number format is."""
    recorded = sorted({str((m.get("flags") or {}).get("--precision", "float32")) for m in manifests})
    if len(recorded) > 1:
        raise InputError(f"{name}: its shards were embedded with --precision={' and '.join(recorded)}; embed again")
    if recorded and recorded[0] != args.precision:
        raise InputError(f"{name} was embedded with --precision={recorded[0]}; give --precision={recorded[0]}")
    expected = PRECISION_DTYPES.get(args.precision)
    if expected is not None and str(stored.dtype) != expected:
        raise InputError(
            f"{name} holds {stored.dtype} vectors, not the {expected} of --precision={args.precision}; give the "
            "--precision bert embed wrote them with"
        )


def _made_with(args: IndexArgs, stored: Any, name: str) -> tuple[str, dict[str, Any] | None]:
    """(model digest, embed's vector flags or None) of the vectors: their shards' manifests, else --model."""
    manifests = _embedding_manifests(stored, name)
    _check_precision(args, stored, manifests, name)
    for key, what in (("model_digest", "models"), ("flags", "flags")):
        values = {json.dumps(m.get(key), sort_keys=True) for m in manifests}
        if len(values) > 1:
            raise InputError(f"{name}: its shards were embedded with different {what}; embed again")
    digest = manifests[0]["model_digest"] if manifests else None
    if args.model is not None:
        given = model_digest(args.model, args.backend)
        if digest is not None and given != digest:
            raise InputError(
                f"{name} was embedded by a model with weights {digest[:12]}, --model={args.model} has weights "
                f"{given[:12]}; give the model that embedded them"
            )
        digest = given
    if digest is None:
        raise InputError(
            f"{name} records no model (an unsharded file has no manifest); give --model, the model that embedded "
            "it, so that bert search --index can check its queries' model"
        )
    return digest, manifests[0].get("flags") if manifests else None


def _run(args: IndexArgs) -> dict[str, Any]:
    faiss = faiss_module()  # before any reading: a missing extra is the first thing said
    # Imported here, not at the top, so that bert.cli reports a flag error before torch loads.
    from bert.retrieval import read_texts

    name = f"--corpus_embeddings={args.corpus_embeddings}"
    stored = open_embeddings(args.corpus_embeddings, name, FLOAT32_OR_BITS)
    digest, flags = _made_with(args, stored, name)
    given = {flag: getattr(args, flag) for flag in TYPE_FLAGS if getattr(args, flag) is not None}
    shape = {k: v for k, v in given.items() if k != "train_sample"}
    spec = IndexSpec(args.index_type, **shape, precision=args.precision)
    out = Path(args.output_dir)
    records = read_texts(args.corpus, args.corpus) if args.corpus is not None else None
    ids_from = "--corpus" if records is not None else "row numbers"
    with atomic_directory(out) as tmp:
        with open(tmp / IDS_FILE, "w", encoding="utf-8") as ids_file:

            def write_ids(start: int, stop: int) -> None:
                nonlocal ids_from
                if records is not None:
                    keys: list[Any] = [key for key, _ in _take(records, stop - start, args.corpus, len(stored))]
                else:
                    stored_ids = stored.ids(start, stop)
                    keys = stored_ids if stored_ids is not None else [str(row) for row in range(start, stop)]
                    ids_from = "the id column" if stored_ids is not None else ids_from
                ids_file.writelines(json.dumps(key, ensure_ascii=False) + "\n" for key in keys)

            index, spec, trained_on = build_index(
                stored, spec, args.train_sample or DEFAULT_TRAIN_SAMPLE, args.seed, args.chunk_size, write_ids
            )
        if records is not None and next(records, None) is not None:
            raise InputError(
                f"--corpus={args.corpus} has more records than the {len(stored)} vectors of {name}; give the corpus "
                "file they were embedded from"
            )
        binary = is_binary(spec.precision)
        (faiss.write_index_binary if binary else faiss.write_index)(index, str(tmp / INDEX_FILE))
        size = os.path.getsize(tmp / INDEX_FILE)
        dims = int(index.d)  # a binary index's: bits
        manifest = _manifest(args, spec, stored, dims, trained_on, ids_from, digest, flags)
        manifest.update(bytes=size, faiss=faiss.__version__)
        (tmp / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    kind, unit = (f"binary {spec.index_type}", " bits") if binary else (spec.index_type, "")
    what = f"{kind} index: {len(stored)} vectors of {dims}{unit} ({size / len(stored):.0f} bytes each)"
    print_result("index", what, f"written to {args.output_dir}")
    logger.info("%s: %s", args.output_dir, json.dumps(manifest))
    return {
        "rows": len(stored),
        "dims": dims,
        "index_type": spec.index_type,
        "precision": spec.precision,
        "output_dir": str(out),
        "bytes": size,
    }


def _manifest(
    args: IndexArgs,
    spec: IndexSpec,
    stored: Any,
    dims: int,
    trained_on: int,
    ids_from: str,
    digest: str | None,
    flags: dict[str, Any] | None,
) -> dict[str, Any]:
    """The index's manifest.json, but for the index file's size and the faiss version (`_run` adds them)."""
    parts = getattr(stored, "parts", [stored])
    return {
        "index_type": spec.index_type,
        "params": spec.params(),
        "precision": spec.precision,
        "metric": HAMMING_METRIC if is_binary(spec.precision) else METRIC,
        "dims": dims,
        "rows": len(stored),
        "trained_on": trained_on,
        "seed": args.seed,
        "ids_file": IDS_FILE,
        "ids_from": ids_from,
        "embeddings": [{"name": p.path.name, "rows": len(p), "bytes": p.path.stat().st_size} for p in parts],
        "model_digest": digest,
        "flags": flags,
    }


def _take(records: Any, n: int, corpus: str | None, rows: int) -> list[tuple[str, str]]:
    taken = [record for _, record in zip(range(n), records)]
    if len(taken) < n:
        raise InputError(
            f"--corpus={corpus} has fewer records than the {rows} vectors; give the corpus file they were embedded from"
        )
    return taken
