"""Pre-training with a teacher (`bert pretrain --teacher`): task-agnostic distillation of a small BERT.

The teacher is a pre-trained BERT with its masked-LM head (any format `bert.checkpoint` reads), frozen: in
eval mode (no dropout, so it draws no random numbers and a resumed run stays exact), without gradients. It
runs on every micro-batch the student trains on, on-line, since pre-training data is streamed and too large
to keep the teacher's outputs of (fine-tuning-sized data can cache them instead).

The loss of a micro-batch, each term its share of the global batch's as the head's own losses are
(`loss_normalizers`):

    alpha * masked_lm_kl + (1 - alpha) * masked_lm_loss + next_sentence_loss
        [+ attention_relation_loss + value_relation_loss with --distill_attention]

masked_lm_kl is KL(softmax(t / T) || softmax(s / T)) * T^2 at the masked positions, weighted by
masked_lm_weights as the label loss is (Turc et al.'s pre-trained distillation, with the masked-LM labels
mixed in); the next-sentence head learns from the labels only. The relation losses are MiniLM's
(`bert.distillation.minilm_losses`), means over relation heads and the real tokens of the global batch.
With --distill_alpha=0 and no --distill_attention the teacher is not run: --init_from_teacher_layers then
only gives the student's starting weights.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, cast

import torch

from bert.checkpoint import build_loaded, read_checkpoint
from bert.config import BertConfig
from bert.cpu_kernels import bf16_in_hardware
from bert.distillation import kd_classification_loss, minilm_losses, teacher_config
from bert.errors import InputError
from bert.flags import check_dtype
from bert.modeling import BertForPreTraining
from bert.pretraining.inputs import pretraining_metrics
from bert.tokenization import load_vocab

if TYPE_CHECKING:
    from bert.commands.pretrain import PretrainArgs

logger = logging.getLogger(__name__)


def load_teacher(
    args: PretrainArgs, student: BertConfig, vocab_file: str | None, device: torch.device
) -> BertForPreTraining:
    """The frozen teacher `--teacher` names, on `device`, checked against the student: the same vocabulary
    (size, and entries when both have a vocab.txt), a masked-LM head, room for --max_seq_length."""
    assert args.teacher is not None  # called for a run with --teacher only
    check_dtype(args.teacher_dtype, device=device, dashes="--teacher_")
    teacher_config(args.teacher)  # a missing teacher or config named as --teacher's, before its weights are read
    ckpt = read_checkpoint(args.teacher, verify=not args.ignore_checkpoint_digest)
    if ckpt.config is None or not ckpt.state_dict:
        raise InputError(
            f"--teacher={args.teacher} has no weights (an exported graph?); pass a model directory or checkpoint"
        )
    if not any(k.startswith("cls.predictions.") for k in ckpt.state_dict):
        raise InputError(
            f"--teacher={args.teacher} has no masked-LM head (cls.predictions.*): distillation reads its "
            "masked-LM logits; pass a pre-trained model with its pre-training heads"
        )
    config = ckpt.config
    if config.vocab_size != student.vocab_size:
        raise InputError(
            f"--teacher={args.teacher} has vocab_size={config.vocab_size} (vocab {ckpt.vocab_file or 'unknown'}) "
            f"but the student has vocab_size={student.vocab_size} (vocab {vocab_file or 'unknown'}): teacher and "
            "student must share one vocabulary"
        )
    if ckpt.vocab_file and vocab_file and load_vocab(ckpt.vocab_file) != load_vocab(vocab_file):
        raise InputError(
            f"--teacher={args.teacher}'s vocabulary {ckpt.vocab_file} differs from the student's {vocab_file} "
            f"(both {config.vocab_size} entries): teacher and student must share one vocabulary"
        )
    if args.max_seq_length > config.max_position_embeddings:
        raise InputError(
            f"--max_seq_length={args.max_seq_length} exceeds --teacher={args.teacher}'s max_position_embeddings="
            f"{config.max_position_embeddings}"
        )
    teacher = build_loaded(BertForPreTraining, config, ckpt)
    teacher.eval().requires_grad_(False).to(device)
    if args.teacher_dtype != "float32":
        if args.teacher_dtype == "bfloat16" and device.type == "cpu" and not bf16_in_hardware():
            logger.warning(
                "this CPU has no bfloat16 instructions (AVX512-BF16 or AMX): the bfloat16 teacher runs emulated, "
                "slower than float32; leave --teacher_dtype at float32 here"
            )
        teacher.set_encoder_dtype(getattr(torch, args.teacher_dtype))
    logger.info(
        "teacher %s: %d layers, hidden %d, %d heads",
        args.teacher,
        config.num_hidden_layers,
        config.hidden_size,
        config.num_attention_heads,
    )
    return teacher


def relation_heads(args: PretrainArgs, student: BertConfig, teacher: BertConfig) -> int | None:
    """The number of MiniLM relation heads (--relation_heads, else the student's attention heads), checked
    against both hidden sizes; None without --distill_attention."""
    if not args.distill_attention:
        if args.relation_heads:
            raise InputError("--relation_heads applies to --distill_attention only: add --distill_attention")
        return None
    heads = args.relation_heads or student.num_attention_heads
    for who, config in (("student", student), ("teacher", teacher)):
        if config.hidden_size % heads:
            raise InputError(
                f"the {who}'s hidden_size={config.hidden_size} does not split into --relation_heads={heads}: pass "
                "a --relation_heads that divides both hidden sizes"
            )
    return heads


class DistillationLoss:
    """A trainer `LossFn` (`__call__`) and its `TotalsFn` (`loss_normalizers`) for pre-training against a
    teacher; the formula is in the module's docstring."""

    def __init__(self, teacher: BertForPreTraining, temperature: float, alpha: float, heads: int | None):
        self.teacher = teacher
        self.temperature = temperature
        self.alpha = alpha
        self.heads = heads

    @staticmethod
    def loss_normalizers(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The head's normalisers, and the real tokens the relation losses average over."""
        return {**BertForPreTraining.loss_normalizers(batch), "tokens": batch["attention_mask"].float().sum()}

    def __call__(
        self, model: torch.nn.Module, batch: dict[str, torch.Tensor], totals: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "token_type_ids", "masked_lm_positions")}
        with torch.no_grad():
            target = self.teacher(**inputs)
        out = model(**batch, loss_normalizers=totals)
        weights = batch["masked_lm_weights"].float()  # [B, P]
        B, P, V = out.mlm_logits.shape
        student_logits, teacher_logits = out.mlm_logits.reshape(B * P, V), target.mlm_logits.reshape(B * P, V)
        kl = kd_classification_loss(student_logits, teacher_logits, self.temperature).view(B, P)
        masked_lm_kl = (weights * kl).sum() / (totals["masked_lm_weight"] + 1e-5)
        loss = self.alpha * masked_lm_kl + (1.0 - self.alpha) * out.masked_lm_loss + out.next_sentence_loss
        metrics = pretraining_metrics(out, batch, totals)
        metrics["masked_lm_kl"] = masked_lm_kl.detach()
        if self.heads is not None:
            unwrapped = model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model
            student = cast(BertForPreTraining, unwrapped)
            with torch.no_grad():
                teacher_qkv = self.teacher.bert.last_layer_qkv(target.hidden)
            relations = minilm_losses(
                student.bert.last_layer_qkv(out.hidden), teacher_qkv, batch["attention_mask"], self.heads
            )
            for name in ("attention", "value"):
                term = relations[name].sum() / (self.heads * totals["tokens"])
                loss = loss + term
                metrics[f"{name}_relation_loss"] = term.detach()
        metrics["loss"] = loss.detach()
        return loss, metrics
