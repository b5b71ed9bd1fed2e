"""The `--loss` choices of `bert train-embeddings` and `bert train-reranker`, as a table of what each needs
(the flags' choices are its names; torch-free until a loss is computed).

Each `LossSpec` says which kinds of training data a loss reads, its value on a batch (the functions of
`bert.sentence.losses`), whether it learns a teacher's outputs and whether it compares each example with the
whole batch (so no text may appear twice in one). `check_loss` and `check_data` refuse a loss without what
it needs, and flags it would ignore; `with_transfer` joins `--transfer_file`'s examples to a distillation
run's training data.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from bert.errors import InputError
from bert.flags import DistillArgs
from bert.sentence.data import PAIRS, SCORED, TEXTS, TUPLES, TrainingData, read_training_data

if TYPE_CHECKING:
    import torch


class _Losses:
    """`bert.sentence.losses`, imported when a loss is first computed: the commands' `--loss` choices are this
    table's names, and parsing a command's flags loads no torch."""

    def __getattr__(self, name: str) -> Any:
        # Here, not at the top: see the class docstring.
        from bert.sentence import losses as module

        return getattr(module, name)


losses = _Losses()


# What a loss's teacher must be (`LossSpec.teacher`), by what it gives (`bert.sentence.teachers.load_teacher`).
TEACHERS = {
    "embeddings": "an embedding model",
    "scores": "a cross-encoder",
    "similarities": "a cross-encoder or an embedding model",
}


@dataclass(frozen=True)
class LossSpec:
    """A `--loss`: what it trains on and its value on a batch.

    needs: the kinds of training data it reads (`bert.sentence.data`: PAIRS, TUPLES, SCORED, TEXTS).
    value: `(outputs, batch, args) -> loss`, the outputs being the columns' embeddings ([B, H] each) of
        `bert train-embeddings`, or the logits of each query's pairs ([B, group]) of `bert train-reranker`;
        `batch["scores"]` holds scored pairs' scores, `batch["labels"]` the reranker's 0/1 or soft labels,
        `batch["teacher"]` the teacher's outputs.
    teacher: None, or what `--teacher` gives for each example: "embeddings" (an embedding model's vector of
        the text), "scores" (a cross-encoder's logit of each (query, document) of the group) or "similarities"
        (a cross-encoder's logit or an embedding model's cosine of each): a key of `TEACHERS`.
    in_batch: each example is compared with the whole batch, so no text may appear twice in one.
    cached: gradient caching (`losses.cached_mnrl_backward`).
    help: what it learns, in `--loss`'s help (`loss_help`).
    """

    needs: tuple[str, ...]
    value: Callable[[Any, dict[str, torch.Tensor], Any], torch.Tensor]
    teacher: str | None = None
    in_batch: bool = False
    cached: bool = False
    help: str = field(kw_only=True)


_CACHED = "with gradient caching: large batches in the memory of --mini_batch_size"
EMBEDDING_LOSS_TABLE: dict[str, LossSpec] = {
    # b.get("anchors"): under --gather_across_devices, this process's rows of the gathered batch.
    "mnrl": LossSpec(
        (PAIRS, TUPLES),
        lambda e, b, a: losses.mnrl(e, anchors=b.get("anchors")),
        in_batch=True,
        help="in-batch negatives, plus the file's hard negatives",
    ),
    "mnrl_symmetric": LossSpec(
        (PAIRS, TUPLES),
        lambda e, b, a: losses.mnrl(e, symmetric=True, anchors=b.get("anchors")),
        in_batch=True,
        help="mnrl, and each positive also finds its anchor among the batch's anchors",
    ),
    "cached_mnrl": LossSpec(
        (PAIRS, TUPLES),
        lambda e, b, a: losses.mnrl(e, anchors=b.get("anchors")),
        in_batch=True,
        cached=True,
        help=f"mnrl {_CACHED}",
    ),
    "cached_mnrl_symmetric": LossSpec(
        (PAIRS, TUPLES),
        lambda e, b, a: losses.mnrl(e, symmetric=True, anchors=b.get("anchors")),
        in_batch=True,
        cached=True,
        help=f"mnrl_symmetric {_CACHED}",
    ),
    "cosent": LossSpec(
        (SCORED,),
        lambda e, b, a: losses.cosent(e[0], e[1], b["scores"]),
        help="scored pairs: their cosines ordered as their scores",
    ),
    "cosine_mse": LossSpec(
        (SCORED,),
        lambda e, b, a: losses.cosine_mse(e[0], e[1], b["scores"]),
        help="scored pairs: their cosines regress on their scores",
    ),
    # Any text: every column of the training file and --transfer_file, one column of distinct texts.
    "mse": LossSpec(
        (TEXTS, PAIRS, TUPLES, SCORED),
        lambda e, b, a: losses.mse(e, [b["teacher"]]),
        "embeddings",
        help="distillation from --teacher: the embeddings regress on an embedding model's, on any text: the "
        "training file's and --transfer_file's, which may be one text a line; the same size needed",
    ),
    "margin_mse": LossSpec(
        (TUPLES,),
        lambda e, b, a: losses.margin_mse(losses.dot_scores(e), b["teacher"]),
        teacher="similarities",
        help="distillation from a cross-encoder --teacher (or a larger embedding model's cosines): the dot "
        "products of (query, positive, negatives...) tuples learn its score margins",
    ),
    "distill_kl": LossSpec(
        (TUPLES,),
        lambda e, b, a: losses.distill_kl(losses.dot_scores(e), b["teacher"], a.temperature),
        teacher="similarities",
        help="distillation from a cross-encoder --teacher (or an embedding model's cosines): the softmax of those "
        "dot products learns its scores'",
    ),
}
_FROM_TEACHER = "distillation from a larger cross-encoder (--teacher): "
# Pairs are groups once --mine_negatives has mined their negatives.
RERANKER_LOSS_TABLE: dict[str, LossSpec] = {
    "bce": LossSpec(
        (PAIRS, TUPLES, SCORED),
        lambda g, b, a: losses.pointwise_bce(g.reshape(-1), b["labels"]),
        help="pointwise binary cross-entropy",
    ),
    "listwise": LossSpec(
        (PAIRS, TUPLES),
        lambda g, b, a: losses.listwise_ce(g),
        help="softmax cross-entropy over a query's positive and negatives",
    ),
    "margin_mse": LossSpec(
        (PAIRS, TUPLES),
        lambda g, b, a: losses.margin_mse(g, b["teacher"]),
        teacher="scores",
        help=f"{_FROM_TEACHER}the positive's logit less each negative's learns the teacher's margins",
    ),
    "distill_kl": LossSpec(
        (PAIRS, TUPLES),
        lambda g, b, a: losses.distill_kl(g, b["teacher"], a.temperature),
        teacher="scores",
        help=f"{_FROM_TEACHER}the softmax over a query's pairs learns the teacher's",
    ),
}


def loss_help(table: dict[str, LossSpec], default: str) -> str:
    """`--loss`'s help: each loss of `table` with what it learns, then what `default` says."""
    return "; ".join(f"{name} ({spec.help})" for name, spec in table.items()) + f". Default: {default}."


_HOLDS = {
    PAIRS: "(anchor, positive) pairs",
    TUPLES: "(anchor, positive, negatives...) tuples",
    SCORED: "scored pairs",
    TEXTS: "texts",
}


def _default(args: DistillArgs, flag: str) -> Any:
    return next(f.default for f in dataclasses.fields(args) if f.name == flag)


def check_loss(name: str, table: dict[str, LossSpec], args: DistillArgs) -> LossSpec:
    """`table[name]`, with the distillation flags it needs; flags it would ignore are errors."""
    spec = table[name]
    if spec.teacher and not args.teacher:
        model = TEACHERS[spec.teacher]
        raise InputError(f"--loss={name} learns a teacher's outputs: pass --teacher=MODEL ({model} directory)")
    if not spec.teacher:
        # Without a distillation loss a teacher only gives the starting layers (--init_from_teacher_layers).
        distill = ", ".join(n for n, s in table.items() if s.teacher)
        if args.teacher and not args.init_from_teacher_layers:
            raise InputError(
                f"--teacher={args.teacher} is for the distillation losses (--loss={distill}) or "
                f"--init_from_teacher_layers, not --loss={name} alone"
            )
        args.check_outputs_learned(f"--loss={name}; the distillation losses are --loss={distill}")
    if name != "distill_kl" and args.temperature != _default(args, "temperature"):
        raise InputError(f"--temperature={args.temperature} is for --loss=distill_kl; remove it or change --loss")
    if args.distill_alpha != _default(args, "distill_alpha"):
        raise InputError(
            f"--distill_alpha={args.distill_alpha}: these losses learn the teacher's outputs alone, as "
            "sentence-transformers' do; leave it at 1"
        )
    return spec


def check_data(name: str, spec: LossSpec, data: TrainingData, scored_losses: str) -> None:
    """The training data `--loss=name` reads; `scored_losses`: the losses to suggest for scored pairs."""
    if data.kind not in spec.needs:
        needs = " or ".join(_HOLDS[k] for k in spec.needs)
        hint = f" (use --loss={scored_losses})" if data.kind == SCORED else ""
        raise InputError(f"--loss={name} needs {needs}; {data.source} holds {_HOLDS[data.kind]}{hint}")


def with_transfer(data: TrainingData | None, transfer_file: str | None, texts: bool, limit: int = 0) -> TrainingData:
    """The examples a distillation run trains on: the training file's and the first `limit` (0: all) of
    `--transfer_file`'s (read as training files are; the teacher labels both). `texts`: every distinct text of
    both, one column (for a loss on texts); else the examples of both, of one shape."""
    transfer = read_training_data(transfer_file).head(limit) if transfer_file else None
    parts = [d for d in (data, transfer) if d is not None]
    if not parts:
        raise InputError("distillation needs examples: pass --train_file and/or --transfer_file")
    source = " and ".join(d.source for d in parts)
    if texts:
        return TrainingData(source, [list(dict.fromkeys(t for d in parts for column in d.columns for t in column))])
    if data is None or transfer is None:
        return parts[0]
    if (transfer.kind, len(transfer.columns)) != (data.kind, len(data.columns)):
        raise InputError(
            f"--transfer_file={transfer_file} holds {_HOLDS[transfer.kind]} of {len(transfer.columns)} texts, "
            f"--train_file={data.source} {_HOLDS[data.kind]} of {len(data.columns)}: give both the same shape"
        )
    scores = data.scores + transfer.scores if data.scores is not None and transfer.scores is not None else None
    return TrainingData(source, [a + b for a, b in zip(data.columns, transfer.columns)], scores)
