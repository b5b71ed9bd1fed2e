"""`bert pretrain`: masked-LM and next-sentence pre-training (the original's run_pretraining.py).

The runner is `bert.pretraining.run`; its docstring says what the run does (data, batch sizes, masking).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from bert.flags import MaskingArgs, ModelArgs, TrainingArgs, same_as
from bert.pretraining.run import run_pretraining


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
        default=100000, metadata={"run_defining": "train", "help": "Number of training steps."}
    )
    num_warmup_steps: int = field(default=10000, metadata={"run_defining": "train", "help": "Number of warmup steps."})
    max_eval_steps: int = field(default=100, metadata={"help": "Maximum number of eval steps."})
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


def run_pretrain(args: PretrainArgs) -> dict[str, Any]:
    return run_pretraining(args)
