"""`bert pretrain`: masked-LM and next-sentence pre-training (the original's run_pretraining.py).

Same flags and defaults as the original, the same losses (the model's, `bert.modeling.pretraining_losses`),
the same optimizer and schedule (`bert.optimization`), the same evaluation metrics and
`eval_results.txt`. Added: resumable checkpoints with exact data position, gradient accumulation,
bf16/fp16, gradient checkpointing, LAMB, dynamic masking, separate evaluation files, and data
parallelism under `torchrun` (DDP, or FSDP with `--fsdp`).

Data. `--input_file` is a comma-separated list of globs, each matching TFRecord files written by
`create_pretraining_data` (original or ours; read whole into compact arrays) or native dataset
directories (`bert create-pretraining-data --output_format=native`; memory-mapped, better for large
corpora). The records are one stream: every epoch is a permutation of all records drawn from
`(--seed, epoch)`, and a step takes the next `--train_batch_size` records of the stream, crossing
epoch boundaries (the original repeats, shuffles and batches with `drop_remainder`). The position in
the stream (epoch, index) is saved with each checkpoint, so a resumed run sees the same batches as an
uninterrupted one.

Batch sizes. `--train_batch_size` is the *global* batch of one optimizer step, as in the original: it is
split over the `torchrun` processes and then into `--gradient_accumulation_steps` micro-batches, so it
must be divisible by their product. Every micro-batch's loss is normalised by the totals of the global
batch (the sum of masked-LM weights, the number of sequences), so a step's gradient is the gradient of
the original loss over the whole global batch, whatever the number of processes and micro-batches: one
process and N processes give the same loss curve.

Dynamic masking (`--dynamic_masking`): see `bert.pretraining.inputs`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bert.config import BertConfig, resolve_config
from bert.errors import InputError
from bert.flags import (
    SHAPE_NAMES,
    MaskingArgs,
    ModelArgs,
    TrainingArgs,
    check_batch_division,
    check_flag_values,
    same_as,
)
from bert.formats.results import write_results
from bert.formats.tensorboard import EventWriter
from bert.plotting import CURVES_NAME, try_plot
from bert.tokenization import load_vocab
from bert.utils import expand_input_files, format_scores, print_result

if TYPE_CHECKING:
    import torch

    from bert import training
    from bert.checkpoint import Checkpoint
    from bert.modeling import BertForPreTraining
    from bert.training import RecordStream

logger = logging.getLogger(__name__)


@dataclass(kw_only=True)
class PretrainArgs(MaskingArgs, TrainingArgs):
    """Pre-train BERT with the masked-LM and next-sentence objectives (run_pretraining.py).

    Resumes from the newest checkpoint in --output_dir when there is one. Under
    `torchrun --nproc_per_node=N bert pretrain ...` the processes share the global batch.
    """

    input_file: str = field(
        metadata={
            "run_defining": "data",
            "help": "Input TF example files (can be a glob or comma separated), or native dataset directories.",
        }
    )
    bert_config_file: str | None = same_as(ModelArgs, "bert_config_file")
    init_checkpoint: str | None = same_as(ModelArgs, "init_checkpoint")
    vocab_file: str | None = same_as(ModelArgs, "vocab_file")
    max_seq_length: int = same_as(ModelArgs, "max_seq_length")
    num_train_steps: int = field(
        default=100000, metadata={"run_defining": "train", "min": 1, "help": "Number of training steps."}
    )
    num_warmup_steps: int = field(
        default=10000, metadata={"run_defining": "train", "min": 0, "help": "Number of warmup steps."}
    )
    max_eval_steps: int = field(default=100, metadata={"min": 1, "help": "Maximum number of eval steps."})
    optimizer: str = field(
        default="adamw_bert",
        metadata={
            "run_defining": "train",
            "help": "adamw_bert (the original AdamWeightDecayOptimizer) or lamb (for large batches).",
            "choices": ["adamw_bert", "lamb"],
        },
    )
    dynamic_masking: bool = field(
        default=False,
        metadata={"run_defining": "train", "help": "Draw new masked positions for every epoch (needs --vocab_file)."},
    )
    eval_files: str | None = field(
        default=None, metadata={"help": "Evaluate on these files instead of --input_file (globs, comma separated)."}
    )
    fsdp: bool = field(
        default=False, metadata={"help": "Under torchrun, shard the model with FSDP instead of replicating it (DDP)."}
    )


def _check_flags(args: PretrainArgs, world_size: int) -> None:
    """Everything that can be checked from the flags alone, before any file is read."""
    if not args.do_train and not args.do_eval:
        raise InputError("At least one of `do_train` or `do_eval` must be True: pass --do_train and/or --do_eval")
    args.check_no_tpu()
    check_flag_values(args)
    if args.do_train:
        check_batch_division(args.train_batch_size, world_size, args.gradient_accumulation_steps)
    if args.do_eval and args.eval_batch_size % world_size:
        raise InputError(f"--eval_batch_size={args.eval_batch_size} must be divisible by the {world_size} processes")
    if args.do_whole_word_mask and not args.dynamic_masking:
        raise InputError(
            "--do_whole_word_mask applies to --dynamic_masking only (static records keep the masks "
            "create-pretraining-data drew): add --dynamic_masking=true"
        )
    if args.fsdp and world_size == 1:
        logger.warning("--fsdp has no effect in a single process; start with torchrun --nproc_per_node=N")


def run_pretrain(args: PretrainArgs) -> dict[str, Any]:
    """Train and/or evaluate; returns {"global_step", "train": last logged metrics, "eval": results}."""
    # Imported here, not at the top, so that bert.cli reports a flag error before torch loads.
    import torch

    from bert import training
    from bert.checkpoint import read_checkpoint
    from bert.pretraining.inputs import masking_vocab, open_pretraining_data
    from bert.training import RecordStream

    with (
        training.distributed(args.device) as dist,
        training.claim_output_dir(args.output_dir, "pretrain", dist, _inputs(args)),
    ):
        # 1. Flags, vocab, data, config, output directory: all checked before any model is built.
        _check_flags(args, dist.world_size)
        args, beside, init = _with_checkpoint_defaults(args)
        if args.dynamic_masking and not args.vocab_file:
            raise InputError("--dynamic_masking needs --vocab_file (for the [MASK], [CLS] and [SEP] ids)")
        vocab = load_vocab(args.vocab_file) if args.vocab_file else None
        masking = None
        if args.dynamic_masking:
            masking = (args.seed, masking_vocab(vocab, args.vocab_file, args.do_whole_word_mask))
        train_source = open_pretraining_data(
            args.input_file, args.max_seq_length, args.max_predictions_per_seq, args.vocab_file
        )
        eval_source = train_source
        if args.do_eval and args.eval_files:
            eval_source = open_pretraining_data(
                args.eval_files, args.max_seq_length, args.max_predictions_per_seq, args.vocab_file, "--eval_files"
            )
        config = _model_config(args, vocab, train_source.manifests, beside)
        for source in {id(train_source): train_source, id(eval_source): eval_source}.values():
            source.check_ids(config.vocab_size, config.type_vocab_size)
        resume_dir = _resume_dir(args, config)
        if resume_dir is not None:
            init = None
        elif args.init_checkpoint and init is None:
            init = read_checkpoint(args.init_checkpoint, verify=not args.ignore_checkpoint_digest)
        manifests = train_source.manifests
        do_lower_case = bool(manifests[0]["do_lower_case"]) if manifests and "do_lower_case" in manifests[0] else None

        with training.run_directory(args.output_dir, "pretrain", args, dist):
            # 2. The model and the trainer.
            model, state = _load_model(args, config, resume_dir, init)
            wrapped = training.prepare_model(model, args, dist, fsdp=args.fsdp)
            torch.manual_seed(args.seed + dist.rank)  # dropout differs across ranks, as their examples do
            trainer = _make_trainer(args, model, wrapped, dist, do_lower_case)
            stream = RecordStream(len(train_source), args.seed)
            position = _restore(args, trainer, state, stream) if state is not None else 0
            # 3. Training, the exported model, evaluation.
            result: dict[str, Any] = {"output_dir": args.output_dir}
            if args.do_train:
                last = _train(args, trainer, dist, train_source, stream, position, masking)
                if last is not None:
                    result["train"] = last
                trainer.export_model(Path(args.output_dir) / "model")
            result["global_step"] = trainer.global_step
            if args.do_eval:
                result["eval"] = _evaluate(args, wrapped, eval_source, dist, trainer.global_step)
            output_dir = Path(args.output_dir)
            if dist.is_main and (output_dir / training.METRICS_NAME).is_file():
                try_plot([output_dir], output_dir / CURVES_NAME)
            if dist.is_main:
                _print_result(args, result)
            return result


def _print_result(args: PretrainArgs, result: dict[str, Any]) -> None:
    model = Path(args.output_dir) / "model"
    print_result(
        "pretrain",
        f"global step {result['global_step']} of {args.num_train_steps}",
        f"train (last logged): {format_scores(result['train'])}" if "train" in result else "",
        f"eval: {format_scores(result['eval'])}" if "eval" in result else "",
        f"written to {args.output_dir}: model/, checkpoints, metrics.jsonl, log.txt",
        f"next: bert classify --init_checkpoint={model} --task_name=TASK --data_dir=DIR --output_dir=OUT"
        if model.is_dir()
        else "",
    )


def _inputs(args: PretrainArgs) -> dict[str, Any]:
    """The paths the run reads, which --output_dir must not be."""
    inputs: dict[str, Any] = {"--input_file": expand_input_files(args.input_file, directories=True)}
    inputs.update({"--init_checkpoint": args.init_checkpoint, "--vocab_file": args.vocab_file})
    if args.eval_files:
        inputs["--eval_files"] = expand_input_files(args.eval_files, "--eval_files", directories=True)
    return inputs


def _with_checkpoint_defaults(args: PretrainArgs) -> tuple[PretrainArgs, Checkpoint | None, Checkpoint | None]:
    """--vocab_file and --bert_config_file left out come from beside the checkpoint the run starts from: the
    newest one of --output_dir when resuming (--init_checkpoint is then ignored), else --init_checkpoint.

    Returns the flags with --vocab_file filled in, the checkpoint read for that (its config is the default
    of --bert_config_file), and --init_checkpoint when it is that checkpoint (None otherwise)."""
    # Imported here, not at the top, so that bert.cli reports a flag error before torch loads.
    from bert import training
    from bert.checkpoint import read_checkpoint

    resume = training.latest_checkpoint(args.output_dir)
    source = resume if resume is not None else args.init_checkpoint
    if not source or (args.bert_config_file and args.vocab_file):
        return args, None, None
    beside = read_checkpoint(source, verify=not args.ignore_checkpoint_digest)
    args = dataclasses.replace(args, vocab_file=args.vocab_file or beside.vocab_file)
    return args, beside, beside if resume is None else None


def _model_config(
    args: PretrainArgs, vocab: dict[str, int] | None, manifests: list[dict], beside: Checkpoint | None
) -> BertConfig:
    """The config of --bert_config_file (a file, or a shape whose vocab_size comes from the vocab or the
    data) or else of the checkpoint the run starts from, checked against the vocab and --max_seq_length."""
    vocab_entries = max(vocab.values()) + 1 if vocab else None
    if not args.bert_config_file:
        if beside is None or beside.config is None:
            raise InputError(
                f"no model config: pass --bert_config_file=PATH or a shape ({SHAPE_NAMES}), or an --init_checkpoint "
                "with a config beside it"
            )
        config = beside.config
        if vocab_entries is not None:
            config.validate_vocab(vocab_entries, args.vocab_file)
        return _check_length(args, config)
    vocab_size = vocab_entries
    if vocab_size is None and not os.path.exists(args.bert_config_file):
        sizes = {int(m["vocab_size"]) for m in manifests if "vocab_size" in m}
        if len(sizes) != 1:
            raise InputError(
                f"--bert_config_file={args.bert_config_file} names a shape, so its vocab_size comes from the vocab: "
                "pass --vocab_file=PATH"
            )
        vocab_size = sizes.pop()
    config = resolve_config(args.bert_config_file, vocab_size)
    if vocab_entries is not None:
        config.validate_vocab(vocab_entries, args.vocab_file)
    return _check_length(args, config)


def _check_length(args: PretrainArgs, config: BertConfig) -> BertConfig:
    if args.max_seq_length > config.max_position_embeddings:
        raise InputError(
            f"--max_seq_length={args.max_seq_length} exceeds the model's max_position_embeddings="
            f"{config.max_position_embeddings}; use a shorter max_seq_length (and data made with it)"
        )
    return config


def _resume_dir(args: PretrainArgs, config: BertConfig) -> Path | None:
    """The newest checkpoint of --output_dir, checked to be of this shape and optimizer."""
    # Imported here, not at the top, so that bert.cli reports a flag error before torch loads.
    from bert import training

    resume_dir = training.latest_checkpoint(args.output_dir)
    if resume_dir is not None:
        training.check_checkpoint_config(resume_dir, config)
        info_path = resume_dir / training.TRAINER_STATE_NAME
        info = json.loads(info_path.read_text(encoding="utf-8")) if info_path.is_file() else {}
        if args.do_train and info.get("optimizer", args.optimizer) != args.optimizer:
            raise InputError(
                f"{info_path} was trained with --optimizer={info['optimizer']}; pass --optimizer={info['optimizer']} "
                "to resume it, or use a new --output_dir"
            )
    return resume_dir


def _load_model(
    args: PretrainArgs, config: BertConfig, resume_dir: Path | None, init: Checkpoint | None
) -> tuple[BertForPreTraining, dict | None]:
    """The model (resumed, or from --init_checkpoint, or random) and the training state to resume; logs
    the features and variables as run_pretraining.py does."""
    # Imported here, not at the top, so that bert.cli reports a flag error before torch loads.
    from bert import training
    from bert.checkpoint import load_into, read_checkpoint
    from bert.modeling import BertForPreTraining, num_parameters
    from bert.pretraining.inputs import FEATURE_LENGTHS

    training.set_seed(args.seed)
    model = BertForPreTraining(config)
    state = None
    if resume_dir is not None:
        if args.init_checkpoint:
            logger.info("resuming from %s: --init_checkpoint=%s is ignored", resume_dir, args.init_checkpoint)
        else:
            logger.info("resuming from %s", resume_dir)
        init = read_checkpoint(resume_dir, verify=not args.ignore_checkpoint_digest)
        state = training.load_training_state(resume_dir, verify=not args.ignore_checkpoint_digest)
    elif init is None and not args.do_train:
        logger.warning("evaluating a randomly initialised model: no checkpoint in --output_dir, no --init_checkpoint")
    restored: set[str] = set()
    if init is not None:
        load_into(model, init)
        # Names as in the model: an encoder-only checkpoint's keys lack the "bert." prefix.
        prefixed = any(k.startswith("bert.") for k in init.state_dict)
        restored = {k if prefixed or k.startswith("cls.") else f"bert.{k}" for k in init.state_dict}
    logger.info("*** Features ***")
    for name, flag in FEATURE_LENGTHS.items():
        length = getattr(args, flag) if flag else 1
        logger.info("  name = %s, shape = (%d, %d)", name, args.train_batch_size, length)
    logger.info("**** Trainable Variables ****")
    for name, p in model.named_parameters():
        logger.info("  name = %s, shape = %s%s", name, tuple(p.shape), ", *INIT_FROM_CKPT*" if name in restored else "")
    logger.info("%d parameters", num_parameters(model))
    return model, state


def _make_trainer(
    args: PretrainArgs, model: BertForPreTraining, wrapped: torch.nn.Module, dist, do_lower_case: bool | None
) -> training.Trainer:
    # Imported here, not at the top, so that bert.cli reports a flag error before torch loads.
    from bert import training
    from bert.optimization import create_optimizer

    optimizer, scheduler = create_optimizer(
        model, args.learning_rate, max(args.num_train_steps, 1), args.num_warmup_steps, args.optimizer
    )
    settings = training.TrainerSettings(
        precision=args.precision,
        save_checkpoints_steps=args.save_checkpoints_steps,
        keep_checkpoint_max=args.keep_checkpoint_max,
        log_every=args.log_every,
        examples_per_step=args.train_batch_size,
        vocab_file=args.vocab_file,
        do_lower_case=do_lower_case,
        desc="pretrain",
        max_nonfinite_steps=args.max_nonfinite_steps,
    )
    return training.Trainer(model, wrapped, optimizer, scheduler, dist, args.output_dir, settings)


def _restore(args: PretrainArgs, trainer: training.Trainer, state: dict, stream: RecordStream) -> int:
    """Restore the trainer from `state`; returns the data stream position to continue from."""
    # Imported here, not at the top, so that bert.cli reports a flag error before torch loads.
    from bert.optimization import polynomial_warmup_lr

    trainer.restore(state)
    # The schedule follows this run's flags, as the original rebuilds it from them on every run
    # (the same arithmetic as the LambdaLR, so an unchanged command resumes bit for bit).
    optimizer = trainer.optimizer
    trainer.scheduler.base_lrs = [args.learning_rate] * len(optimizer.param_groups)
    factor = polynomial_warmup_lr(trainer.global_step, 1.0, max(args.num_train_steps, 1), args.num_warmup_steps)
    for group in optimizer.param_groups:
        group["initial_lr"] = args.learning_rate
        group["lr"] = args.learning_rate * factor
    data = state.get("data", {})
    if data.get("num_records") != stream.n or data.get("seed") != args.seed:
        logger.warning(
            "the data (%s records, seed %s) differs from the checkpoint's (%s records, seed %s): the data "
            "order continues but is not the one of an uninterrupted run",
            stream.n,
            args.seed,
            data.get("num_records"),
            data.get("seed"),
        )
    return stream.position(int(data.get("epoch", 0)), int(data.get("index", 0)))


def _train(
    args: PretrainArgs, trainer: training.Trainer, dist, source, stream: RecordStream, position: int, masking
) -> dict[str, float] | None:
    """Steps from the trainer's step to --num_train_steps; returns the last logged metrics (None when no
    step was left to run)."""
    # Imported here, not at the top, so that bert.cli reports a flag error before torch loads.
    from bert import training
    from bert.modeling import BertForPreTraining
    from bert.pretraining.inputs import pretraining_loss, rank_batches

    start_step, start_position = trainer.global_step, position
    if start_step >= args.num_train_steps:
        logger.info("global step %d already reached --num_train_steps=%d", start_step, args.num_train_steps)
        return None
    logger.info(
        "***** Running training ***** batch size %d, steps %d to %d, %d records",
        args.train_batch_size,
        start_step,
        args.num_train_steps,
        len(source),
    )
    batches = rank_batches(
        source,
        stream,
        position,
        args.train_batch_size,
        dist.rank,
        dist.world_size,
        args.gradient_accumulation_steps,
        masking,
    )
    batches = training.prefetch(batches, pin=dist.device.type == "cuda")

    def data_state(step: int) -> dict[str, int]:
        return stream.state(start_position + (step - start_step) * args.train_batch_size)

    try:
        return trainer.train(
            batches,
            pretraining_loss,
            args.num_train_steps,
            data_state,
            totals_fn=BertForPreTraining.loss_normalizers,
            checkpoint_info={"optimizer": args.optimizer, "train_batch_size": args.train_batch_size, "seed": args.seed},
        )
    finally:
        batches.close()


def _evaluate(args: PretrainArgs, wrapped: torch.nn.Module, source, dist, global_step: int) -> dict[str, Any]:
    # Imported here, not at the top, so that bert.cli reports a flag error before torch loads.
    from bert.pretraining.evaluation import evaluate

    logger.info("***** Running evaluation ***** batch size %d, %d steps", args.eval_batch_size, args.max_eval_steps)
    metrics = evaluate(wrapped, source, args.eval_batch_size, args.max_eval_steps, dist, args.precision)
    metrics["global_step"] = global_step
    if dist.is_main:
        write_results(args.output_dir, metrics)
        with EventWriter(Path(args.output_dir) / "eval") as w:
            w.add_scalars(global_step, {k: v for k, v in metrics.items() if k != "global_step"})
    return metrics
