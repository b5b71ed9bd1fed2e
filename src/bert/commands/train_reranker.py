"""`bert train-reranker`: train a cross-encoder that scores (query, document) pairs.

The data are (query, positive, negatives...) tuples, (query, positive) pairs whose negatives a bi-encoder
mines from the data's documents (`--mine_negatives=MODEL`, skipping the query's own positives), or scored
pairs (scores in 0..1); a BEIR directory gives pairs. Losses (`bert.sentence.losses`): pointwise binary
cross-entropy (`--loss=bce`, every pair labelled 1 for the positive, 0 for a negative, or its score) or
listwise softmax cross-entropy over each query's positive and negatives (`--loss=listwise`), or distillation
from a larger cross-encoder (`--teacher`; its scores of the same groups computed once and cached): its
margins (`--loss=margin_mse`) or its softmax over each query's pairs (`--loss=distill_kl`). Evaluation on a
BEIR split reranks the top `--rerank_top_k` documents of a bi-encoder (`--eval_retriever`) and reports
MRR@10, NDCG@10, Recall@1/10/100 and MAP@100, with the retriever's own beside them (`eval_retriever_*`),
scoring a block of queries' candidates at a time. Training holds one batch's activations, `--train_batch_size`
x (1 + negatives) pairs; `--gradient_accumulation_steps` cuts it into micro-batches of whole queries (each
loss is a mean over queries: the same gradient, in a micro-batch's memory).
The model is saved in transformers' layout (BertForSequenceClassification, one label), which
`sentence_transformers.CrossEncoder` loads, and `bert predict` scores pairs with.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from bert.commands.train_embeddings import SentenceTrainingArgs
from bert.sentence.loss_table import RERANKER_LOSS_TABLE, loss_help


@dataclass(kw_only=True)
class TrainRerankerArgs(SentenceTrainingArgs):
    """Train and evaluate a reranker (cross-encoder); the model is saved in --output_dir/model.
    Resumes from the newest checkpoint in --output_dir."""

    loss: str | None = field(
        default=None,
        metadata={
            "run_defining": "train",
            "help": loss_help(RERANKER_LOSS_TABLE, "bce"),
            "choices": list(RERANKER_LOSS_TABLE),
        },
    )
    mine_negatives: str | None = field(
        default=None,
        metadata={
            "model": True,
            "run_defining": "data",
            "help": "A bi-encoder model directory: mine --num_negatives hard negatives per query from the training "
            "data's documents (the query's own positives skipped).",
        },
    )
    num_negatives: int = field(
        default=4, metadata={"run_defining": "data", "min": 0, "help": "Hard negatives to mine per query."}
    )
    eval_retriever: str | None = field(
        default=None,
        metadata={
            "model": True,
            "help": "The bi-encoder whose top results evaluation reranks (default: --mine_negatives).",
        },
    )
    rerank_top_k: int = field(
        default=100, metadata={"min": 1, "help": "Evaluation reranks this many retrieved documents."}
    )


def run_train_reranker(args: TrainRerankerArgs) -> dict[str, Any]:
    """Train and/or evaluate (see the module docstring); returns the runner's result (its result block is on
    the terminal)."""
    # Imported here, not at the top, so that bert.cli reports a flag error before torch loads.
    from bert.sentence.reranker_run import train_reranker

    return train_reranker(args)
