"""`bert pretrain`: masked-LM and next-sentence pre-training (the original's run_pretraining.py).

The runner is `bert.pretraining.run`; its docstring says what the run does (data, batch sizes, masking).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from bert.flags import DistillArgs, MaskingArgs, ModelArgs, TeacherArgs, TrainingArgs, same_as


@dataclass(kw_only=True)
class PretrainArgs(MaskingArgs, TrainingArgs, TeacherArgs):
    """Pre-train BERT with the masked-LM and next-sentence objectives (run_pretraining.py).

    Resumes from the newest checkpoint in --output_dir when there is one. Under
    `torchrun --nproc_per_node=N bert pretrain ...` the processes share the global batch.

    With --teacher, the student is distilled from it (task-agnostic distillation): its masked-LM distribution
    is trained towards the teacher's, and with --distill_attention its last layer's self-attention too
    (MiniLM). The teacher runs on every batch, on-line: its outputs are not cached, as pre-training data is
    streamed and too large to keep them for.
    """

    distils: ClassVar[bool] = True

    input_file: str = field(
        metadata={
            "run_defining": "data",
            "help": "Input TF example files (can be a glob or comma separated), or native dataset directories (the "
            "shards of one create-pretraining-data --num_shards run are read as one dataset).",
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
    # --teacher (TeacherArgs): distilled on-line, its outputs computed for every batch and not cached, since
    # pre-training data is streamed and too large to hold them (DistillArgs' cache serves fine-tuning data).
    temperature: float = same_as(DistillArgs, "temperature")
    distill_alpha: float = same_as(DistillArgs, "distill_alpha")
    teacher_dtype: str = same_as(DistillArgs, "teacher_dtype")
    distill_attention: bool = field(
        default=False,
        metadata={
            "run_defining": "train",
            "help": "Add MiniLM's losses (needs --teacher): the KL between the teacher's and the student's last-layer "
            "self-attention distributions and value relations softmax(V V^T / sqrt(d)), over real tokens.",
        },
    )
    relation_heads: int = field(
        default=0,
        metadata={
            "run_defining": "train",
            "min": 0,
            "help": "The heads --distill_attention splits both models' queries, keys and values into (0: the "
            "student's attention heads); it must divide both hidden sizes, which may differ.",
        },
    )
    plan: bool = field(
        default=False,
        metadata={
            "help": "Print the plan of this run and stop: memory per device (parameters, gradients, optimizer "
            "state, activations; with and without --gradient_checkpointing), FLOPs per step, and the time per "
            "step and for the run at --plan_mfu on --plan_devices. Reads no data."
        },
    )
    plan_devices: str = field(
        default="cpu",
        metadata={"help": "The devices the plan is for: N x a device (8xH100, 1xA100), or cpu (this machine)."},
    )
    plan_mfu: float = field(
        default=0.4, metadata={"help": "The model FLOPs utilisation the plan's times assume (0.4: 40 percent)."}
    )


def run_pretrain(args: PretrainArgs) -> dict[str, Any]:
    """Train and/or evaluate (`bert.pretraining.run`), or with --plan print the run's plan and stop."""
    # Imported here, not at the top, so that bert.cli reports a flag error before torch loads.
    from bert.plan import check_plan_flags, format_plan, make_plan
    from bert.pretraining.run import run_pretraining
    from bert.starting_model import resolve_starting_model

    if args.plan:
        check_plan_flags(args.plan_devices, args.plan_mfu)
        plan = make_plan(
            resolve_starting_model(args, need_vocab=False).config,
            train_batch_size=args.train_batch_size,
            max_seq_length=args.max_seq_length,
            max_predictions_per_seq=args.max_predictions_per_seq,
            gradient_accumulation_steps=args.gradient_accumulation_steps,
            num_train_steps=args.num_train_steps,
            devices=args.plan_devices,
            precision=args.precision,
            optimizer=args.optimizer,
            fsdp=args.fsdp,
            mfu=args.plan_mfu,
        )
        print(format_plan(plan))
        return plan
    return run_pretraining(args)
