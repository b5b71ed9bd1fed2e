"""What the runs of `bert train-embeddings` (a bi-encoder, `bert.sentence.embedding_run`) and
`bert train-reranker` (a cross-encoder, `bert.sentence.reranker_run`) share: `SentenceRun`, their flag checks,
the token sequences of texts and pairs, embedding texts a block at a time, hard-negative mining, and
`run_command`, which runs either in its output directory and prints its result block.

Both follow the fine-tuning runner (`bert.finetune`): flags, model files and data are checked before the
output directory is written to; `bert.training.Trainer` steps with the original optimizer and schedule,
checkpoints and resumes exactly, writes `metrics.jsonl`; `--eval_every_steps=N` scores the evaluation data
every N steps and at the last, keeps the best checkpoint (`--metric_for_best_model`) and exports it;
`--do_eval` writes the final scores to `eval_results.txt`/`.json`; `curves.png` is drawn at the end.

Batches. Each epoch is a permutation of the examples seeded by `(--seed, epoch)`, cut into batches of
`--train_batch_size` (`bert.batching.BatchPlan`; with the in-batch-negative losses no text appears
twice in a batch). Sequences are `[CLS] text [SEP]` (pairs for the reranker: `[CLS] query [SEP] document
[SEP]`, the longer text cut first), padded per column to its longest.
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

from bert import checkpointing, evaluations, grid, run_dir, training
from bert.cpu_kernels import release_packed_weights
from bert.distributed import DistContext, distributed
from bert.errors import InputError
from bert.evaluations import EVAL_HISTORY_NAME, EvalHistory
from bert.flags import check_batch_division, check_flag_values
from bert.formats.results import write_results
from bert.inference import Predictor
from bert.modeling import BertModel, BertPreTrainedModel, num_parameters
from bert.run_dir import MODEL_DIR
from bert.sentence import evaluation
from bert.sentence.data import TrainingData
from bert.starting_model import resolve_starting_model
from bert.tasks.common import num_warmup_steps, pad_2d
from bert.tasks.glue import InputExample, convert_examples_to_features
from bert.tokenization import FullTokenizer
from bert.utils import format_scores, print_result, progress

if TYPE_CHECKING:
    from bert.commands.train_embeddings import SentenceTrainingArgs, TrainEmbeddingsArgs
    from bert.commands.train_reranker import TrainRerankerArgs

logger = logging.getLogger(__name__)

STATE_NAME = "sentence_state.json"  # in model/: the step its weights come from

# Batches of texts embedded, or of pairs scored, per call of the model: a progress bar moves between calls,
# and memory holds one block's sequences and outputs, never those of a whole corpus or of every query's
# candidates at once.
BLOCK_BATCHES = 16


# ------------------------------------------------------------------------------------------- checks
def check_common(args: SentenceTrainingArgs, accumulates: bool = False, world_size: int = 1) -> None:
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


class SentenceRun:
    """What both commands share: checks, model files, the training loop with evaluations, the export."""

    args: TrainEmbeddingsArgs | TrainRerankerArgs

    command = ""
    model_class: type[BertPreTrainedModel] = BertModel
    next_command = ""  # the result block's next step, `{model}` the exported model
    # The loss is a mean over independent queries: a batch may be split over processes and micro-batches.
    accumulates = False
    loss: str | None  # the --loss the run uses, a default resolved (set by each command's run; None: no training)

    def __init__(self, args: TrainEmbeddingsArgs | TrainRerankerArgs, dist: DistContext):
        check_common(args, self.accumulates, dist.world_size)
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
        self.metric = args.metric_for_best_model or self.default_metric_of(args)
        self.history = EvalHistory(self.output_dir / EVAL_HISTORY_NAME, self.metric, args.early_stopping_patience)

    @classmethod
    def default_metric_of(cls, args: SentenceTrainingArgs) -> str:
        """The score that ranks the checkpoints of a run and the cells of a grid without --metric_for_best_model."""
        raise NotImplementedError

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
        model, self.global_step, self.state = files.build(
            self.model_class, args, self.exported, STATE_NAME, **self.model_kwargs()
        )
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


def print_run_result(cls: type[SentenceRun], result: dict[str, Any]) -> None:
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


def run_command(cls: type[SentenceRun], args: TrainEmbeddingsArgs | TrainRerankerArgs) -> dict[str, Any]:
    """Run the command in its output directory and print its result block; comma lists of the grid flags run a
    grid of such runs ranked on --eval_file instead (`bert.grid.run_grid`, which returns its own summary)."""
    inputs = {"--train_file": args.train_file, "--eval_file": args.eval_file, "--init_checkpoint": args.init_checkpoint}
    inputs.update({"--vocab_file": args.vocab_file, "--bert_config_file": args.bert_config_file})
    inputs.update({"--teacher": args.teacher, "--transfer_file": args.transfer_file})
    cells = grid.expand(args, "do_eval")
    if cells is not None:
        for cell in cells:  # every run's flags checked before the first starts
            check_common(cell.args, cls.accumulates)
        metric = args.metric_for_best_model or cls.default_metric_of(args)
        return grid.run_grid(args, cells, cls.command, metric, inputs, run_dir.RESULT_NAMES, MODEL_DIR)
    with distributed(args.device) as dist:
        with run_dir.claim_output_dir(args.output_dir, cls.command, dist, inputs):
            run = cls(args, dist)
            with run_dir.run_directory(args.output_dir, cls.command, args, dist):
                result = run.run()
    if dist.is_main:
        print_run_result(cls, result)
    return result


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
