"""The run of `bert train-embeddings`: `train_embeddings(args)` trains and/or evaluates a bi-encoder
(`BertModel` plus `--pooling` and `--normalize`) on `bert.sentence.runner.SentenceRun`.

Its losses need the whole batch at once, so `--gradient_accumulation_steps` must stay 1: `--loss=cached_mnrl`
gives the large batch in the memory of `--mini_batch_size` sequences instead. Under torchrun every process
embeds the whole batch, except with `--gather_across_devices` (the in-batch losses): each embeds its share of
it and gathers the others' embeddings, differentiably, so that each anchor meets the whole batch's positives
and negatives and the processes' losses add up to the whole batch's. Evaluation scores STS pairs or a BEIR
split, full size and per `--matryoshka_dims` size. The model is exported to `model/` in the native layout
with the sentence-transformers files (`bert.sentence.st_format`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F

from bert.batching import BatchPlan
from bert.distributed import DistContext
from bert.errors import InputError
from bert.flags import check_batch_division, teacher_cache_dir
from bert.inference import Predictor, SentenceTransformersConfig, read_sentence_transformers_config
from bert.modeling import SENTENCE_POOLINGS, BertModel, first_token, pool_tokens
from bert.sentence import evaluation, losses, teachers
from bert.sentence.data import SCORED, TEXTS, Corpus, TrainingData, read_beir, read_training_data, unique_texts
from bert.sentence.loss_table import EMBEDDING_LOSS_TABLE, LossSpec, check_data, check_loss, with_transfer
from bert.sentence.runner import SentenceRun, embed_texts, run_command, single_sequences
from bert.sentence.st_format import sentence_transformers_files

if TYPE_CHECKING:
    from bert.commands.train_embeddings import SentenceTrainingArgs, TrainEmbeddingsArgs

logger = logging.getLogger(__name__)

# A batch's columns (anchors, positives, negatives) are embedded in one pass when padding them all to the longest
# makes at most this many times the tokens of their own paddings (`embed_columns`).
STACK_PADDING = 1.25


def parse_dims(value: str | None, hidden_size: int) -> list[int]:
    """`--matryoshka_dims` as a descending list of sizes (each at most the hidden size)."""
    if not value:
        return []
    try:
        dims = sorted({int(x) for x in value.split(",") if x.strip()}, reverse=True)
    except ValueError:
        raise InputError(
            f"--matryoshka_dims={value}: expected sizes separated by commas, e.g. 384,256,128,64"
        ) from None
    bad = [d for d in dims if not 0 < d <= hidden_size]
    if bad:
        raise InputError(f"--matryoshka_dims={value}: {bad[0]} is not between 1 and the hidden size {hidden_size}")
    return dims


class EmbeddingRun(SentenceRun):
    command = "train-embeddings"
    model_class = BertModel
    next_command = "bert embed --model={model} --input_file=TEXTS.txt"
    args: TrainEmbeddingsArgs

    def model_kwargs(self) -> dict[str, Any]:
        # Pooling reads the last layer; an untrained pooler would have no optimizer state to resume.
        return {"add_pooling_layer": False}

    def __init__(self, args: TrainEmbeddingsArgs, dist: DistContext):
        super().__init__(args, dist)
        st = None
        # The model the weights come from sets the default pooling and normalisation.
        start = args.teacher if args.init_from_teacher_layers else args.init_checkpoint
        if start and Path(start).is_dir():
            st = read_sentence_transformers_config(start)
        self.pooling = args.pooling or (st.pooling if st is not None and st.pooling else "mean")
        self.normalize = args.normalize if args.normalize is not None else (st.normalize if st is not None else False)
        if self.pooling not in SENTENCE_POOLINGS:
            raise InputError(f"--pooling={self.pooling} must be one of {', '.join(SENTENCE_POOLINGS)}")
        self.dims = parse_dims(args.matryoshka_dims, self.files.config.hidden_size)
        self.files.config.extra["max_seq_length"] = args.max_seq_length
        self.eval_data = (
            _read_eval(args.eval_file, args.eval_split).head(args.max_eval_examples) if args.eval_file else None
        )
        self.data = (
            read_training_data(args.train_file).head(args.max_train_examples)
            if args.do_train and args.train_file
            else None
        )
        self.scores: np.ndarray | None = None
        self.teacher_outputs: np.ndarray | None = None
        self.teacher: Predictor | None = None
        if not args.do_train:
            if args.gather_across_devices:
                raise InputError("--gather_across_devices is for training: add --do_train=true or remove it")
            self.loss = args.loss
            self.setup_training(0)
            return
        kind = self.data.kind if self.data is not None else TEXTS
        self.loss = args.loss or ("mse" if args.teacher else "cosent" if kind == SCORED else "mnrl")
        self.spec = check_loss(self.loss, EMBEDDING_LOSS_TABLE, args)
        if self.spec.teacher:
            self.data = with_transfer(
                self.data, args.transfer_file, self.spec.teacher == "embeddings", args.max_train_examples
            )
        assert self.data is not None  # --do_train needs a --train_file, or a --transfer_file to distil on
        check_data(self.loss, self.spec, self.data, "cosent or cosine_mse")
        if args.gather_across_devices:
            _check_gather(self.loss, self.spec, args.train_batch_size, dist)
        if self.spec.cached and args.precision == "fp16":
            raise InputError(f"--loss={self.loss} computes its own backward pass: use --precision=bf16 or fp32")
        if self.spec.teacher == "embeddings":
            self.teacher = teachers.load_teacher(args, "embeddings", self.files.config.hidden_size)
        elif self.spec.teacher == "similarities":
            self.teacher = teachers.load_teacher(args, "similarities")
        if self.data.kind == SCORED:
            self.scores = np.asarray(self.data.scores, dtype=np.float32) / args.score_scale
        self.plan = BatchPlan(self.data, args.train_batch_size, args.seed, no_duplicates=self.spec.in_batch)
        self.setup_training(self.plan.batches_per_epoch())

    @classmethod
    def default_metric_of(cls, args: SentenceTrainingArgs) -> str:
        # Scored pairs are ranked by correlation, a BEIR split by retrieval.
        return "eval_ndcg@10" if args.eval_file is None or _is_beir(args.eval_file) else "eval_spearman"

    def metric_names(self) -> list[str]:
        keys = evaluation.STS_KEYS if isinstance(self.eval_data, TrainingData) else evaluation.RANKING_KEYS
        prefixes = ["", *(f"dim{d}_" for d in self.dims if d < self.files.config.hidden_size)]
        return [f"eval_{p}{k}" for p in prefixes for k in keys]

    def prepare(self) -> None:
        if self.data is None:
            return
        texts, self.rows = unique_texts(self.data.columns)
        self.sequences = single_sequences(self.tokenizer, texts, self.args.max_seq_length)
        logger.info(
            "%d examples (%s), %d distinct texts, loss %s", len(self.data), self.data.kind, len(texts), self.loss
        )
        if self.teacher is not None:
            args, cache = self.args, teacher_cache_dir(self.args.teacher_cache_dir, self.args.output_dir)
            if self.spec.teacher == "embeddings":
                self.teacher_outputs = teachers.embeddings(self.teacher, args, self.data.columns[0], cache, self.dist)
            else:
                examples = [self.data.example(i) for i in range(len(self.data))]
                self.teacher_outputs = teachers.group_scores(self.teacher, args, examples, cache, self.dist)
            self.teacher = None  # its outputs are all a run needs: free its memory for training

    def data_state(self, step: int) -> dict[str, Any]:
        return self.plan.state(step)

    def batches(self, start_step: int) -> Iterator[list[dict[str, torch.Tensor]]]:
        step = start_step
        while True:
            idx = self.plan.batch(step)
            batch: dict[str, torch.Tensor] = {}
            if self.args.gather_across_devices:
                # This process's share of the global batch: its rows of the gathered columns are its anchors.
                share = len(idx) // self.dist.world_size
                own = slice(self.dist.rank * share, (self.dist.rank + 1) * share)
                idx = idx[own]
                batch["anchors"] = torch.arange(own.start, own.stop)
            for c, rows in enumerate(self.rows):
                batch.update({f"{k}_{c}": v for k, v in self.sequences.collate(rows[idx]).items()})
            if self.scores is not None:
                batch["scores"] = torch.from_numpy(self.scores[idx])
            if self.teacher_outputs is not None:
                batch["teacher"] = torch.from_numpy(self.teacher_outputs[idx])  # a copy of the memory-mapped rows
            yield [batch]
            step += 1

    def loss_fn(self) -> Callable:
        args, spec, dims, pooling, normalize = self.args, self.spec, self.dims, self.pooling, self.normalize
        num_columns = len(self.rows)
        world = self.dist.world_size
        device = self.dist.device

        def embed(model, batch, c: int, rows: slice = slice(None)) -> torch.Tensor:
            ids, mask = batch[f"input_ids_{c}"][rows], batch[f"attention_mask_{c}"][rows]
            positions = first_token(ids) if pooling == "cls" else None  # [CLS] pooling reads nothing else
            out = model(ids, mask, batch[f"token_type_ids_{c}"][rows], output_positions=positions)
            vectors = pool_tokens(out.sequence_output, mask, pooling)
            return torch.nn.functional.normalize(vectors, p=2, dim=-1) if normalize else vectors

        def of_embeddings(embeddings: list[torch.Tensor], batch) -> torch.Tensor:
            """This process's 1/world share of the global batch's loss (the Trainer and cached_mnrl_backward
            sum the shares over processes): the whole batch's loss, which every process computes, or under
            --gather_across_devices the mean over its own anchors of every process's rows."""
            if "anchors" in batch:
                embeddings = [self.dist.all_gather_rows(e) for e in embeddings]
            return losses.matryoshka(lambda e: spec.value(e, batch, args), embeddings, dims) / world

        def fn(model, batch, totals):
            if spec.cached:
                n = batch["input_ids_0"].shape[0]
                no_sync = getattr(model, "no_sync", None)
                value = losses.cached_mnrl_backward(
                    lambda c, rows: embed(model, batch, c, rows),
                    n,
                    num_columns,
                    args.mini_batch_size,
                    lambda e: of_embeddings(e, batch),
                    device,
                    grad_scale=world,
                    no_sync=no_sync,
                )
                # The gradients are in place already; the Trainer's backward pass on a leaf adds nothing.
                return value.requires_grad_(), {"loss": value}
            value = of_embeddings(embed_columns(lambda b, c: embed(model, b, c), batch, num_columns), batch)
            return value, {"loss": value.detach()}

        return fn

    def evaluate(self) -> dict[str, float]:
        st = SentenceTransformersConfig(self.pooling, self.normalize, self.args.max_seq_length)
        predictor = Predictor(
            self.model,
            self.tokenizer,
            "BertModel",
            self.dist.device,
            max_seq_length=self.args.max_seq_length,
            batch_size=self.args.eval_batch_size,
            has_pooler=False,
            sentence_transformers=st,
            source=self.args.output_dir,
        )
        was_training = self.model.training
        assert self.eval_data is not None  # checked with the flags
        try:
            return evaluate_embeddings(predictor, self.eval_data, self.dims, disable=not self.dist.is_main)
        finally:
            self.model.train(was_training)

    def export_files(self) -> dict[str, Any]:
        return sentence_transformers_files(
            self.pooling, self.normalize, self.args.max_seq_length, self.files.config.hidden_size
        )


def embed_columns(embed: Callable[[dict, int], torch.Tensor], batch: dict, num_columns: int) -> list[torch.Tensor]:
    """Every column's embeddings, `embed(batch, c)` being column c's; from one pass over the columns stacked (each
    padded to the longest) where that pads at most `STACK_PADDING` times the tokens of the columns' own passes: one
    pass of larger GEMMs and one embedding gradient where each column's pass made its own (1.11x-1.12x a training
    step of 16 STS-B pairs on the CPU, bench/RESULTS.md; short queries stacked over 128-token passages: 0.97x, run
    apart)."""
    shapes = [batch[f"input_ids_{c}"].shape for c in range(num_columns)]
    longest = max(T for _, T in shapes)
    if sum(B for B, _ in shapes) * longest > STACK_PADDING * sum(B * T for B, T in shapes):
        return [embed(batch, c) for c in range(num_columns)]
    stacked = {
        f"{name}_0": torch.cat([F.pad(batch[f"{name}_{c}"], (0, longest - shapes[c][1])) for c in range(num_columns)])
        for name in ("input_ids", "attention_mask", "token_type_ids")
    }
    return list(embed(stacked, 0).split([B for B, _ in shapes]))


def _check_gather(loss: str, spec: LossSpec, train_batch_size: int, dist: DistContext) -> None:
    """--gather_across_devices: an in-batch loss, under torchrun, a global batch the processes share equally."""
    if not spec.in_batch:
        raise InputError(
            f"--gather_across_devices shares in-batch negatives, which --loss={loss} has none of: remove it or use "
            f"--loss={', '.join(n for n, s in EMBEDDING_LOSS_TABLE.items() if s.in_batch)}"
        )
    if not dist.distributed:
        raise InputError(
            "--gather_across_devices gathers the batch of every torchrun process; this run is one process: remove "
            "it, or start the run with torchrun --nproc_per_node=N"
        )
    check_batch_division(train_batch_size, dist.world_size, 1)


def _is_beir(eval_file: str) -> bool:
    """Whether --eval_file names a BEIR directory (else a file of scored pairs)."""
    return Path(eval_file).is_dir()


def _read_eval(path: str, split: str) -> TrainingData | Corpus:
    if _is_beir(path):
        return read_beir(path, split)
    data = read_training_data(path)
    if data.kind != SCORED:
        raise InputError(f"--eval_file={path}: expected scored pairs (STS) or a BEIR directory, got {data.kind}")
    return data


def evaluate_embeddings(
    predictor: Predictor, data: TrainingData | Corpus, dims: list[int], disable: bool = False
) -> dict[str, float]:
    """STS correlations (scored pairs) or retrieval metrics (a BEIR split), full size and per Matryoshka
    dimension, keys prefixed `eval_`; `disable` hides the progress bars (ranks other than the first)."""
    full = predictor.config.hidden_size
    if isinstance(data, TrainingData):
        a = embed_texts(predictor, data.columns[0], "eval: first texts", disable)
        b = embed_texts(predictor, data.columns[1], "eval: second texts", disable)

        def sts(d: int | None) -> dict[str, float]:
            return evaluation.sts_metrics(evaluation.truncate(a, d), evaluation.truncate(b, d), data.scores or [])

        scores = evaluation.per_dimension(sts, dims, full)
    else:
        qids, dids = list(data.queries), list(data.documents)
        q = embed_texts(predictor, [data.queries[i] for i in qids], "eval: queries", disable)
        docs = embed_texts(predictor, [data.documents[i] for i in dids], "eval: corpus", disable)
        relevant = [data.qrels[i] for i in qids]

        def retrieval(d: int | None) -> dict[str, float]:
            return evaluation.retrieval_metrics(evaluation.truncate(q, d), evaluation.truncate(docs, d), dids, relevant)

        scores = evaluation.per_dimension(retrieval, dims, full)
    return {f"eval_{k}": v for k, v in scores.items()}


def train_embeddings(args: TrainEmbeddingsArgs) -> dict[str, Any]:
    """Train and/or evaluate a sentence-embedding model (see the module docstring)."""
    return run_command(EmbeddingRun, args)
