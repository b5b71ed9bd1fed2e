"""The pre-training runner of `bert pretrain` (the original's run_pretraining.py `main`).

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

Dynamic masking (`--dynamic_masking`): see `bert.pretraining.inputs`. Distillation from a teacher
(`--teacher`, `--distill_attention`): see `bert.pretraining.teacher`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from bert import checkpointing, run_dir, training
from bert.batching import RecordStream
from bert.checkpoint import Checkpoint, build_loaded, read_checkpoint
from bert.config import BertConfig
from bert.distributed import distributed
from bert.errors import InputError
from bert.flags import check_batch_division, check_flag_values
from bert.formats.results import write_results
from bert.formats.tensorboard import EventWriter
from bert.modeling import BertForPreTraining, num_parameters
from bert.optimization import polynomial_warmup_lr
from bert.pretraining.evaluation import evaluate
from bert.pretraining.inputs import (
    FEATURE_LENGTHS,
    ConcatSource,
    masking_vocab,
    open_pretraining_data,
    pretraining_loss,
    rank_batches,
)
from bert.pretraining.teacher import DistillationLoss, load_teacher, relation_heads
from bert.starting_model import StartingModel, resolve_starting_model
from bert.utils import expand_input_files, format_scores, print_result

if TYPE_CHECKING:
    from bert.commands.pretrain import PretrainArgs

logger = logging.getLogger(__name__)


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
    if args.teacher and args.init_from_teacher_layers is None:
        if not args.do_train:
            raise InputError("--teacher trains the student against it: add --do_train, or drop --teacher")
        if args.distill_alpha == 0 and not args.distill_attention:
            raise InputError(
                f"--teacher={args.teacher} with --distill_alpha=0 and no --distill_attention is not learnt from: "
                "raise --distill_alpha, add --distill_attention or --init_from_teacher_layers, or drop --teacher"
            )
    if not args.teacher:
        defaults = {f.name: f.default for f in dataclasses.fields(args)}
        for flag in ("temperature", "distill_alpha", "teacher_dtype", "distill_attention", "relation_heads"):
            if getattr(args, flag) != defaults[flag]:
                raise InputError(f"--{flag} applies to distillation only: add --teacher=MODEL, or drop --{flag}")
    if args.distill_attention and args.fsdp and world_size > 1:
        raise InputError(
            "--distill_attention recomputes the student's last attention projections outside the block FSDP "
            "shards: drop --fsdp (DDP replicates the model)"
        )
    if args.fsdp and world_size == 1:
        logger.warning("--fsdp has no effect in a single process; start with torchrun --nproc_per_node=N")


def run_pretraining(args: PretrainArgs) -> dict[str, Any]:
    """Train and/or evaluate as `args` (the flags of `bert pretrain`) say; returns {"global_step", "train":
    last logged metrics, "eval": results}."""
    with (
        distributed(args.device) as dist,
        run_dir.claim_output_dir(args.output_dir, "pretrain", dist, _inputs(args)),
    ):
        # 1. Flags, vocab, data, config, output directory: all checked before any model is built.
        _check_flags(args, dist.world_size)
        start, train_source, eval_source = _open_data(args)
        args = dataclasses.replace(args, vocab_file=start.vocab_file)
        masking = None
        if args.dynamic_masking:
            if start.vocab is None or args.vocab_file is None:  # one is read from the other
                raise InputError("--dynamic_masking needs --vocab_file (for the [MASK], [CLS] and [SEP] ids)")
            masking = (args.seed, masking_vocab(start.vocab, args.vocab_file, args.do_whole_word_mask))
        config = start.config
        loss_fn, totals_fn = _loss(args, config, train_source, dist.device)
        _check_resumed_optimizer(args, start.resume_dir)
        manifests = train_source.manifests
        do_lower_case = bool(manifests[0]["do_lower_case"]) if manifests and "do_lower_case" in manifests[0] else None

        with run_dir.run_directory(args.output_dir, "pretrain", args, dist):
            # 2. The model and the trainer.
            model, state = _load_model(args, config, start.resume_dir, start.init)
            wrapped = training.prepare_model(model, args, dist, fsdp=args.fsdp)
            torch.manual_seed(args.seed + dist.rank)  # dropout differs across ranks, as their examples do
            trainer = training.make_trainer(
                model,
                wrapped,
                args,
                dist,
                num_train_steps=max(args.num_train_steps, 1),
                num_warmup_steps=args.num_warmup_steps,
                vocab_file=args.vocab_file,
                do_lower_case=do_lower_case,
                desc="pretrain",
            )
            stream = RecordStream(len(train_source), args.seed)
            position = _restore(args, trainer, state, stream) if state is not None else 0
            # 3. Training, the exported model, evaluation.
            result: dict[str, Any] = {"output_dir": args.output_dir}
            if args.do_train:
                last = _train(args, trainer, dist, train_source, stream, position, masking, loss_fn, totals_fn)
                if last is not None:
                    result["train"] = last
                trainer.export_model(Path(args.output_dir) / "model")
            result["global_step"] = trainer.global_step
            if args.do_eval:
                result["eval"] = _evaluate(args, wrapped, eval_source, dist, trainer.global_step)
            output_dir = Path(args.output_dir)
            run_dir.finish_run(output_dir, output_dir / "model", "pretrain", args, result.get("eval"), dist)
            if dist.is_main:
                _print_result(args, result)
            return result


def _open_data(args: PretrainArgs) -> tuple[StartingModel, ConcatSource, ConcatSource]:
    """The model the run starts from (its vocabulary checked against the data's), the training data and the
    evaluation data (`--eval_files`, else the training data), their ids checked against the model's tables."""
    sources: dict[str, ConcatSource] = {}

    def open_data(vocab_file: str | None) -> list[int]:
        sources["train"] = open_pretraining_data(
            args.input_file, args.max_seq_length, args.max_predictions_per_seq, vocab_file
        )
        return [int(m["vocab_size"]) for m in sources["train"].manifests if "vocab_size" in m]

    start = resolve_starting_model(args, need_vocab=False, open_data=open_data)
    train_source = eval_source = sources["train"]
    if args.do_eval and args.eval_files:
        eval_source = open_pretraining_data(
            args.eval_files, args.max_seq_length, args.max_predictions_per_seq, start.vocab_file, "--eval_files"
        )
    config = start.config
    for source in {id(train_source): train_source, id(eval_source): eval_source}.values():
        source.check_ids(config.vocab_size, config.type_vocab_size)
    return start, train_source, eval_source


def _loss(
    args: PretrainArgs, config: BertConfig, train_source: ConcatSource, device: torch.device
) -> tuple[training.LossFn, training.TotalsFn]:
    """The training loss and its normalisers: the heads' own, or the distillation loss against `--teacher`."""
    if args.teacher and args.do_train and (args.distill_alpha > 0 or args.distill_attention):
        teacher = load_teacher(args, config, args.vocab_file, device)
        train_source.check_ids(teacher.config.vocab_size, teacher.config.type_vocab_size)
        heads = relation_heads(args, config, teacher.config)
        distillation = DistillationLoss(teacher, args.temperature, args.distill_alpha, heads)
        return distillation, distillation.loss_normalizers
    return pretraining_loss, BertForPreTraining.loss_normalizers


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
    inputs["--teacher"] = args.teacher
    if args.eval_files:
        inputs["--eval_files"] = expand_input_files(args.eval_files, "--eval_files", directories=True)
    return inputs


def _check_resumed_optimizer(args: PretrainArgs, resume_dir: Path | None) -> None:
    """The checkpoint to resume was trained with this --optimizer."""
    if resume_dir is not None:
        info_path = resume_dir / checkpointing.TRAINER_STATE_NAME
        info = json.loads(info_path.read_text(encoding="utf-8")) if info_path.is_file() else {}
        if args.do_train and info.get("optimizer", args.optimizer) != args.optimizer:
            raise InputError(
                f"{info_path} was trained with --optimizer={info['optimizer']}; pass --optimizer={info['optimizer']} "
                "to resume it, or use a new --output_dir"
            )


def _load_model(
    args: PretrainArgs, config: BertConfig, resume_dir: Path | None, init: Checkpoint | None
) -> tuple[BertForPreTraining, dict | None]:
    """The model (resumed, or from --init_checkpoint, or random) and the training state to resume; logs
    the features and variables as run_pretraining.py does."""
    checkpointing.set_seed(args.seed)
    state = None
    if resume_dir is not None:
        if args.init_checkpoint:
            logger.info("resuming from %s: --init_checkpoint=%s is ignored", resume_dir, args.init_checkpoint)
        else:
            logger.info("resuming from %s", resume_dir)
        init = read_checkpoint(resume_dir, verify=not args.ignore_checkpoint_digest)
        state = checkpointing.load_training_state(resume_dir, verify=not args.ignore_checkpoint_digest)
    elif init is None and not args.do_train:
        logger.warning("evaluating a randomly initialised model: no checkpoint in --output_dir, no --init_checkpoint")
    restored: set[str] = set()  # the model's names of the weights the checkpoint gave
    model = BertForPreTraining(config) if init is None else build_loaded(BertForPreTraining, config, init, restored)
    logger.info("*** Features ***")
    for name, flag in FEATURE_LENGTHS.items():
        length = getattr(args, flag) if flag else 1
        logger.info("  name = %s, shape = (%d, %d)", name, args.train_batch_size, length)
    logger.info("**** Trainable Variables ****")
    for name, p in model.named_parameters():
        logger.info("  name = %s, shape = %s%s", name, tuple(p.shape), ", *INIT_FROM_CKPT*" if name in restored else "")
    logger.info("%d parameters", num_parameters(model))
    return model, state


def _restore(args: PretrainArgs, trainer: training.Trainer, state: dict, stream: RecordStream) -> int:
    """Restore the trainer from `state`; returns the data stream position to continue from."""
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
    args: PretrainArgs,
    trainer: training.Trainer,
    dist,
    source,
    stream: RecordStream,
    position: int,
    masking,
    loss_fn: training.LossFn,
    totals_fn: training.TotalsFn,
) -> dict[str, float] | None:
    """Steps from the trainer's step to --num_train_steps with `loss_fn` (the original's losses, or those
    against a teacher); returns the last logged metrics (None when no step was left to run)."""
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
    local = rank_batches(
        source,
        stream,
        position,
        args.train_batch_size,
        dist.rank,
        dist.world_size,
        args.gradient_accumulation_steps,
        masking,
    )
    batches = training.prefetch(local, pin=dist.device.type == "cuda")

    def data_state(step: int) -> dict[str, int]:
        return stream.state(start_position + (step - start_step) * args.train_batch_size)

    try:
        return trainer.train(
            batches,
            loss_fn,
            args.num_train_steps,
            data_state,
            totals_fn=totals_fn,
            checkpoint_info={"optimizer": args.optimizer, "train_batch_size": args.train_batch_size, "seed": args.seed},
        )
    finally:
        batches.close()


def _evaluate(args: PretrainArgs, wrapped: torch.nn.Module, source, dist, global_step: int) -> dict[str, Any]:
    logger.info("***** Running evaluation ***** batch size %d, %d steps", args.eval_batch_size, args.max_eval_steps)
    metrics = evaluate(wrapped, source, args.eval_batch_size, args.max_eval_steps, dist, args.precision)
    metrics["global_step"] = global_step
    if dist.is_main:
        write_results(args.output_dir, metrics)
        with EventWriter(Path(args.output_dir) / "eval") as w:
            w.add_scalars(global_step, {k: v for k, v in metrics.items() if k != "global_step"})
    return metrics
