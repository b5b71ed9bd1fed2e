import pytest
import torch

from bert.errors import InputError
from bert.modeling import (
    BertForMultipleChoice,
    BertForPreTraining,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    BertModel,
    num_parameters,
)

B, T = 13, 7


def _inputs(config, b=B, t=T):
    ids = torch.randint(0, config.vocab_size, (b, t))
    mask = torch.ones(b, t, dtype=torch.long)
    mask[: b // 2, t - 2 :] = 0
    types = torch.randint(0, config.type_vocab_size, (b, t))
    return ids, mask, types


def test_bert_model_shapes(tiny_config):
    model = BertModel(tiny_config).eval()
    out = model(*_inputs(tiny_config))
    assert out.embedding_output.shape == (B, T, 32)
    assert out.sequence_output.shape == (B, T, 32)
    assert out.pooled_output.shape == (B, 32)
    assert len(out.all_encoder_layers) == 2
    assert out.all_encoder_layers[-1] is out.sequence_output
    assert torch.all(out.pooled_output.abs() <= 1)  # tanh


def test_every_head_shapes_and_losses(tiny_config):
    ids, mask, types = _inputs(tiny_config)
    pt = BertForPreTraining(tiny_config).eval()
    positions = torch.randint(0, T, (B, 3))
    out = pt(ids, mask, types, positions, torch.randint(0, 99, (B, 3)), torch.ones(B, 3), torch.randint(0, 2, (B,)))
    assert out.mlm_logits.shape == (B, 3, 99) and out.nsp_logits.shape == (B, 2)
    assert torch.isfinite(out.total_loss) and out.masked_lm_example_loss.shape == (B * 3,)
    assert pt(ids, mask, types).mlm_logits.shape == (B, T, 99)

    cls = BertForSequenceClassification(tiny_config, num_labels=3).eval()
    out = cls(ids, mask, types, labels=torch.randint(0, 3, (B,)))
    assert out.logits.shape == (B, 3) and out.loss.ndim == 0
    reg = BertForSequenceClassification(tiny_config, num_labels=1).eval()
    out = reg(ids, mask, types, labels=torch.rand(B) * 5)
    assert out.logits.shape == (B, 1)
    labels = torch.rand(B) * 5
    out = reg(ids, mask, types, labels=labels)
    torch.testing.assert_close(out.loss, ((out.logits.squeeze(-1) - labels) ** 2).mean())

    qa = BertForQuestionAnswering(tiny_config).eval()
    out = qa(ids, mask, types, torch.zeros(B, dtype=torch.long), torch.ones(B, dtype=torch.long))
    assert out.logits.shape == (B, T, 2) and qa.bert.pooler is None

    tok = BertForTokenClassification(tiny_config, num_labels=5).eval()
    labels = torch.randint(0, 5, (B, T))
    labels[:, 0] = -100
    out = tok(ids, mask, types, labels)
    assert out.logits.shape == (B, T, 5) and torch.isfinite(out.loss)

    mc = BertForMultipleChoice(tiny_config).eval()
    out = mc(ids.view(1, B, T)[:, :4], mask.view(1, B, T)[:, :4], types.view(1, B, T)[:, :4], torch.tensor([2]))
    assert out.logits.shape == (1, 4)


def test_mlm_decoder_is_tied_to_word_embeddings(tiny_config):
    model = BertForPreTraining(tiny_config)
    assert model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight
    assert num_parameters(model) == sum(p.numel() for p in model.parameters())  # parameters() dedups too
    assert "cls.predictions.decoder.weight" in model.state_dict()


def test_padding_does_not_change_real_token_outputs(tiny_config):
    model = BertModel(tiny_config).eval()
    ids = torch.randint(0, 99, (1, 5))
    short = model(ids, torch.ones(1, 5, dtype=torch.long))
    padded_ids = torch.cat([ids, torch.randint(0, 99, (1, 4))], 1)
    padded = model(padded_ids, torch.tensor([[1] * 5 + [0] * 4]))
    torch.testing.assert_close(padded.sequence_output[:, :5], short.sequence_output, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(padded.pooled_output, short.pooled_output, atol=1e-6, rtol=1e-6)


def test_gradient_checkpointing_gives_the_same_gradients(tiny_config):
    tiny_config.hidden_dropout_prob = tiny_config.attention_probs_dropout_prob = 0.0
    ids, mask, types = _inputs(tiny_config)
    grads = []
    for enable in (False, True):
        torch.manual_seed(1)
        model = BertForSequenceClassification(tiny_config, num_labels=2).train()
        model.gradient_checkpointing_enable(enable)
        model(ids, mask, types, labels=torch.ones(B, dtype=torch.long)).loss.backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b)


def test_truncated_normal_init(tiny_config):
    model = BertModel(tiny_config)
    w = model.encoder.layer[0].intermediate.dense.weight
    assert w.abs().max() <= 2 * tiny_config.initializer_range + 1e-7
    assert 0.01 < w.std() < 0.02
    assert torch.all(model.encoder.layer[0].intermediate.dense.bias == 0)
    assert torch.all(model.embeddings.LayerNorm.weight == 1)


@pytest.mark.parametrize(
    "ids, types, fragment",
    [
        ([[1, 2, 99]], [[0, 0, 0]], "input_ids contain 99, outside \\[0, 98\\]"),
        ([[1, -1, 3]], [[0, 0, 0]], "input_ids contain -1"),
        ([[1, 2, 3]], [[0, 2, 0]], "token_type_ids \\(segment ids\\) contain 2"),
    ],
)
def test_out_of_range_ids_raise_clear_errors(tiny_config, ids, types, fragment):
    model = BertModel(tiny_config)
    with pytest.raises(InputError, match=fragment):
        model(torch.tensor(ids), token_type_ids=torch.tensor(types))


def test_sequence_longer_than_positions_is_refused(tiny_config):
    model = BertModel(tiny_config)
    with pytest.raises(InputError, match="exceeds max_position_embeddings=64"):
        model(torch.zeros(1, 65, dtype=torch.long))


def test_gelu_forms(tiny_config):
    x = torch.tensor([1.0, -0.5, 2.0])
    tanh = BertModel(tiny_config).encoder.layer[0].intermediate.intermediate_act_fn
    # The original's formula, written out.
    expected = 0.5 * x * (1 + torch.tanh((2 / torch.pi) ** 0.5 * (x + 0.044715 * x**3)))
    torch.testing.assert_close(tanh(x), expected)
    tiny_config.hidden_act = "gelu"
    erf = BertModel(tiny_config).encoder.layer[0].intermediate.intermediate_act_fn
    torch.testing.assert_close(erf(x), 0.5 * x * (1 + torch.erf(x / 2**0.5)))
    assert (erf(x) - tanh(x)).abs().max() > 1e-5
