"""Distillation losses: a student trained on a teacher's outputs, as pure functions of tensors.

The soft-label KL (Hinton et al.'s knowledge distillation) serves fine-tuning and pre-training alike; the
MiniLM relation losses match the last layer's self-attention of a student to a teacher's.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def soft_label_kl(student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """KL(softmax(t / T) || softmax(s / T)) * T^2 for each row of [..., V] logits -> [...], in fp32.

    The T^2 keeps the gradient's scale independent of T, so that the loss mixes with a label loss at any T.
    """
    s = F.log_softmax(student_logits.float() / temperature, dim=-1)
    t = F.log_softmax(teacher_logits.float() / temperature, dim=-1)
    return (t.exp() * (t - s)).sum(-1) * temperature**2


# ------------------------------------------------------------------------------- MiniLM relation losses
# MiniLM distils the last Transformer block's self-attention: the distributions softmax(q k^T / sqrt(d)) per
# head and the value relations softmax(v v^T / sqrt(d)), each student row trained towards the teacher's by KL.
# The projections are split into a chosen number of relation heads (contiguous slices, as the model's own heads
# are), the same for teacher and student, so the two may have different hidden sizes and head counts; with as
# many relation heads as attention heads, the Q-K relation is the attention distribution itself.


def relation_log_probs(
    a: torch.Tensor, b: torch.Tensor, attention_mask: torch.Tensor | None, heads: int
) -> torch.Tensor:
    """log softmax over the keys of a_r b_r^T / sqrt(d) for each relation head r, in fp32: a, b [B, T, H] ->
    [B, R, T, T] (R = heads, d = H / R). Padded keys (`attention_mask` [B, T] 0) get probability 0."""
    B, T, H = a.shape
    d = H // heads
    a_heads = a.float().view(B, T, heads, d).transpose(1, 2)  # [B, T, H] -> [B, R, T, d]
    b_heads = b.float().view(B, T, heads, d).transpose(1, 2)
    scores = torch.matmul(a_heads, b_heads.transpose(-1, -2)) * d**-0.5  # [B, R, T, T]
    if attention_mask is not None:
        # The least finite value, not -inf: its probability is 0 and KL's 0 * (log 0 - log 0) stays 0, not NaN.
        scores = scores.masked_fill(attention_mask[:, None, None, :] == 0, torch.finfo(scores.dtype).min)
    return scores.log_softmax(-1)


def relation_kl(
    teacher_log_probs: torch.Tensor, student_log_probs: torch.Tensor, attention_mask: torch.Tensor | None
) -> torch.Tensor:
    """Per example [B]: the sum over relation heads and real query tokens of KL(teacher row || student row),
    from [B, R, T, T] log-probabilities (`relation_log_probs`)."""
    kl = (teacher_log_probs.exp() * (teacher_log_probs - student_log_probs)).sum(-1)  # [B, R, T]
    if attention_mask is not None:
        kl = kl * attention_mask[:, None, :].to(kl.dtype)
    return kl.sum((1, 2))


def minilm_losses(
    student_qkv: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    teacher_qkv: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    attention_mask: torch.Tensor | None,
    relation_heads: int,
) -> dict[str, torch.Tensor]:
    """MiniLM's attention-distribution and value-relation transfer between two last layers' queries, keys and
    values ([B, T, H_student] and [B, T, H_teacher], `BertModel.last_layer_qkv`).

    Returns per example [B]: "attention" (the Q-K relations' KL summed over relation heads and real query
    tokens), "value" (the same for the V-V relations) and "count" (relation heads x real tokens, what a
    mean divides by).
    """
    (sq, sk, sv), (tq, tk, tv) = student_qkv, teacher_qkv
    losses = {
        "attention": relation_kl(
            relation_log_probs(tq, tk, attention_mask, relation_heads),
            relation_log_probs(sq, sk, attention_mask, relation_heads),
            attention_mask,
        ),
        "value": relation_kl(
            relation_log_probs(tv, tv, attention_mask, relation_heads),
            relation_log_probs(sv, sv, attention_mask, relation_heads),
            attention_mask,
        ),
    }
    if attention_mask is not None:
        tokens = attention_mask.float().sum(-1)
    else:
        tokens = torch.full_like(losses["value"], sq.shape[1])
    losses["count"] = tokens * relation_heads
    return losses
