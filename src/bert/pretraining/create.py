"""create_pretraining_data.py's outputs: instances from either generator into TFRecord files or a native
dataset, with the corpus statistics and (native) the manifest.

Two generators: the original's (`bert.pretraining.instances`, one process, the original's records for
a seed) and the streaming one (`bert.pretraining.streaming`, bounded memory, many processes). Nothing
appears under the output names unless the whole run succeeds. Corpus statistics are logged and written
to `<output>.stats.json` (native: `stats.json` inside the directory).
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import dataclasses
import json
import logging
import multiprocessing
import os
import random
import struct
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from bert import __version__
from bert.errors import InputError
from bert.formats.native import NativeShardWriter, features_to_records, file_sha256, record_dtype, records_to_features
from bert.formats.tfrecord import PRETRAINING_FEATURES, TFRecordWriter, decode_example
from bert.pretraining.instances import create_training_instances, instance_to_features, log_example, read_documents
from bert.pretraining.streaming import (
    ASSEMBLY_BATCH,
    BufferProcessor,
    GenerationSettings,
    encode_records,
    init_worker,
    iter_buffers,
    part_name,
    process_buffer,
    record_stats,
)
from bert.utils import atomic_write, progress, text_size, write_run_info

if TYPE_CHECKING:
    from bert.commands.create_pretraining_data import CreatePretrainingDataArgs

logger = logging.getLogger(__name__)

_LOGGED_EXAMPLES = 20  # the original logs its first 20 instances


def create_pretraining_data(
    inputs: list[str],
    outputs: list[str],
    fmt: str,
    tokenizer: Any,
    settings: GenerationSettings,
    streaming: bool = False,
    num_workers: int = 1,
    buffer_mb: float = 4.0,
    decode_errors: str = "strict",
    run_args: CreatePretrainingDataArgs | None = None,
    shard: tuple[int, int] = (0, 1),
) -> dict[str, Any]:
    """Write the instances of `inputs` to `outputs` and return the corpus statistics.

    Args:
        inputs: text files, one sentence per line, a blank line between documents (.gz decompressed).
        outputs: TFRecord files (instances dealt round-robin), or one directory for `fmt="native"`.
        fmt: "tfrecord" or "native".
        tokenizer: a `FullTokenizer` over `settings.vocab_file`.
        settings: the flags that shape the instances.
        streaming: the bounded-memory generator (implied by `num_workers > 1`); otherwise the original's.
        num_workers, buffer_mb: streaming's worker processes and MB of text per buffer.
        decode_errors: "strict", "ignore" or "replace" for bytes that are not UTF-8.
        run_args: the command's arguments, recorded in a native dataset's args.json.
        shard: (index, count): write only the buffers whose index is `index` modulo `count` (streaming). Every
            shard reads the whole corpus and deals the documents into the same buffers, whose instances depend
            on the seed and the buffer's index only, so the shards of one `count` together hold exactly the
            instances of one unsharded run, and a native shard's parts keep their global names
            (`shard_<buffer>.npy`), so that `bert pretrain` puts them back in one run's order.
    """
    start = time.time()
    mode = "streaming" if streaming or num_workers > 1 or shard[1] > 1 else "compat"
    logger.info("*** Reading from input files ***")
    for path in inputs:
        logger.info("  %s", path)
    with _Sink(settings, inputs, outputs, fmt, mode, tokenizer, num_workers, buffer_mb, run_args, shard) as sink:
        if mode == "streaming":
            _generate_streaming(settings, inputs, tokenizer, sink, num_workers, buffer_mb, decode_errors, shard)
        else:
            _generate_compat(settings, inputs, tokenizer, sink, decode_errors)
        stats = sink.finish(start)
    logger.info("*** Writing to output files ***")
    for path in outputs:
        logger.info("  %s", path)
    for tokens, feats in sink.examples:
        log_example(tokens, feats)
    _log_stats(stats)
    logger.info("Wrote %d total instances", stats["instances"])
    return stats


def _manifest_fields(
    settings: GenerationSettings,
    tokenizer: Any,
    mode: str,
    inputs: list[str],
    num_workers: int,
    buffer_mb: float,
    shard: tuple[int, int],
) -> dict:
    return {
        "max_seq_length": settings.max_seq_length,
        "max_predictions_per_seq": settings.max_predictions_per_seq,
        "masked_lm_prob": settings.masked_lm_prob,
        "short_seq_prob": settings.short_seq_prob,
        "dupe_factor": settings.dupe_factor,
        "do_whole_word_mask": settings.do_whole_word_mask,
        "do_lower_case": settings.do_lower_case,
        "random_seed": settings.random_seed,
        "vocab_sha256": file_sha256(settings.vocab_file),
        "vocab_size": len(tokenizer.vocab),
        "mode": mode,
        "streaming": mode == "streaming",
        "num_workers": num_workers,
        "streaming_buffer_mb": buffer_mb if mode == "streaming" else None,
        "input_files": inputs,
        "shard_index": shard[0],
        "num_shards": shard[1],
        "bert_version": __version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def finish_stats(counts: collections.Counter, seconds: float, text_bytes: int) -> dict[str, Any]:
    """The corpus statistics (counts plus fractions) logged and written at the end."""
    c = counts
    n = c["written"]
    pred = c["predictions"]
    stats = {
        "documents": c["documents"],
        "sentences": c["sentences"],
        "text_tokens": c["text_tokens"],
        "instances": n,
        "instance_tokens": c["instance_tokens"],
        "mean_tokens_per_instance": c["instance_tokens"] / n if n else 0.0,
        "fraction_max_length": c["max_length_instances"] / n if n else 0.0,
        "predictions": pred,
        "mean_predictions_per_instance": pred / n if n else 0.0,
        "fraction_tokens_predicted": pred / c["instance_tokens"] if n else 0.0,
        "predictions_replaced_by_mask": c["mask"],
        "predictions_kept_original": c["keep"],
        "predictions_replaced_by_random": c["random"],
        "fraction_mask_keep_random": [c[k] / pred if pred else 0.0 for k in ("mask", "keep", "random")],
        "random_next": c["random_next"],
        "fraction_random_next": c["random_next"] / n if n else 0.0,
        "text_bytes": text_bytes,
        "seconds": round(seconds, 3),
        "mb_per_second": round(text_bytes / 1e6 / seconds, 3) if seconds > 0 else None,
    }
    return stats


def _log_stats(stats: dict[str, Any]) -> None:
    logger.info(
        "Corpus: %d documents, %d sentences, %d tokens -> %d instances (%.1f tokens each), "
        "%d predictions (%.1f%% of tokens; mask/keep/random %.3f/%.3f/%.3f), %.1f%% random next",
        stats["documents"],
        stats["sentences"],
        stats["text_tokens"],
        stats["instances"],
        stats["mean_tokens_per_instance"],
        stats["predictions"],
        100 * stats["fraction_tokens_predicted"],
        *stats["fraction_mask_keep_random"],
        100 * stats["fraction_random_next"],
    )


class _Sink:
    """Where instances go: TFRecord files (round-robin) or a native dataset; counts the statistics.

    Compat mode hands it records in memory (`add_records`); streaming workers write part files into
    `part_dir`, handed over in order with `add_part`. Nothing appears under the output names unless
    `finish` succeeds.
    """

    def __init__(
        self,
        settings: GenerationSettings,
        inputs: list[str],
        outputs: list[str],
        fmt: str,
        mode: str,
        tokenizer: Any,
        num_workers: int,
        buffer_mb: float,
        run_args: CreatePretrainingDataArgs | None = None,
        shard: tuple[int, int] = (0, 1),
    ) -> None:
        self.settings, self.inputs, self.outputs, self.fmt, self.mode = settings, inputs, outputs, fmt, mode
        self.num_workers, self.buffer_mb, self.run_args, self.shard = num_workers, buffer_mb, run_args, shard
        self.tokenizer = tokenizer
        self.counts: collections.Counter = collections.Counter()
        self.examples: list[tuple[list[str], dict[str, Any]]] = []
        self.mask_id = tokenizer.vocab["[MASK]"]
        self.dtype = record_dtype(settings.max_seq_length, settings.max_predictions_per_seq, len(tokenizer.vocab))
        self._stack = contextlib.ExitStack()
        self._next = 0  # the output file the next TFRecord goes to
        if fmt == "native":
            self.native = self._stack.enter_context(
                NativeShardWriter(
                    outputs[0], settings.max_seq_length, settings.max_predictions_per_seq, len(tokenizer.vocab)
                )
            )
            self.part_dir = str(self.native.tmp_dir)
        elif mode == "compat":
            self.writers = [self._stack.enter_context(TFRecordWriter(o)) for o in outputs]
        else:  # workers write framed parts; their records are copied to the outputs as they are
            first = Path(outputs[0]).resolve()
            first.parent.mkdir(parents=True, exist_ok=True)
            # Named after the first output, so that the next run on it removes what a killed run left.
            tmp = tempfile.TemporaryDirectory(prefix=f".{first.name}.tmp-", dir=first.parent)
            self.part_dir = self._stack.enter_context(tmp)
            self.files = [self._stack.enter_context(atomic_write(o, "wb")) for o in outputs]

    def __enter__(self) -> _Sink:
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stack.__exit__(*exc)

    def add_records(self, recs: np.ndarray, tokens: list[list[str]] | None = None) -> None:
        """Write records (compat mode), in order."""
        self.counts.update(record_stats(recs, self.mask_id))
        self._keep_examples(recs, tokens)
        if self.fmt == "native":
            self.native.write(recs)
            return
        for payload in encode_records(recs):
            self.writers[self._next].write(payload)
            self._next = (self._next + 1) % len(self.writers)

    def add_part(self, index: int, n: int, stats: dict[str, Any]) -> None:
        """Take over the part file of buffer `index` (streaming mode), in buffer order."""
        self.counts.update(stats)
        if n == 0:
            return
        name = part_name(index, self.fmt)
        path = os.path.join(self.part_dir, name)
        if self.fmt == "native":
            if len(self.examples) < 5:
                self._keep_examples(np.load(path, mmap_mode="r")[:5])
            self.native.add_shard(name, n)
            return
        with open(path, "rb") as f:
            for frame in _iter_frames(f):
                if len(self.examples) < 5:
                    feats = decode_example(frame[12:-4])
                    k = int(feats["input_mask"].sum())
                    self.examples.append((self.tokenizer.convert_ids_to_tokens(feats["input_ids"][:k].tolist()), feats))
                self.files[self._next].write(frame)
                self._next = (self._next + 1) % len(self.files)
        os.unlink(path)

    def _keep_examples(self, recs: np.ndarray, tokens: list[list[str]] | None = None) -> None:
        limit = _LOGGED_EXAMPLES if self.mode == "compat" else 5
        take = min(len(recs), limit - len(self.examples))
        if take <= 0:
            return
        feats = records_to_features(np.asarray(recs[:take]))
        for i in range(take):
            one = {k: feats[k][i] for k in PRETRAINING_FEATURES}
            if tokens is not None:
                toks = tokens[i]
            else:
                toks = self.tokenizer.convert_ids_to_tokens(one["input_ids"][: int(one["input_mask"].sum())].tolist())
            self.examples.append((toks, one))

    def finish(self, start: float) -> dict[str, Any]:
        """Check something was written, then publish the outputs, the statistics and (native) the manifest."""
        # A shard may be empty (more shards than buffers); the set as a whole is checked by `bert pretrain`.
        if self.counts["written"] == 0 and self.shard[1] == 1:
            raise InputError(
                f"--input_file: no tokens in {len(self.inputs)} file(s) ({self.inputs[0]}, ...); the corpus is "
                "empty (expected text with one sentence per line, a blank line between documents)"
            )
        text_bytes = sum(text_size(p) for p in self.inputs)
        stats = finish_stats(self.counts, time.time() - start, text_bytes)
        stats.update(mode=self.mode, output_format=self.fmt, num_workers=self.num_workers, output_files=self.outputs)
        stats.update(shard_index=self.shard[0], num_shards=self.shard[1])
        if self.fmt == "native":
            if self.run_args is not None:
                write_run_info(self.native.tmp_dir, "create-pretraining-data", self.run_args)
            manifest = _manifest_fields(
                self.settings, self.tokenizer, self.mode, self.inputs, self.num_workers, self.buffer_mb, self.shard
            )
            self.native.close(manifest, stats)
        else:
            self._stack.close()  # publishes the TFRecord files
            _publish_stats(f"{self.outputs[0]}.stats.json", stats)
        return stats


def _iter_frames(f) -> Iterator[bytes]:
    """The framed records of a TFRecord file, as they are (length, its CRC, data, its CRC)."""
    while True:
        header = f.read(12)
        if not header:
            return
        (length,) = struct.unpack_from("<Q", header)
        yield header + f.read(length + 4)


def _publish_stats(path: str | os.PathLike, stats: dict[str, Any]) -> None:
    with atomic_write(path) as f:
        json.dump(stats, f, indent=2)
        f.write("\n")


def _generate_compat(
    settings: GenerationSettings, inputs: list[str], tokenizer: Any, sink: _Sink, decode_errors: str
) -> None:
    """The original's create_training_instances + write_instance_to_example_files."""
    rng = random.Random(settings.random_seed)
    documents = read_documents(inputs, tokenizer, decode_errors)
    sink.counts.update(
        documents=len(documents),
        sentences=sum(len(d) for d in documents),
        text_tokens=sum(len(s) for d in documents for s in d),
    )
    if not documents:
        return
    instances = create_training_instances(
        documents,
        list(tokenizer.vocab.keys()),
        settings.max_seq_length,
        settings.dupe_factor,
        settings.short_seq_prob,
        settings.masked_lm_prob,
        settings.max_predictions_per_seq,
        rng,
        settings.do_whole_word_mask,
    )
    del documents
    vocab = tokenizer.vocab
    for s in range(0, len(instances), ASSEMBLY_BATCH):
        chunk = instances[s : s + ASSEMBLY_BATCH]
        feats = [
            instance_to_features(x, vocab, settings.max_seq_length, settings.max_predictions_per_seq) for x in chunk
        ]
        stacked = {k: np.array([f[k] for f in feats]) for k in PRETRAINING_FEATURES}
        sink.add_records(features_to_records(stacked, sink.dtype), [x.tokens for x in chunk])


def _generate_streaming(
    settings: GenerationSettings,
    inputs: list[str],
    tokenizer: Any,
    sink: _Sink,
    num_workers: int,
    buffer_mb: float,
    decode_errors: str,
    shard: tuple[int, int] = (0, 1),
) -> None:
    """Deal documents into buffers, have workers turn each into a part file, hand the parts over in order
    (only this shard's buffers: see `create_pretraining_data`)."""
    settings = dataclasses.replace(settings, output_format=sink.fmt, part_dir=sink.part_dir)
    total_mb = sum(text_size(p) for p in inputs) / 1e6
    buffer_chars = max(1, int(buffer_mb * 1e6))
    shard_index, num_shards = shard
    buffers = iter_buffers(inputs, buffer_chars, settings.random_seed, decode_errors)
    with progress(total=round(total_mb, 2), unit="MB", desc="create-pretraining-data") as bar:

        def collect(result: tuple[int, int, dict[str, Any]], chars: int) -> None:
            sink.add_part(*result)
            bar.update(round(chars / 1e6, 2))
            bar.set_postfix(instances=sink.counts["written"], refresh=False)

        def ours(index: int, chars: int) -> bool:
            if index % num_shards == shard_index:
                return True
            bar.update(round(chars / 1e6, 2))  # read, but another shard's to process
            return False

        if num_workers == 1:
            worker = BufferProcessor(settings, tokenizer)
            for index, buf in enumerate(buffers):
                if ours(index, buf.chars):
                    collect(worker.process(index, buf.lines, buf.doc_lines), buf.chars)
            return
        _process_in_pool(settings, buffers, num_workers, ours, collect)


def _process_in_pool(
    settings: GenerationSettings,
    buffers: Iterator[Any],
    num_workers: int,
    ours: Callable[[int, int], bool],
    collect: Callable[[tuple[int, int, dict[str, Any]], int], None],
) -> None:
    """Process this shard's buffers (`ours`) in `num_workers` processes, their results `collect`ed in order."""
    # spawn: workers start clean (no copy of the parent's state or threads) on every platform. Unlike
    # multiprocessing.Pool, the executor reports a worker that fails to start instead of respawning it.
    with concurrent.futures.ProcessPoolExecutor(
        num_workers,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=init_worker,
        initargs=(settings, os.getpid()),
    ) as pool:
        pending: collections.deque = collections.deque()
        try:
            for index, buf in enumerate(buffers):
                if not ours(index, buf.chars):
                    continue
                pending.append((pool.submit(process_buffer, (index, buf.lines, buf.doc_lines)), buf.chars))
                del buf
                # Bounded memory: at most one buffer waits for a free worker.
                while len(pending) > num_workers:
                    future, chars = pending.popleft()
                    collect(future.result(), chars)
            while pending:
                future, chars = pending.popleft()
                collect(future.result(), chars)
        except concurrent.futures.process.BrokenProcessPool as e:
            raise RuntimeError(
                "a create-pretraining-data worker process died (out of memory? or, when calling from "
                "Python, is the caller's code under `if __name__ == '__main__':`?)"
            ) from e
        finally:
            for future, _ in pending:
                future.cancel()
