"""Pre-training distillation: MiniLM's relation losses against their formula and transformers' attentions, the
last block's q/k/v, and the loss of `bert pretrain --teacher` (zero for a student equal to its teacher, the
same over micro-batches as over one batch)."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from bert.config import BertConfig
from bert.distillation import minilm_losses, relation_log_probs
from bert.modeling import BertForPreTraining, Unpadding
from bert.pretraining.teacher import DistillationLoss

SMALL = dict(vocab_size=99, num_hidden_layers=2, intermediate_size=37, max_position_embeddings=64)
MASK = torch.tensor([[1] * 7, [1] * 4 + [0] * 3, [1] * 2 + [0] * 5])  # [B=3, T=7], one row without padding


def _config(**overrides) -> BertConfig:
    return BertConfig(**{**SMALL, "hidden_size": 32, "num_attention_heads": 4, **overrides})


def _batch(seed: int = 0, B: int = 3, T: int = 7, P: int = 3) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    mask = MASK[:B, :T] if (B, T) == (3, 7) else torch.ones(B, T, dtype=torch.long)
    positions = torch.stack([torch.randint(1, int(m.sum()), (P,), generator=g) for m in mask])  # real tokens
    return {
        "input_ids": torch.randint(5, 99, (B, T), generator=g) * mask,
        "attention_mask": mask,
        "token_type_ids": torch.zeros(B, T, dtype=torch.long),
        "masked_lm_positions": positions,
        "masked_lm_ids": torch.randint(5, 99, (B, P), generator=g),
        "masked_lm_weights": torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])[:B, :P],
        "next_sentence_labels": torch.randint(0, 2, (B,), generator=g),
    }


def _hand_relation_kl(t_a, t_b, s_a, s_b, mask, heads) -> np.ndarray:
    """Per example: sum over relation heads r and real queries i of KL(p_t || p_s), each p a softmax over the
    real keys j of a_r[i] . b_r[j] / sqrt(d), written out in float64 loops."""
    out = np.zeros(len(mask))
    for b, m in enumerate(mask):
        real = np.flatnonzero(m)
        for r in range(heads):

            def probs(a, keys, i, r=r):
                d = a.shape[-1] // heads
                x = np.array([a[i, r * d : (r + 1) * d] @ keys[j, r * d : (r + 1) * d] for j in real]) / np.sqrt(d)
                e = np.exp(x - x.max())
                return e / e.sum()

            for i in real:
                p, q = probs(t_a[b], t_b[b], i), probs(s_a[b], s_b[b], i)
                out[b] += float((p * np.log(p / q)).sum())
    return out


def test_minilm_losses_equal_their_formula_with_padding():
    g = torch.Generator().manual_seed(0)
    student = tuple(torch.randn(3, 7, 8, generator=g, dtype=torch.float64) for _ in range(3))  # H 8
    teacher = tuple(torch.randn(3, 7, 12, generator=g, dtype=torch.float64) * 2 for _ in range(3))  # H 12
    # Padded positions hold junk, which must not matter.
    losses = minilm_losses(student, teacher, MASK, relation_heads=2)
    s, t = [x.numpy() for x in student], [x.numpy() for x in teacher]
    mask = MASK.numpy()
    np.testing.assert_allclose(losses["attention"].numpy(), _hand_relation_kl(t[0], t[1], s[0], s[1], mask, 2), 1e-6)
    np.testing.assert_allclose(losses["value"].numpy(), _hand_relation_kl(t[2], t[2], s[2], s[2], mask, 2), 1e-6)
    assert losses["count"].tolist() == [14.0, 8.0, 4.0]  # 2 relation heads x real tokens
    assert (losses["attention"] > 0).all() and (losses["value"] > 0).all()
    junk = [x.clone() for x in student]
    for x in junk:
        x[MASK == 0] = 1e3
    again = minilm_losses(tuple(junk), teacher, MASK, relation_heads=2)
    torch.testing.assert_close(again["attention"], losses["attention"], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("unpad", [False, True])
def test_last_layer_qkv_are_what_the_last_attention_multiplies(unpad):
    torch.manual_seed(0)
    model = BertForPreTraining(_config()).eval()
    model.set_unpad(unpad)
    attention = model.bert.encoder.layer[-1].attention.self
    seen = []
    attention.register_forward_pre_hook(lambda m, inputs: seen.append(inputs[0]))  # [B, T, H], or [R, H] unpadded
    batch = _batch()
    with torch.no_grad():
        out = model(**batch)
        qkv = model.bert.last_layer_qkv(out.hidden)
    hidden = Unpadding.from_mask(MASK).pad(seen[0]) if unpad else seen[0]
    real = MASK.bool()
    for layer, x in zip((attention.query, attention.key, attention.value), qkv):
        torch.testing.assert_close(x[real], torch.nn.functional.linear(hidden, layer.weight, layer.bias)[real])


def test_attention_relation_is_transformers_last_layer_attention(tmp_path):
    """With as many relation heads as attention heads, the Q-K relation is the model's attention distribution,
    which transformers' eager BERT returns with output_attentions."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = BertForPreTraining(_config()).eval()
    model.save_pretrained(tmp_path)
    oracle = transformers.BertModel.from_pretrained(tmp_path, attn_implementation="eager").eval()
    batch = _batch()
    with torch.no_grad():
        want = oracle(batch["input_ids"], attention_mask=batch["attention_mask"], output_attentions=True)
        q, k, _ = model.bert.last_layer_qkv(model(**batch).hidden)
    got = relation_log_probs(q, k, MASK, heads=4).exp()  # [B, N, T, T]
    rows, queries = MASK.nonzero(as_tuple=True)  # the real queries; padded keys have probability 0 in both
    torch.testing.assert_close(got[rows, :, queries], want.attentions[-1][rows, :, queries], rtol=1e-4, atol=1e-6)


def _loss(student, teacher, batch, heads=4, temperature=2.0, alpha=0.7, totals=None):
    fn = DistillationLoss(teacher, temperature, alpha, heads)
    return fn(student, batch, totals if totals is not None else fn.loss_normalizers(batch))


def test_distillation_loss_is_zero_for_the_teacher_itself_and_positive_otherwise():
    torch.manual_seed(0)
    # Wide weights: a random model's attention and masked-LM distributions are otherwise nearly uniform.
    no_dropout = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    teacher = BertForPreTraining(_config(initializer_range=0.3, **no_dropout))
    teacher.eval().requires_grad_(False)
    twin = copy.deepcopy(teacher).requires_grad_(True).train()  # no dropout: the same function as the teacher
    batch = _batch()
    _, same = _loss(twin, teacher, batch)
    assert float(same["masked_lm_kl"]) == pytest.approx(0.0, abs=1e-6)
    assert float(same["attention_relation_loss"]) == pytest.approx(0.0, abs=1e-6)
    assert float(same["value_relation_loss"]) == pytest.approx(0.0, abs=1e-6)

    torch.manual_seed(1)
    student = BertForPreTraining(_config(hidden_size=16, num_attention_heads=2, hidden_dropout_prob=0.0))
    loss, other = _loss(student, teacher, batch, heads=2)
    for name in ("masked_lm_kl", "attention_relation_loss", "value_relation_loss"):
        assert float(other[name]) > 1e-4, name
    want = 0.7 * other["masked_lm_kl"] + 0.3 * other["masked_lm_loss"] + other["next_sentence_loss"]
    want = want + other["attention_relation_loss"] + other["value_relation_loss"]
    assert float(loss.detach()) == pytest.approx(float(want), rel=1e-6)
    loss.backward()
    assert student.bert.encoder.layer[-1].attention.self.query.weight.grad.abs().sum() > 0
    assert all(p.grad is None for p in teacher.parameters())


def test_masked_lm_kl_is_the_weighted_mean_of_the_kl_at_the_masked_positions():
    torch.manual_seed(0)
    teacher = BertForPreTraining(_config()).eval().requires_grad_(False)
    student = BertForPreTraining(_config(hidden_size=16, num_attention_heads=2)).eval()
    batch = _batch()
    _, metrics = _loss(student, teacher, batch, heads=None, temperature=3.0)
    s = student(**batch).mlm_logits.detach().double() / 3.0
    t = teacher(**batch).mlm_logits.double() / 3.0
    kl = (t.softmax(-1) * (t.log_softmax(-1) - s.log_softmax(-1))).sum(-1) * 9.0  # [B, P]
    w = batch["masked_lm_weights"].double()
    # (float32's KL, a difference of log-probabilities, against float64's: 9e-5 apart, relatively, on these weights)
    assert float(metrics["masked_lm_kl"]) == pytest.approx(float((w * kl).sum() / w.sum()), rel=1e-3)


def test_micro_batches_add_up_to_the_batch():
    torch.manual_seed(0)
    teacher = BertForPreTraining(_config()).eval().requires_grad_(False)
    student = BertForPreTraining(_config(hidden_size=16, num_attention_heads=2)).eval()
    batch = _batch()
    fn = DistillationLoss(teacher, 2.0, 0.5, 2)
    whole, _ = fn(student, batch, fn.loss_normalizers(batch))
    # Each part one sequence cut to its real tokens: the losses do not depend on padding either.
    per_token = ("input_ids", "attention_mask", "token_type_ids")
    parts = [
        {k: v[i : i + 1, : int(MASK[i].sum())] if k in per_token else v[i : i + 1] for k, v in batch.items()}
        for i in range(3)
    ]
    norms = [fn.loss_normalizers(p) for p in parts]
    totals = {k: sum(n[k] for n in norms) for k in norms[0]}
    summed = sum(float(fn(student, p, totals)[0].detach()) for p in parts)
    assert summed == pytest.approx(float(whole.detach()), rel=1e-5)


def test_bfloat16_teacher_gives_the_float32_teacher_loss(tmp_path):
    from types import SimpleNamespace

    from bert.checkpoint import save_pretrained
    from bert.pretraining.teacher import load_teacher

    torch.manual_seed(0)
    save_pretrained(BertForPreTraining(_config(initializer_range=0.3)), tmp_path / "teacher")
    student = BertForPreTraining(_config(hidden_size=16, num_attention_heads=2)).eval()
    batch = _batch()
    losses = {}
    for dtype in ("float32", "bfloat16"):
        args = SimpleNamespace(
            teacher=str(tmp_path / "teacher"), teacher_dtype=dtype, max_seq_length=7, ignore_checkpoint_digest=False
        )
        teacher = load_teacher(args, student.config, None, torch.device("cpu"))
        weight = teacher.bert.encoder.layer[0].attention.self.query.weight
        assert weight.dtype == getattr(torch, dtype) and not weight.requires_grad and not teacher.training
        losses[dtype] = {k: float(v) for k, v in _loss(student, teacher, batch, heads=2)[1].items()}
    for name in ("masked_lm_kl", "attention_relation_loss", "value_relation_loss"):
        assert losses["bfloat16"][name] == pytest.approx(losses["float32"][name], rel=0.05), name
        assert losses["bfloat16"][name] != losses["float32"][name]  # the teacher did run in bfloat16
