"""Same weights, same inputs: our model and transformers' must agree (fp32, atol 1e-5), every head."""

import pytest
import torch

transformers = pytest.importorskip("transformers")

from bert import modeling  # noqa: E402
from bert.config import BertConfig  # noqa: E402

HEADS = [
    ("BertModel", {}),
    ("BertForPreTraining", {}),
    ("BertForSequenceClassification", {"num_labels": 3}),
    ("BertForQuestionAnswering", {}),
    ("BertForTokenClassification", {"num_labels": 5}),
    ("BertForMultipleChoice", {}),
]
# Keys transformers has and we do not, because they are tied or buffers rather than weights.
_NOT_WEIGHTS = ("position_ids", "cls.predictions.decoder.bias", "cls.predictions.decoder.weight")


def _random_config(seed: int, act: str) -> BertConfig:
    g = torch.Generator().manual_seed(seed)
    heads = int(torch.randint(1, 5, (1,), generator=g))
    return BertConfig(
        vocab_size=int(torch.randint(50, 200, (1,), generator=g)),
        hidden_size=heads * int(torch.randint(4, 17, (1,), generator=g)),
        num_hidden_layers=int(torch.randint(1, 4, (1,), generator=g)),
        num_attention_heads=heads,
        intermediate_size=int(torch.randint(10, 80, (1,), generator=g)),
        hidden_act=act,
        max_position_embeddings=40,
        type_vocab_size=int(torch.randint(2, 4, (1,), generator=g)),
    )


def _hf_model(name, config: BertConfig, kwargs):
    hf_config = transformers.BertConfig(**{k: v for k, v in config.to_dict().items() if k != "extra"}, **kwargs)
    hf_config._attn_implementation = "eager"
    return getattr(transformers, name)(hf_config).eval()


@pytest.mark.parametrize("name, kwargs", HEADS)
@pytest.mark.parametrize("seed, act", [(0, "gelu_new"), (1, "gelu"), (2, "relu")])
def test_same_outputs_as_transformers(name, kwargs, seed, act):
    config = _random_config(seed, act)
    torch.manual_seed(seed)
    ours = getattr(modeling, name)(config, **kwargs).eval()
    ours.set_unpad(False)  # compared at every position, padding included (the unpadded path: test_unpadding.py)
    # Scale up the weights so that differences in the non-linear parts are not hidden by tiny activations.
    with torch.no_grad():
        for p in ours.parameters():
            p.mul_(10.0) if p.dim() > 1 else p.add_(torch.randn_like(p) * 0.1)
    hf = _hf_model(name, config, kwargs)
    missing, unexpected = hf.load_state_dict(ours.state_dict(), strict=False)
    assert not unexpected
    assert all(k.endswith(_NOT_WEIGHTS) for k in missing), missing
    if name == "BertForPreTraining":
        hf.tie_weights()
        torch.testing.assert_close(hf.cls.predictions.decoder.weight, ours.bert.embeddings.word_embeddings.weight)

    B, T = 3, 11
    shape = (B, 4, T) if name == "BertForMultipleChoice" else (B, T)
    ids = torch.randint(0, config.vocab_size, shape)
    types = torch.randint(0, config.type_vocab_size, shape)
    mask = torch.ones(shape, dtype=torch.long)
    mask[..., 1, 7:] = 0 if name != "BertForMultipleChoice" else 1
    mask[..., -3:] = 0
    with torch.no_grad():
        a = ours(ids, mask, types)
        b = hf(input_ids=ids, attention_mask=mask, token_type_ids=types)
    tol = dict(atol=1e-5, rtol=1e-5)
    if name == "BertModel":
        torch.testing.assert_close(a.sequence_output, b.last_hidden_state, **tol)
        torch.testing.assert_close(a.pooled_output, b.pooler_output, **tol)
    elif name == "BertForPreTraining":
        torch.testing.assert_close(a.mlm_logits, b.prediction_logits, **tol)
        torch.testing.assert_close(a.nsp_logits, b.seq_relationship_logits, **tol)
    elif name == "BertForQuestionAnswering":
        torch.testing.assert_close(a.logits[..., 0], b.start_logits, **tol)
        torch.testing.assert_close(a.logits[..., 1], b.end_logits, **tol)
    else:
        torch.testing.assert_close(a.logits, b.logits, **tol)


def test_losses_match_transformers():
    config = _random_config(4, "gelu_new")
    ours = modeling.BertForSequenceClassification(config, num_labels=3).eval()
    hf = _hf_model("BertForSequenceClassification", config, {"num_labels": 3})
    hf.load_state_dict(ours.state_dict(), strict=False)
    ids = torch.randint(0, config.vocab_size, (4, 9))
    labels = torch.tensor([0, 2, 1, 1])
    with torch.no_grad():
        torch.testing.assert_close(ours(ids, labels=labels).loss, hf(input_ids=ids, labels=labels).loss)
