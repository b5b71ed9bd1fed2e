"""`bert train-embeddings`: train a sentence-embedding model (a bi-encoder), as sentence-transformers does.

From any BERT this project loads (`--init_checkpoint`: TF, transformers, native or a sentence-transformers
directory, whose pooling and normalisation are the defaults), on pairs, (anchor, positive, negatives...)
tuples or scored pairs in JSON lines or TSV, or a BEIR directory (`--train_file`; formats in
`bert.sentence.data`), with the losses of `bert.sentence.losses` (`--loss`, default mnrl for pairs and
tuples, cosent for scored pairs; `--matryoshka_dims` wraps any of them). Distillation from a teacher
(`--teacher`, its outputs computed once and cached, `bert.sentence.teachers`): `--loss=mse` regresses the
embeddings on an embedding model's, on any text (every text of the training file and of `--transfer_file`,
which may be plain text, one text a line); `--loss=margin_mse` and `distill_kl` learn a cross-encoder's
scores (or an embedding model's cosines) of (query, positive, negatives...) tuples with dot products.
Evaluation (`--eval_file`): STS Pearson/Spearman of cosine on scored pairs, or retrieval on a BEIR split
(MRR@10, NDCG@10, Recall@1/10/100, MAP@100), per Matryoshka dimension. The runner
(`bert.sentence.embedding_run`) resumes, checkpoints, logs `metrics.jsonl` and exports `model/`: a directory
`bert embed` and `sentence_transformers.SentenceTransformer` both load, giving the same vectors.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from bert.flags import (
    DistillArgs,
    FinetuneArgs,
    ModelArgs,
    OptimizerArgs,
    TrainingArgs,
    same_as,
)
from bert.sentence.loss_table import EMBEDDING_LOSS_TABLE, loss_help


@dataclass(kw_only=True)
class SentenceTrainingArgs(ModelArgs, TrainingArgs, DistillArgs):
    """The flags `bert train-embeddings` and `bert train-reranker` share."""

    train_file: str | None = field(
        default=None,
        metadata={
            "run_defining": "data",
            "help": "Training data: .jsonl or .tsv of (anchor, positive[, negatives...]) or (text, text, score), or "
            "a BEIR directory (corpus.jsonl, queries.jsonl, qrels/train.tsv).",
        },
    )
    eval_file: str | None = field(
        default=None,
        metadata={"help": "Evaluation data: scored pairs (STS), or a BEIR directory (its --eval_split qrels)."},
    )
    eval_split: str = field(
        default="dev", metadata={"help": "The qrels split of a BEIR --eval_file (qrels/<split>.tsv)."}
    )
    # The release's grid (`bert.grid`), as the fine-tuning commands run it: these three take comma lists.
    train_batch_size: int = same_as(FinetuneArgs, "train_batch_size")
    learning_rate: float = same_as(FinetuneArgs, "learning_rate")
    num_train_epochs: float = same_as(FinetuneArgs, "num_train_epochs")
    grid_jobs: int = same_as(FinetuneArgs, "grid_jobs")
    max_train_examples: int = same_as(FinetuneArgs, "max_train_examples")
    max_eval_examples: int = same_as(FinetuneArgs, "max_eval_examples")
    warmup_proportion: float = same_as(FinetuneArgs, "warmup_proportion")
    eval_every_steps: int = same_as(FinetuneArgs, "eval_every_steps")
    early_stopping_patience: int = same_as(FinetuneArgs, "early_stopping_patience")
    metric_for_best_model: str | None = same_as(FinetuneArgs, "metric_for_best_model")
    keep_checkpoint_max: int = same_as(FinetuneArgs, "keep_checkpoint_max")
    log_every: int = same_as(FinetuneArgs, "log_every")
    # No original command to follow: the defaults of sentence-transformers' trainer (torch's AdamW, no weight
    # decay), which these commands' users compare against; the original's optimizer lost 0.035 STS-B Spearman
    # to it from all-MiniLM-L6-v2 (bench/RESULTS.md).
    optimizer: str = same_as(OptimizerArgs, "optimizer", default="adamw")
    weight_decay: float = same_as(OptimizerArgs, "weight_decay", default=0.0)
    # The sentence distillation losses are sentence-transformers' (MSELoss, MarginMSELoss, DistillKLDivLoss):
    # the teacher's outputs alone, no label term.
    distill_alpha: float = same_as(DistillArgs, "distill_alpha", default=1.0)


@dataclass(kw_only=True)
class TrainEmbeddingsArgs(SentenceTrainingArgs):
    """Train and evaluate a sentence-embedding model (bi-encoder); the model is saved in --output_dir/model
    as a sentence-transformers directory. Resumes from the newest checkpoint in --output_dir."""

    loss: str | None = field(
        default=None,
        metadata={
            "run_defining": "train",
            "help": loss_help(EMBEDDING_LOSS_TABLE, "mnrl, cosent for scored pairs, mse with --teacher"),
            "choices": list(EMBEDDING_LOSS_TABLE),
        },
    )
    pooling: str | None = field(
        default=None,
        metadata={
            "run_defining": "model",
            "help": "mean, cls or max over the last layer. Default: the --init_checkpoint (or, with "
            "--init_from_teacher_layers, --teacher) sentence-transformers directory's, else mean.",
        },
    )
    normalize: bool | None = field(
        default=None,
        metadata={
            "run_defining": "model",
            "help": "Scale the embeddings to unit length. Default: as the --init_checkpoint (or, with "
            "--init_from_teacher_layers, --teacher) sentence-transformers directory, else false.",
        },
    )
    matryoshka_dims: str | None = field(
        default=None,
        metadata={
            "run_defining": "train",
            "help": "Matryoshka: the loss is summed over the embeddings cut to each of these sizes (e.g. "
            "384,256,128,64), and evaluation reports each.",
        },
    )
    mini_batch_size: int = field(
        default=32,
        metadata={"min": 1, "help": "cached_mnrl: sequences per forward/backward pass (the memory it needs)."},
    )
    gather_across_devices: bool = field(
        default=False,
        metadata={
            "help": "Under torchrun, with the in-batch losses (mnrl, mnrl_symmetric and their cached_ forms): "
            "--train_batch_size is split over the processes and each anchor is compared with every process's "
            "positives and negatives, as one process with the whole batch would (sentence-transformers' "
            "gather_across_devices); without it every process embeds the whole batch. An error in one process."
        },
    )
    score_scale: float = field(
        default=1.0,
        metadata={
            "run_defining": "train",
            "positive": True,
            "help": "Scored pairs: divide the scores by this (5 for STS-B's 0..5, so cosine_mse targets 0..1).",
        },
    )


def run_train_embeddings(args: TrainEmbeddingsArgs) -> dict[str, Any]:
    """Train and/or evaluate (see the module docstring); returns the runner's result (its result block is on
    the terminal)."""
    # Imported here, not at the top, so that bert.cli reports a flag error before torch loads.
    from bert.sentence.embedding_run import train_embeddings

    return train_embeddings(args)
