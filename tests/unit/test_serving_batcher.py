"""The server's queue counts a request's tokens in the sequences the Predictor makes of it, and refuses an input
too long to run whole by the Predictor's own length rule (`Batcher._measure`), without a server or model thread."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from bert.inference import Predictor
from bert.input_lines import InputItemError
from bert.modeling import BertForSequenceClassification, BertModel
from conftest import save_model_dir, uncased_vocab, vocab_config

pytest.importorskip("starlette", reason="bert serve needs the serve extra (pip install '.[serve]')")
from bert.serving import Batcher, Metrics, ServeSettings  # noqa: E402
from bert.serving import batcher as batcher_module  # noqa: E402
from bert.serving.batcher import CLASSIFY, EMBED, RANK, SIMILAR, SWITCH_INTERVAL  # noqa: E402

QUERY = "where do the normans come from"
DOCUMENT = "the normans were the people who in the tenth and eleventh centuries gave their name to normandy"
# The options a /similarity request hands the queue, and an /embed request's (the same and two more).
OPTIONS = dict(truncate=True, truncation_direction="right", pooling=None, prompt_name=None)
EMBED_OPTIONS = dict(normalize=False, dimensions=None, **OPTIONS)


@pytest.fixture(scope="module")
def vocab(tmp_path_factory) -> Path:
    return uncased_vocab(tmp_path_factory.mktemp("vocab"))


def _predictor(model, vocab: Path, directory: Path) -> Predictor:
    return Predictor.from_pretrained(save_model_dir(model, directory, vocab), "cpu", max_seq_length=24)


def _measured(predictor: Predictor, kind: str, inputs: list, **options) -> tuple[int, str | None]:
    """(tokens, error message) of one job as the queue measures it."""
    batcher = Batcher(predictor, ServeSettings(model_id="test"), Metrics())  # no model thread

    async def measure() -> tuple[int, str | None]:
        batcher.submit(kind, inputs, **options)
        job = batcher._queue[0]
        tokens = batcher._measure(job)
        return tokens, None if job.error is None else job.error.message

    return asyncio.run(measure())


def reranker_pair_length(p: Predictor, document: str) -> int:
    """The tokens of `[CLS] QUERY [SEP] document [SEP]`."""
    return len(p.tokenizer.encode(QUERY)) + len(p.tokenizer.encode(document)) + 3


def test_a_cross_encoders_pairs_are_counted_and_refused_as_the_predictor_runs_them(vocab, tmp_path):
    torch.manual_seed(0)
    reranker = _predictor(BertForSequenceClassification(vocab_config(vocab), num_labels=1), vocab, tmp_path / "ce")
    options = dict(query=QUERY, pooling=None, raw_scores=False, truncation_direction="right")
    short = ["normandy", "the normans"]
    tokens, error = _measured(reranker, RANK, short, truncate=False, **options)
    built = reranker.pair_sequences([(QUERY, d) for d in short], False, "right")
    assert error is None and tokens == sum(len(ids) for ids, _ in built)
    tokens, error = _measured(reranker, RANK, [*short, DOCUMENT], truncate=False, **options)
    with pytest.raises(InputItemError) as refused:
        reranker.rank(QUERY, [*short, DOCUMENT], truncate=False)
    assert error == f'input 2: {refused.value.reason.split("; ")[0]}; shorten it or send "truncate": true'
    tokens, error = _measured(reranker, RANK, [*short, DOCUMENT], truncate=True, **options)
    built = reranker.pair_sequences([(QUERY, d) for d in [*short, DOCUMENT]], True, "right")
    assert error is None and tokens == sum(len(ids) for ids, _ in built) and len(built[2][0]) == 24
    long = (f"{DOCUMENT} {DOCUMENT}", None)
    tokens, error = _measured(reranker, CLASSIFY, [long], truncate=True, truncation_direction="left")
    assert error is None and tokens == 24


def test_an_encoders_rerank_is_counted_as_the_embeddings_it_runs(vocab, tmp_path):
    # An encoder ranks by embedding the query and each document apart: a query and a document that fit one
    # at a time are no pair too long (the queue once measured them as a cross-encoder's pair, and refused).
    torch.manual_seed(0)
    encoder = _predictor(BertModel(vocab_config(vocab)), vocab, tmp_path / "enc")
    options = dict(query=QUERY, pooling=None, raw_scores=False, truncate=False, truncation_direction="right")
    words = " ".join(DOCUMENT.split()[:16])  # 19 tokens, and 27 as a pair with the query
    tokens, error = _measured(encoder, RANK, [words], **options)
    sequences, _ = encoder.embedding_sequences([QUERY, words], truncate=False)
    assert error is None and tokens == sum(len(ids) for ids, _ in sequences)
    assert max(len(ids) for ids, _ in sequences) <= 24 < reranker_pair_length(encoder, words)
    encoder.rank(QUERY, [words], truncate=False)  # the Predictor runs it
    tokens, error = _measured(encoder, RANK, [words, f"{DOCUMENT} {DOCUMENT}"], **options)
    assert error is not None and error.startswith("input 1: ") and "more than max_seq_length=24" in error


def test_requests_sharing_a_batch_run_their_prepared_inputs_joined(vocab, tmp_path):
    # Four requests queued before the model thread starts share its first batch: each kind's two run as one
    # Predictor call on their prepared inputs joined (the source once), so each gets the plain call's results.
    torch.manual_seed(0)
    encoder = _predictor(BertModel(vocab_config(vocab)), vocab, tmp_path / "enc")
    metrics = Metrics()
    batcher = Batcher(encoder, ServeSettings(model_id="test"), metrics)
    texts = [DOCUMENT, "normandy", "the normans", f"{DOCUMENT} {DOCUMENT}"]
    options, embed = OPTIONS, EMBED_OPTIONS

    async def answers() -> list:
        futures = [
            batcher.submit(SIMILAR, texts[:2], source=QUERY, **options),
            batcher.submit(EMBED, texts[:1], **embed),
            batcher.submit(SIMILAR, texts[2:], source=QUERY, **options),
            batcher.submit(EMBED, texts[1:], **embed),
        ]
        batcher.start()
        try:
            return await asyncio.gather(*futures)
        finally:
            batcher.close()

    (first, first_tokens), (one, _), (rest, rest_tokens), (others, _) = asyncio.run(answers())
    assert first + rest == encoder.similarity(QUERY, texts)
    assert np.array_equal(np.stack(one + others), encoder.embed(texts))
    sequences, _ = encoder.embedding_sequences([QUERY, *texts])  # each request counts its source
    assert first_tokens + rest_tokens == sum(len(ids) for ids, _ in sequences) + len(sequences[0][0])
    assert "bert_batch_size_count 1" in metrics.render(0)


def test_the_gil_switch_interval_is_short_while_the_model_thread_runs(vocab, tmp_path):
    # The event loop and the model thread share the GIL: while the model thread runs, a thread that holds it
    # yields within SWITCH_INTERVAL, not Python's 5 ms; the process's own interval is back once the thread stops.
    encoder = _predictor(BertModel(vocab_config(vocab)), vocab, tmp_path / "enc")
    batcher = Batcher(encoder, ServeSettings(model_id="test"), Metrics())
    before = sys.getswitchinterval()
    assert before > SWITCH_INTERVAL
    batcher.start()
    try:
        assert sys.getswitchinterval() == SWITCH_INTERVAL
    finally:
        batcher.close()
    assert sys.getswitchinterval() == before


def test_after_a_batch_of_several_the_next_takes_the_requests_still_arriving(vocab, tmp_path, monkeypatch):
    # Requests coming one by one after a batch of two, each within the gap of the last, make one batch; a request
    # after a longer silence (the gap counted from the last arrival) starts another. The gap is stretched so that
    # the timing holds on a slow machine.
    monkeypatch.setattr(batcher_module, "GATHER_GAP", 0.4)
    monkeypatch.setattr(batcher_module, "GATHER_LIMIT", 3.0)
    encoder = _predictor(BertModel(vocab_config(vocab)), vocab, tmp_path / "enc")
    metrics = Metrics()
    batcher = Batcher(encoder, ServeSettings(model_id="test"), metrics)
    embed = EMBED_OPTIONS

    async def load() -> None:
        first = [batcher.submit(EMBED, [text], **embed) for text in (QUERY, DOCUMENT)]
        batcher.start()
        try:
            await asyncio.gather(*first)
            trickle = []
            for text in ("normandy", "the normans", "a tenth century name"):  # 0.1 s apart: within the gap
                trickle.append(batcher.submit(EMBED, [text], **embed))
                await asyncio.sleep(0.1)
            await asyncio.gather(*trickle)
            await asyncio.sleep(0.6)  # past the gap: a batch of its own
            await batcher.submit(EMBED, ["france"], **embed)
        finally:
            batcher.close()

    asyncio.run(load())
    sizes = [line for line in metrics.render(0).splitlines() if line.startswith("bert_batch_size_bucket")]
    assert 'bert_batch_size_bucket{le="1"} 1' in sizes  # "france" alone
    assert 'bert_batch_size_bucket{le="2"} 2' in sizes  # the first two together
    assert 'bert_batch_size_bucket{le="4"} 3' in sizes  # the three that trickled in together
    assert "bert_batch_size_count 3" in metrics.render(0)
