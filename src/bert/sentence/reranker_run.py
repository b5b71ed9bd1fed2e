"""The run of `bert train-reranker`: `train_reranker(args)` trains and/or evaluates a cross-encoder
(`BertForSequenceClassification`, one output: the relevance logit) on `bert.sentence.runner.SentenceRun`.

Its losses are means over queries, so its batch may be cut into `--gradient_accumulation_steps` micro-batches
of whole queries: the same gradient, in the activations' memory of one micro-batch's pairs
(batch x (1 + negatives) / steps); under torchrun each process takes its share of a step's queries.
Evaluation reranks a bi-encoder's (`--eval_retriever`) top results. The model is exported in transformers'
layout (`id2label` with one label), which `sentence_transformers.CrossEncoder` loads.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from bert.batching import BatchPlan
from bert.distributed import DistContext
from bert.errors import InputError
from bert.flags import teacher_cache_dir
from bert.inference import LONGER_ADVICE, Predictor
from bert.modeling import BertForSequenceClassification
from bert.sentence import evaluation, teachers
from bert.sentence.data import PAIRS, SCORED, read_beir, read_training_data
from bert.sentence.loss_table import RERANKER_LOSS_TABLE, check_data, check_loss, with_transfer
from bert.sentence.runner import (
    BLOCK_BATCHES,
    SentenceRun,
    embed_texts,
    mine_negatives,
    pair_sequences,
    run_command,
)
from bert.utils import progress

if TYPE_CHECKING:
    from bert.commands.train_embeddings import SentenceTrainingArgs
    from bert.commands.train_reranker import TrainRerankerArgs

logger = logging.getLogger(__name__)


class RerankerRun(SentenceRun):
    command = "train-reranker"
    model_class = BertForSequenceClassification
    next_command = "bert rerank --model={model} --input_file=CANDIDATES.jsonl"
    accumulates = True
    args: TrainRerankerArgs

    def __init__(self, args: TrainRerankerArgs, dist: DistContext):
        super().__init__(args, dist)
        self.loss = args.loss or "bce"
        self.data = (
            read_training_data(args.train_file).head(args.max_train_examples)
            if args.do_train and args.train_file
            else None
        )
        self.teacher: Predictor | None = None
        self.teacher_outputs: np.ndarray | None = None
        if args.do_train:
            self.spec = check_loss(self.loss, RERANKER_LOSS_TABLE, args)
            if self.spec.teacher:
                self.data = with_transfer(self.data, args.transfer_file, False, args.max_train_examples)
            assert self.data is not None  # --do_train needs a --train_file, or a --transfer_file to distil on
            check_data(self.loss, self.spec, self.data, "bce")
            if self.data.kind == SCORED:
                bad = [s for s in self.data.scores or [] if not 0 <= s <= 1]
                if bad:
                    raise InputError(f"{self.data.source}: score {bad[0]} is not between 0 and 1, as --loss=bce needs")
            elif self.data.kind == PAIRS and not args.mine_negatives:
                raise InputError(
                    f"{self.data.source} holds (query, positive) pairs without negatives: pass --mine_negatives=MODEL "
                    "(a bi-encoder) to mine them, or give negatives in the file"
                )
            if self.spec.teacher:
                self.teacher = teachers.load_teacher(args, "scores")
            self.plan = BatchPlan(self.data, args.train_batch_size, args.seed, no_duplicates=False)
            self.setup_training(self.plan.batches_per_epoch())
        else:
            self.setup_training(0)
        self.eval_data = (
            read_beir(args.eval_file, args.eval_split).head(args.max_eval_examples) if args.eval_file else None
        )
        if self.eval_data is not None and not (args.eval_retriever or args.mine_negatives):
            raise InputError("evaluation reranks a bi-encoder's top results: pass --eval_retriever=MODEL")
        for flag in ("mine_negatives", "eval_retriever"):
            value = getattr(args, flag)
            if value and not Path(value).exists():
                raise InputError(f"--{flag}={value}: no such model directory")
        self.files.config.extra.update(
            id2label={"0": "LABEL_0"}, label2id={"LABEL_0": 0}, max_seq_length=args.max_seq_length
        )

    def model_kwargs(self) -> dict[str, Any]:
        return {"num_labels": 1}

    @classmethod
    def default_metric_of(cls, args: SentenceTrainingArgs) -> str:
        return "eval_ndcg@10"

    def metric_names(self) -> list[str]:
        return [f"eval_{p}{k}" for p in ("", "retriever_") for k in evaluation.RANKING_KEYS]

    def prepare(self) -> None:
        if self.data is None:
            return
        args, data = self.args, self.data
        if data.kind == PAIRS:
            assert args.mine_negatives is not None  # pairs without negatives were refused without it
            data = mine_negatives(
                args.mine_negatives, data, args.num_negatives, args.device, args.eval_batch_size, not self.dist.is_main
            )
            self.data = data
            self.plan.records = data
        if data.kind == SCORED:
            groups = [[(a, b)] for a, b in zip(*data.columns)]
            self.labels = np.asarray(data.scores, dtype=np.float32)[:, None]
        else:
            groups = [[(ex[0], t) for t in ex[1:]] for ex in (data.example(i) for i in range(len(data)))]
            self.labels = np.zeros((len(data), len(groups[0])), dtype=np.float32)
            self.labels[:, 0] = 1.0
        self.group_size = len(groups[0])
        pairs = [p for g in groups for p in g]
        self.sequences = pair_sequences(self.tokenizer, pairs, args.max_seq_length)
        logger.info("%d queries x %d pairs, loss %s", len(data), self.group_size, self.loss)
        if self.teacher is not None:
            examples = [data.example(i) for i in range(len(data))]
            self.teacher_outputs = teachers.group_scores(
                self.teacher, args, examples, teacher_cache_dir(args.teacher_cache_dir, args.output_dir), self.dist
            )
            self.teacher = None  # its outputs are all a run needs: free its memory for training

    def data_state(self, step: int) -> dict[str, Any]:
        return self.plan.state(step)

    def batches(self, start_step: int) -> Iterator[list[dict[str, torch.Tensor]]]:
        """Each step's queries in --gradient_accumulation_steps micro-batches, each with all of its queries'
        pairs: activations are held for one micro-batch's pairs at a time. Under torchrun each process takes
        its share of the step's queries (a reranker's loss has no in-batch terms)."""
        step, k = start_step, self.group_size
        while True:
            idx = self.plan.batch(step)
            micro_batches = []
            own = np.array_split(idx, self.dist.world_size)[self.dist.rank]
            for part in np.array_split(own, self.args.gradient_accumulation_steps):
                rows = (part[:, None] * k + np.arange(k)[None, :]).reshape(-1)  # [b * k], query-major
                batch = self.sequences.collate(rows)
                batch["labels"] = torch.from_numpy(self.labels[part].reshape(-1))
                if self.teacher_outputs is not None:
                    batch["teacher"] = torch.from_numpy(self.teacher_outputs[part])  # [b, k], a copy of mapped rows
                batch["share"] = torch.tensor(len(part) / len(idx))
                micro_batches.append(batch)
            yield micro_batches
            step += 1

    def loss_fn(self) -> Callable:
        args, spec, k = self.args, self.spec, self.group_size

        def fn(model, batch, totals):
            logits = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"]).logits[:, 0]
            # Every loss is a mean over the queries (of equal groups): the shares of the micro-batches of every
            # process add up to it.
            value = spec.value(logits.view(-1, k), batch, args) * batch["share"]  # [b, k]: each query's pairs
            return value, {"loss": value.detach()}

        return fn

    def evaluate(self) -> dict[str, float]:
        args, corpus = self.args, self.eval_data
        retriever_dir = args.eval_retriever or args.mine_negatives
        assert corpus is not None and retriever_dir is not None  # checked with the flags
        retriever = Predictor.from_pretrained(retriever_dir, device=args.device)
        qids, dids = list(corpus.queries), list(corpus.documents)
        hide, size = not self.dist.is_main, args.eval_batch_size
        q = embed_texts(retriever, [corpus.queries[i] for i in qids], "eval: queries", hide, size)
        d = embed_texts(retriever, [corpus.documents[i] for i in dids], "eval: corpus", hide, size)
        top, _ = evaluation.search(q, d, args.rerank_top_k)
        candidates = [[dids[j] for j in row] for row in top]
        relevant = [corpus.qrels[i] for i in qids]
        reranker = Predictor(
            self.model,
            self.tokenizer,
            "BertForSequenceClassification",
            self.dist.device,
            max_seq_length=args.max_seq_length,
            batch_size=args.eval_batch_size,
            source=args.output_dir,
        )
        was_training = self.model.training
        try:
            texts = [[corpus.documents[did] for did in docs] for docs in candidates]
            queries = [corpus.queries[qid] for qid in qids]
            scores = rerank_logits(reranker, queries, texts, "eval: rerank", hide)
        finally:
            self.model.train(was_training)
        out = {
            f"eval_{k}": v
            for k, v in evaluation.ranking_metrics(evaluation.rerank(candidates, scores), relevant).items()
        }
        out.update({f"eval_retriever_{k}": v for k, v in evaluation.ranking_metrics(candidates, relevant).items()})
        return out


def rerank_logits(
    reranker: Predictor,
    queries: Sequence[str],
    candidates: Sequence[Sequence[str]],
    desc: str,
    disable: bool = False,
    batch_size: int | None = None,
) -> list[np.ndarray]:
    """The cross-encoder's logit of each query with each of its candidate documents, the queries taken a block
    at a time (BLOCK_BATCHES batches of pairs), under the progress bar `desc`: memory holds one block's pairs,
    not every query's candidates. Inputs cut to the model's length are warned of once."""
    size = (batch_size or reranker.batch_size) * BLOCK_BATCHES
    out: list[np.ndarray] = []
    with (
        progress(total=len(queries), unit="query", desc=desc, disable=disable) as bar,
        reranker.counting_truncations(LONGER_ADVICE),
    ):
        start = 0
        while start < len(queries):
            stop, pairs = start, 0
            while stop < len(queries) and (stop == start or pairs + len(candidates[stop]) <= size):
                pairs += len(candidates[stop])
                stop += 1
            block = [(queries[i], d) for i in range(start, stop) for d in candidates[i]]
            logits = reranker.classification_logits(block, batch_size)[:, 0]
            for i in range(start, stop):
                out.append(logits[: len(candidates[i])])
                logits = logits[len(candidates[i]) :]
            bar.update(stop - start)
            start = stop
    return out


def train_reranker(args: TrainRerankerArgs) -> dict[str, Any]:
    """Train and/or evaluate a reranker (see the module docstring)."""
    return run_command(RerankerRun, args)
