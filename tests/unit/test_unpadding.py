"""The unpadded path (encoder on real tokens only) equals the padded path at real tokens, for outputs and
gradients, for every head, on random mixed-length batches."""

import pytest
import torch

from bert import modeling
from conftest import HEADS


def _batch(config, shape, generator):
    ids = torch.randint(0, config.vocab_size, shape, generator=generator)
    types = torch.randint(0, 2, shape, generator=generator)
    lengths = torch.randint(1, shape[-1] + 1, shape[:-1], generator=generator)
    mask = (torch.arange(shape[-1]) < lengths[..., None]).long()
    return ids, mask, types


def _scalar(name, out, mask):
    """A loss-like scalar of everything the head outputs at real positions."""
    if name == "BertModel":
        return (out.sequence_output * mask[..., None]).pow(2).sum() + out.pooled_output.sum()
    if name == "BertForPreTraining":
        return (out.mlm_logits * mask[..., None]).sin().sum() + out.nsp_logits.sum()
    if name in ("BertForQuestionAnswering", "BertForTokenClassification"):
        return (out.logits * mask[..., None]).sin().sum()
    return out.logits.sin().sum()


@pytest.mark.parametrize("name, kwargs", HEADS)
def test_unpadded_equals_padded(tiny_config, name, kwargs):
    tiny_config.hidden_dropout_prob = tiny_config.attention_probs_dropout_prob = 0.0
    g = torch.Generator().manual_seed(7)
    shape = (3, 4, 12) if name == "BertForMultipleChoice" else (5, 12)
    ids, mask, types = _batch(tiny_config, shape, g)
    results = []
    for unpad in (False, True):
        torch.manual_seed(0)
        model = getattr(modeling, name)(tiny_config, **kwargs).train()
        model.set_unpad(unpad)
        out = model(ids, mask, types)
        _scalar(name, out, mask).backward()
        results.append((out, {n: p.grad.clone() for n, p in model.named_parameters()}))
    (padded, g_padded), (unpadded, g_unpadded) = results
    tol = dict(atol=2e-5, rtol=1e-5)
    real = mask.bool()
    if name == "BertModel":
        torch.testing.assert_close(unpadded.sequence_output[real], padded.sequence_output[real], **tol)
        assert torch.all(unpadded.sequence_output[~real] == 0)
    elif name == "BertForPreTraining":
        torch.testing.assert_close(unpadded.mlm_logits[real], padded.mlm_logits[real], **tol)
        torch.testing.assert_close(unpadded.nsp_logits, padded.nsp_logits, **tol)
    elif name in ("BertForQuestionAnswering", "BertForTokenClassification"):
        torch.testing.assert_close(unpadded.logits[real], padded.logits[real], **tol)
    else:
        torch.testing.assert_close(unpadded.logits, padded.logits, **tol)
    for n in g_padded:
        torch.testing.assert_close(g_unpadded[n], g_padded[n], atol=1e-4, rtol=1e-4, msg=n)


def test_auto_decides_by_the_share_of_padding(tiny_config, monkeypatch):
    calls = []
    original = modeling.Unpadding.from_mask
    monkeypatch.setattr(modeling.Unpadding, "from_mask", classmethod(lambda cls, m: calls.append(1) or original(m)))
    model = modeling.BertModel(tiny_config).eval()
    ids = torch.randint(0, 99, (2, 10))
    model(ids, torch.ones(2, 10, dtype=torch.long))
    assert not calls  # no padding: padded path
    model(ids, torch.tensor([[1] * 10, [1] * 3 + [0] * 7]))
    assert calls  # 65% real tokens: unpadded


def test_unpadded_with_gradient_checkpointing(tiny_config):
    tiny_config.hidden_dropout_prob = tiny_config.attention_probs_dropout_prob = 0.0
    g = torch.Generator().manual_seed(3)
    ids, mask, types = _batch(tiny_config, (4, 9), g)
    grads = []
    for ckpt in (False, True):
        torch.manual_seed(0)
        model = modeling.BertForSequenceClassification(tiny_config).train()
        model.set_unpad(True)
        model.gradient_checkpointing_enable(ckpt)
        model(ids, mask, types, labels=torch.tensor([0, 1, 1, 0])).loss.backward()
        grads.append([p.grad for p in model.parameters()])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b)
