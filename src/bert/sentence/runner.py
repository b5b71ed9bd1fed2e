"""The runs of `bert train-embeddings` (a bi-encoder) and `bert train-reranker` (a cross-encoder):
`train_embeddings(args)` and `train_reranker(args)`.

Both follow the fine-tuning runner (`bert.finetune`): flags, model files and data are checked before the
output directory is written to; `bert.training.Trainer` steps with the original optimizer and schedule,
checkpoints and resumes exactly, writes `metrics.jsonl`; `--eval_every_steps=N` scores the evaluation data
every N steps and at the last, keeps the best checkpoint (`--metric_for_best_model`) and exports it;
`--do_eval` writes the final scores to `eval_results.txt`/`.json`; `curves.png` is drawn at the end.

Batches. Each epoch is a permutation of the examples seeded by `(--seed, epoch)`, cut into batches of
`--train_batch_size` (`bert.batching.BatchPlan`; with the in-batch-negative losses no text appears
twice in a batch). Sequences are `[CLS] text [SEP]` (pairs for the reranker: `[CLS] query [SEP] document
[SEP]`, the longer text cut first), padded per column to its longest. The bi-encoder's losses need the
whole batch at once, so its `--gradient_accumulation_steps` must stay 1: `--loss=cached_mnrl` gives the
large batch in the memory of `--mini_batch_size` sequences instead. The reranker's losses are means over
queries, so its batch may be cut into `--gradient_accumulation_steps` micro-batches of whole queries: the
same gradient, in the activations' memory of one micro-batch's pairs (batch x (1 + negatives) / steps).
Under torchrun every process embeds the whole batch, except with `--gather_across_devices` (the in-batch
losses): each embeds its share of it and gathers the others' embeddings, differentiably, so that each anchor
meets the whole batch's positives and negatives and the processes' losses add up to the whole batch's.

The bi-encoder (`BertModel` plus `--pooling` and `--normalize`) is exported to `model/` in the native
layout with the sentence-transformers files (`bert.sentence.st_format`); the reranker
(`BertForSequenceClassification`, one output: the relevance logit) in transformers' layout (`id2label`
with one label), which `sentence_transformers.CrossEncoder` loads.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from bert import checkpointing, evaluations, run_dir, training
from bert.batching import BatchPlan
from bert.cpu_kernels import release_packed_weights
from bert.distributed import DistContext, distributed
from bert.errors import InputError
from bert.evaluations import EVAL_HISTORY_NAME, EvalHistory
from bert.flags import check_batch_division, check_flag_values
from bert.formats.results import write_results
from bert.inference import LONGER_ADVICE, Predictor, SentenceTransformersConfig, read_sentence_transformers_config
from bert.modeling import (
    SENTENCE_POOLINGS,
    BertForSequenceClassification,
    BertModel,
    num_parameters,
    pool_tokens,
)
from bert.run_dir import MODEL_DIR
from bert.sentence import evaluation, losses, teachers
from bert.sentence.data import (
    PAIRS,
    SCORED,
    TEXTS,
    Corpus,
    TrainingData,
    read_beir,
    read_training_data,
    unique_texts,
)
from bert.sentence.loss_table import (
    EMBEDDING_LOSS_TABLE,
    RERANKER_LOSS_TABLE,
    LossSpec,
    check_data,
    check_loss,
    with_transfer,
)
from bert.sentence.st_format import sentence_transformers_files
from bert.starting_model import resolve_starting_model
from bert.tasks.common import num_warmup_steps, pad_2d
from bert.tasks.glue import InputExample, convert_examples_to_features
from bert.tokenization import FullTokenizer
from bert.utils import format_scores, print_result, progress

if TYPE_CHECKING:
    from bert.commands.train_embeddings import TrainEmbeddingsArgs
    from bert.commands.train_reranker import TrainRerankerArgs

logger = logging.getLogger(__name__)

STATE_NAME = "sentence_state.json"  # in model/: the step its weights come from

# Batches of texts embedded, or of pairs scored, per call of the model: a progress bar moves between calls,
# and memory holds one block's sequences and outputs, never those of a whole corpus or of every query's
# candidates at once.
BLOCK_BATCHES = 16


# ------------------------------------------------------------------------------------------- checks
def _check_common(args: Any, accumulates: bool = False, world_size: int = 1) -> None:
    """The flags both commands check; `accumulates`: the losses are means over queries, so that a batch may be
    split over `world_size` processes and cut into --gradient_accumulation_steps micro-batches (the
    reranker's)."""
    if not (args.do_train or args.do_eval):
        raise InputError("nothing to do: pass --do_train=true and/or --do_eval=true")
    args.check_no_tpu()
    check_flag_values(args)  # choices, minimums and finite numbers, from the flags' metadata
    if accumulates:
        check_batch_division(args.train_batch_size, world_size, args.gradient_accumulation_steps)
    elif args.gradient_accumulation_steps != 1:
        raise InputError(
            f"--gradient_accumulation_steps={args.gradient_accumulation_steps}: these losses compare every example "
            "with the whole batch, so it must be 1 (for large batches in little memory use --loss=cached_mnrl "
            "with --mini_batch_size)"
        )
    if args.do_train and args.train_file is None and not args.transfer_file:
        raise InputError("--do_train needs --train_file=PATH (.jsonl, .tsv or a BEIR directory)")
    if args.teacher and not args.do_train and not args.init_from_teacher_layers:
        raise InputError(f"--teacher={args.teacher} teaches a training run: add --do_train=true or remove it")
    if (args.do_eval or args.eval_every_steps) and args.eval_file is None:
        raise InputError("evaluation needs --eval_file=PATH (scored pairs, or a BEIR directory)")
    evaluations.check_early_stopping(args)


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


@dataclass
class Sequences:
    """Token ids of distinct texts (or pairs), and per example column the row of each example."""

    ids: list[list[int]]
    types: list[list[int]]

    def collate(self, rows: np.ndarray) -> dict[str, torch.Tensor]:
        lengths = np.array([len(self.ids[r]) for r in rows])
        T = int(lengths.max())
        mask = (np.arange(T)[None, :] < lengths[:, None]).astype(np.int64)  # [B, T]
        return {
            "input_ids": torch.from_numpy(pad_2d([self.ids[r] for r in rows], T)),
            "attention_mask": torch.from_numpy(mask),
            "token_type_ids": torch.from_numpy(pad_2d([self.types[r] for r in rows], T)),
        }


def single_sequences(tokenizer: FullTokenizer, texts: list[str], max_seq_length: int) -> Sequences:
    """`[CLS] text [SEP]`, the text cut to fit, as `Predictor.embed` and sentence-transformers."""
    cls_id, sep_id = tokenizer.vocab["[CLS]"], tokenizer.vocab["[SEP]"]
    keep = max_seq_length - 2
    ids = [[cls_id, *t[:keep], sep_id] for t in tokenizer.encode_batch(texts)]
    return Sequences(ids, [[0] * len(i) for i in ids])


def pair_sequences(tokenizer: FullTokenizer, pairs: list[tuple[str, str]], max_seq_length: int) -> Sequences:
    """`[CLS] a [SEP] b [SEP]`, cut as run_classifier.py cuts pairs (the features `bert predict` scores)."""
    examples = [InputExample(str(i), a, b, 0.0) for i, (a, b) in enumerate(pairs)]
    features = convert_examples_to_features(examples, [None], max_seq_length, tokenizer, pad=False)
    return Sequences([f.input_ids for f in features], [f.segment_ids for f in features])


# ------------------------------------------------------------------------------------- the shared run
class _Run:
    """What both commands share: checks, model files, the training loop with evaluations, the export."""

    args: TrainEmbeddingsArgs | TrainRerankerArgs

    command = ""
    model_class: type = BertModel
    default_metric = ""
    next_command = ""  # the result block's next step, `{model}` the exported model
    loss: str | None  # the --loss the run uses, a default resolved (set by each command's run; None: no training)

    def __init__(self, args: TrainEmbeddingsArgs | TrainRerankerArgs, dist: DistContext):
        self.args, self.dist = args, dist
        self.output_dir = Path(args.output_dir)
        self.exported = self.output_dir / MODEL_DIR
        # The model the run starts from, as fine-tuning resolves it (the resumed checkpoint's shape checked).
        self.files = resolve_starting_model(args, do_lower_case=args.do_lower_case)
        self.resume_dir = self.files.resume_dir
        self.evaluate_during_training = args.do_train and args.eval_every_steps > 0

    def setup_training(self, num_examples_per_epoch: int) -> None:
        args = self.args
        self.total_steps = int(num_examples_per_epoch * args.num_train_epochs) if args.do_train else 0
        self.warmup_steps = num_warmup_steps(self.total_steps, args.warmup_proportion)
        if args.do_train and self.total_steps < 1:
            raise InputError(
                f"{num_examples_per_epoch} batches per epoch x --num_train_epochs={args.num_train_epochs} gives 0 "
                "training steps; use a smaller batch or more epochs"
            )
        results_of = f"`bert {self.command}` on {args.eval_file}"
        evaluations.check_best_metric(args.metric_for_best_model, self.metric_names(), results_of)
        self.metric = args.metric_for_best_model or self.default_metric
        self.history = EvalHistory(self.output_dir / EVAL_HISTORY_NAME, self.metric, args.early_stopping_patience)

    def metric_names(self) -> list[str]:
        """The keys `evaluate` returns."""
        raise NotImplementedError

    # Subclasses: the model's constructor keywords, the training data, the loss, evaluation, export files.
    def model_kwargs(self) -> dict[str, Any]:
        return {}

    def loss_fn(self) -> Callable:
        raise NotImplementedError

    def batches(self, start_step: int) -> Iterator[list[dict[str, torch.Tensor]]]:
        raise NotImplementedError

    def data_state(self, step: int) -> dict[str, Any]:
        raise NotImplementedError

    def evaluate(self) -> dict[str, float]:
        raise NotImplementedError

    def evaluate_between_steps(self) -> dict[str, float]:
        """`evaluate` during training. Its Predictor packs the weights for inference; the copies are dropped
        after, since the next step changes the weights (`bert.cpu_kernels.release_packed_weights`)."""
        try:
            return self.evaluate()
        finally:
            release_packed_weights(self.model)

    def export_files(self) -> dict[str, Any]:
        return {}

    # The run.
    def load_model(self) -> None:
        args, files = self.args, self.files
        checkpointing.set_seed(args.seed)
        model = self.model_class(files.config, **self.model_kwargs())
        self.global_step, self.state = files.load_weights(model, args, self.exported, STATE_NAME)
        logger.info("%s: %d parameters", type(model).__name__, num_parameters(model))
        self.model = model.to(self.dist.device)
        self.wrapped = training.prepare_model(model, args, self.dist)
        if self.evaluate_during_training:
            self.history.load(self.global_step)

    def run(self) -> dict[str, Any]:
        args = self.args
        vocab_file = self.files.vocab_file
        assert vocab_file is not None  # resolve_starting_model refuses a run without a vocabulary
        self.tokenizer = FullTokenizer(vocab_file, do_lower_case=args.do_lower_case)
        self.prepare()
        self.load_model()
        result: dict[str, Any] = {"output_dir": str(self.output_dir), "num_train_steps": self.total_steps}
        if args.do_train:
            last = self.train()
            if last:
                result["train"] = last
        result["global_step"] = self.global_step
        if args.do_eval:
            scores = {**self.evaluate(), "global_step": self.global_step}
            if self.dist.is_main:
                write_results(self.output_dir, scores)
            result["eval"] = scores
        # The card names the loss the run used, a default included.
        used = dataclasses.replace(args, loss=self.loss)
        run_dir.finish_run(self.output_dir, self.exported, self.command, used, result.get("eval"), self.dist)
        return result

    def prepare(self) -> None:
        """Tokenize the data (after the output directory is claimed and the log file open)."""

    def train(self) -> dict[str, float] | None:
        args, dist = self.args, self.dist
        trainer = training.make_trainer(
            self.model,
            self.wrapped,
            args,
            dist,
            num_train_steps=self.total_steps,
            num_warmup_steps=self.warmup_steps,
            vocab_file=self.files.vocab_file,
            do_lower_case=args.do_lower_case,
            desc=f"{self.command} train",
            keep_checkpoint_max=0 if self.evaluate_during_training else None,
        )
        torch.manual_seed(args.seed + dist.rank)
        if self.state is not None:
            trainer.restore(self.state)
        logger.info("***** Running training *****")
        logger.info("  Batch size = %d", args.train_batch_size)
        logger.info("  Num steps = %d", self.total_steps)
        logger.info("  Warmup steps = %d", self.warmup_steps)
        last = evaluations.train_with_evaluations(
            trainer,
            self.batches,
            self.loss_fn(),
            self.total_steps,
            self.data_state,
            history=self.history if self.evaluate_during_training else None,
            evaluate=lambda step: self.evaluate_between_steps(),
            eval_every_steps=args.eval_every_steps,
            keep_checkpoint_max=args.keep_checkpoint_max,
            checkpoint_info={"command": self.command, "num_train_steps": self.total_steps, "seed": args.seed},
        )
        self.global_step = trainer.global_step
        if self.evaluate_during_training:
            verify = not args.ignore_checkpoint_digest
            self.global_step = self.history.restore_best(self.model, self.output_dir, self.global_step, verify)
        extra = {STATE_NAME: {"command": self.command, "global_step": self.global_step}, **self.export_files()}
        trainer.export_model(self.exported, extra_files=extra)
        logger.info("saved the model of step %d to %s", self.global_step, self.exported)
        return last


# ------------------------------------------------------------------------------------------ bi-encoder
class EmbeddingRun(_Run):
    command = "train-embeddings"
    model_class = BertModel
    next_command = "bert embed --model={model} --input_file=TEXTS.txt"
    args: TrainEmbeddingsArgs

    def model_kwargs(self) -> dict[str, Any]:
        # Pooling reads the last layer; an untrained pooler would have no optimizer state to resume.
        return {"add_pooling_layer": False}

    def __init__(self, args: TrainEmbeddingsArgs, dist: DistContext):
        _check_common(args)
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
        self.eval_data = _read_eval(args.eval_file, args.eval_split) if args.eval_file else None
        self.default_metric = "eval_spearman" if isinstance(self.eval_data, TrainingData) else "eval_ndcg@10"
        self.data = read_training_data(args.train_file) if args.do_train and args.train_file else None
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
            self.data = with_transfer(self.data, args.transfer_file, texts=self.spec.teacher == "embeddings")
        assert self.data is not None  # --do_train needs a --train_file, or a --transfer_file to distil on
        check_data(self.loss, self.spec, self.data, "cosent or cosine_mse")
        if args.gather_across_devices:
            _check_gather(self.loss, self.spec, args.train_batch_size, dist)
        if self.spec.cached and args.precision == "fp16":
            raise InputError(f"--loss={self.loss} computes its own backward pass: use --precision=bf16 or fp32")
        if self.spec.teacher == "embeddings":
            self.teacher = teachers.load_teacher(args, "embeddings", self.files.config.hidden_size)
        elif self.spec.teacher == "scores":
            self.teacher = teachers.load_teacher(args, "scores")
        if self.data.kind == SCORED:
            self.scores = np.asarray(self.data.scores, dtype=np.float32) / args.score_scale
        self.plan = BatchPlan(self.data, args.train_batch_size, args.seed, no_duplicates=self.spec.in_batch)
        self.setup_training(self.plan.batches_per_epoch())

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
            args, cache = self.args, teachers.cache_dir(self.args)
            if self.spec.teacher == "embeddings":
                self.teacher_outputs = teachers.embeddings(self.teacher, args, self.data.columns[0], cache, self.dist)
            else:
                examples = [self.data.example(i) for i in range(len(self.data))]
                self.teacher_outputs = teachers.cross_encoder_scores(self.teacher, args, examples, cache, self.dist)
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
            mask = batch[f"attention_mask_{c}"][rows]
            out = model(batch[f"input_ids_{c}"][rows], mask, batch[f"token_type_ids_{c}"][rows])
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
            value = of_embeddings([embed(model, batch, c) for c in range(num_columns)], batch)
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


def _read_eval(path: str, split: str) -> TrainingData | Corpus:
    if Path(path).is_dir():
        return read_beir(path, split)
    data = read_training_data(path)
    if data.kind != SCORED:
        raise InputError(f"--eval_file={path}: expected scored pairs (STS) or a BEIR directory, got {data.kind}")
    return data


def embed_texts(
    predictor: Predictor, texts: Sequence[str], desc: str, disable: bool = False, batch_size: int | None = None
) -> np.ndarray:
    """`predictor.embed(texts)`, BLOCK_BATCHES batches at a time, under the progress bar `desc`."""
    size = (batch_size or predictor.batch_size) * BLOCK_BATCHES
    parts = []
    with progress(total=len(texts), unit="text", desc=desc, disable=disable) as bar:
        for start in range(0, len(texts), size):
            parts.append(predictor.embed(list(texts[start : start + size]), batch_size=batch_size))
            bar.update(len(parts[-1]))
    return np.concatenate(parts) if parts else predictor.embed([])


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


def eval_lines(scores: dict[str, Any]) -> list[str]:
    """The result block's lines of an evaluation: the full-size scores, then each Matryoshka size's
    (`eval_dim32_*`) and the retriever's alone (`eval_retriever_*`), in the order evaluation gave them."""
    groups: dict[str, dict[str, Any]] = {}
    for key, value in scores.items():
        if key == "global_step":
            continue
        match = re.fullmatch(r"eval_(dim\d+_|retriever_)?(.+)", key)
        prefix, name = (match.group(1) or "", match.group(2)) if match else ("", key)
        groups.setdefault(prefix, {})[name] = value
    labels = {"": "eval", "retriever_": "eval of the retriever alone"}
    return [f"{labels.get(p, f'eval at {p[3:-1]} dims')}: {format_scores(v)}" for p, v in groups.items()]


def print_run_result(cls: type[_Run], result: dict[str, Any]) -> None:
    """The run's result block: the steps, the final evaluation, the files and the command that uses the model."""
    output_dir = Path(result["output_dir"])
    model = output_dir / MODEL_DIR
    print_result(
        cls.command,
        f"global step {result['global_step']} of {result['num_train_steps']}",
        *eval_lines(result.get("eval", {})),
        run_dir.written_line(output_dir),
        f"next: {cls.next_command.format(model=model)}" if model.is_dir() else "",
    )


def train_embeddings(args: TrainEmbeddingsArgs) -> dict[str, Any]:
    """Train and/or evaluate a sentence-embedding model (see the module docstring)."""
    return _run(EmbeddingRun, args)


def _run(cls: type[_Run], args: TrainEmbeddingsArgs | TrainRerankerArgs) -> dict[str, Any]:
    inputs = {"--train_file": args.train_file, "--eval_file": args.eval_file, "--init_checkpoint": args.init_checkpoint}
    inputs.update({"--vocab_file": args.vocab_file, "--bert_config_file": args.bert_config_file})
    inputs.update({"--teacher": args.teacher, "--transfer_file": args.transfer_file})
    with distributed(args.device) as dist:
        with run_dir.claim_output_dir(args.output_dir, cls.command, dist, inputs):
            run = cls(args, dist)
            with run_dir.run_directory(args.output_dir, cls.command, args, dist):
                result = run.run()
    if dist.is_main:
        print_run_result(cls, result)
    return result


# ------------------------------------------------------------------------------------------ reranker
class RerankerRun(_Run):
    command = "train-reranker"
    model_class = BertForSequenceClassification
    next_command = "bert rerank --model={model} --input_file=CANDIDATES.jsonl"
    default_metric = "eval_ndcg@10"
    args: TrainRerankerArgs

    def __init__(self, args: TrainRerankerArgs, dist: DistContext):
        _check_common(args, accumulates=True, world_size=dist.world_size)
        super().__init__(args, dist)
        self.loss = args.loss or "bce"
        self.data = read_training_data(args.train_file) if args.do_train and args.train_file else None
        self.teacher: Predictor | None = None
        self.teacher_outputs: np.ndarray | None = None
        if args.do_train:
            self.spec = check_loss(self.loss, RERANKER_LOSS_TABLE, args)
            if self.spec.teacher:
                self.data = with_transfer(self.data, args.transfer_file, texts=False)
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
        self.eval_data = read_beir(args.eval_file, args.eval_split) if args.eval_file else None
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
            self.teacher_outputs = teachers.cross_encoder_scores(
                self.teacher, args, examples, teachers.cache_dir(args), self.dist
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


def mine_negatives(
    model: str, data: TrainingData, k: int, device: str | None, batch_size: int, disable: bool = False
) -> TrainingData:
    """(anchor, positive) pairs -> (anchor, positive, k negatives): each anchor's nearest texts among the
    data's positives by the bi-encoder `model`, skipping every positive of that anchor."""
    if k < 1:
        raise InputError("--mine_negatives needs --num_negatives of at least 1")
    anchors, positives = data.columns[0], data.columns[1]
    candidates = list(dict.fromkeys(positives))
    own: dict[str, set[str]] = {}
    for a, p in zip(anchors, positives):
        own.setdefault(a, set()).add(p)
    distinct = list(own)
    predictor = Predictor.from_pretrained(model, device=device)
    q = embed_texts(predictor, distinct, "mine negatives: queries", disable, batch_size)
    d = embed_texts(predictor, candidates, "mine negatives: documents", disable, batch_size)
    most = max(len(v) for v in own.values())
    top, _ = evaluation.search(q, d, k + most)
    mined = {}
    for a, row in zip(distinct, top):
        picked = [candidates[j] for j in row if candidates[j] not in own[a]][:k]
        if len(picked) < k:
            raise InputError(f"--mine_negatives: {data.source} has too few distinct documents for {k} negatives")
        mined[a] = picked
    columns = [anchors, positives] + [[mined[a][i] for a in anchors] for i in range(k)]
    logger.info("mined %d hard negatives per query with %s", k, model)
    return TrainingData(data.source, columns)


def train_reranker(args: TrainRerankerArgs) -> dict[str, Any]:
    """Train and/or evaluate a reranker (see the module docstring)."""
    return _run(RerankerRun, args)
