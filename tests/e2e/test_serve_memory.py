"""`bert serve`'s memory stays flat under a load of new batch shapes: a server process on 127.0.0.1 answers a
few hundred requests over the TEI, OpenAI and rerank routes, each batch of a token count not seen before
(the case of a real load, whose batches are unpadded to their tokens), and its resident memory after them is
within a few MB of what it was after a warm-up. Before oneDNN's primitive caches were bounded
(`bert.cpu_kernels.ONEDNN_CACHE_CAPACITY`) each new shape kept about 1.5 MB, so these requests grew the
server by hundreds of MB; `bench/soak.py` is the long form of this test."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("starlette", reason="bert serve needs the serve extra (pip install '.[serve]')")
pytest.importorskip("uvicorn", reason="bert serve needs the serve extra (pip install '.[serve]')")
sys.path.insert(0, str(Path(__file__).parent))

from test_serve import ServerProcess, call  # noqa: E402

from bert.modeling import BertModel  # noqa: E402
from conftest import save_model_dir, uncased_vocab, vocab_config  # noqa: E402

WARM_UP = 40  # requests before the first measure: the bounded caches fill
MEASURED = 120  # requests between the two measures, every one a batch shape not seen before
GROWTH_MB = 25  # bound on the growth over them; the unbounded caches grew by ~1.5 MB a request


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for process {pid}")


def shapes() -> list[tuple[int, int]]:
    """(texts, words per text) pairs whose token counts (texts x (words + [CLS] and [SEP])) are all different."""
    seen, out = set(), []
    for words in range(1, 60):
        for texts in range(1, 17):
            if texts * (words + 2) not in seen:
                seen.add(texts * (words + 2))
                out.append((texts, words))
    return out


def request(i: int, texts: int, words: int) -> tuple[str, dict]:
    """The i-th request of the load: the four routes in turn, `texts` texts of `words` words each."""
    batch = [" ".join(["the"] * words)] * texts
    route = ("/embed", "/v1/embeddings", "/rerank", "/v2/rerank")[i % 4]
    if route == "/embed":
        return route, {"inputs": batch}
    if route == "/v1/embeddings":
        return route, {"input": batch, "model": "m"}
    if route == "/rerank":
        return route, {"query": "the", "texts": batch}
    return route, {"query": "the", "documents": batch, "model": "m"}


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads the server's memory from /proc")
def test_server_memory_is_flat_over_new_batch_shapes(tmp_path):
    vocab = uncased_vocab(tmp_path)
    torch.manual_seed(3)
    model = save_model_dir(BertModel(vocab_config(vocab)), tmp_path / "encoder", vocab, max_seq_length=64)
    load = shapes()
    assert len(load) >= WARM_UP + MEASURED
    server = ServerProcess(tmp_path / "serve.log", model)
    try:
        statuses = []
        for i, (texts, words) in enumerate(load[:WARM_UP]):
            statuses.append(call(server.port, *request(i, texts, words))[0])
        before = rss_mb(server.process.pid)
        for i, (texts, words) in enumerate(load[WARM_UP : WARM_UP + MEASURED]):
            statuses.append(call(server.port, *request(i, texts, words))[0])
        after = rss_mb(server.process.pid)
    finally:
        assert server.stop() == 0, server.output()
    assert statuses == [200] * len(statuses)
    assert after - before < GROWTH_MB, f"{before:.0f} MB after the warm-up, {after:.0f} MB after {MEASURED} requests"
