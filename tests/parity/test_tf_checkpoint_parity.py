"""The tiny checkpoint written by the original TF code, loaded straight from its TF files, must reproduce
every output the original computed (tolerances from the fixtures' README)."""

import numpy as np
import pytest
import torch

from bert.modeling import BertForPreTraining, BertModel
from conftest import FIXTURES

HIDDEN = dict(atol=1e-5, rtol=1e-5)
LOGITS = dict(atol=5e-5, rtol=1e-5)


@pytest.fixture(scope="module")
def expected():
    return dict(np.load(FIXTURES / "tf_checkpoint" / "tiny" / "expected.npz"))


def _inputs(expected):
    return [torch.from_numpy(expected[k]).long() for k in ("input_ids", "input_mask", "token_type_ids")]


@pytest.mark.parametrize("which", ["tiny", "tiny_weights_only"])
@pytest.mark.parametrize("unpad", [False, True])
def test_encoder_outputs(expected, which, unpad):
    model = BertModel.from_pretrained(FIXTURES / "tf_checkpoint" / which).eval()
    model.set_unpad(unpad)
    with torch.no_grad():
        out = model(*_inputs(expected))
    # The padded path computes padded positions as the original does; the unpadded one leaves zeros there.
    real = expected["input_mask"].astype(bool) if unpad else np.ones_like(expected["input_mask"], dtype=bool)
    np.testing.assert_allclose(out.embedding_output.numpy(), expected["embedding_output"], **HIDDEN)
    for i, layer in enumerate(out.all_encoder_layers):
        np.testing.assert_allclose(layer.numpy()[real], expected["all_encoder_layers"][i][real], **HIDDEN)
    np.testing.assert_allclose(out.sequence_output.numpy()[real], expected["sequence_output"][real], **HIDDEN)
    np.testing.assert_allclose(out.pooled_output.numpy(), expected["pooled_output"], **HIDDEN)


@pytest.mark.parametrize("which", ["tiny", "tiny_weights_only"])
def test_pretraining_heads_and_losses(expected, which):
    model = BertForPreTraining.from_pretrained(FIXTURES / "tf_checkpoint" / which / "bert_model.ckpt").eval()
    model.set_unpad(False)  # mlm_logits are compared at every position, padding included
    ids, mask, types = _inputs(expected)
    with torch.no_grad():
        every = model(ids, mask, types)
        out = model(
            ids,
            mask,
            types,
            masked_lm_positions=torch.from_numpy(expected["masked_lm_positions"]),
            masked_lm_ids=torch.from_numpy(expected["masked_lm_ids"]),
            masked_lm_weights=torch.from_numpy(expected["masked_lm_weights"]),
            next_sentence_labels=torch.from_numpy(expected["next_sentence_labels"]),
        )
    np.testing.assert_allclose(every.mlm_logits.numpy(), expected["mlm_logits"], **LOGITS)
    np.testing.assert_allclose(torch.log_softmax(every.mlm_logits, -1).numpy(), expected["mlm_log_probs"], **LOGITS)
    np.testing.assert_allclose(out.nsp_logits.numpy(), expected["nsp_logits"], **LOGITS)
    np.testing.assert_allclose(torch.log_softmax(out.nsp_logits, -1).numpy(), expected["nsp_log_probs"], **LOGITS)
    np.testing.assert_allclose(out.mlm_logits.reshape(12, -1).numpy(), expected["masked_lm_logits"], **LOGITS)
    for key in (
        "masked_lm_example_loss",
        "next_sentence_example_loss",
        "masked_lm_loss",
        "next_sentence_loss",
        "total_loss",
    ):
        np.testing.assert_allclose(getattr(out, key).numpy(), expected[key], **LOGITS, err_msg=key)


def test_exact_gelu_would_fail_the_tolerance(expected):
    """The fixture pins the tanh GELU: reading the config with the erf form must move the outputs."""
    from bert.config import BertConfig

    config = BertConfig.from_json_file(FIXTURES / "tf_checkpoint" / "tiny" / "bert_config.json", original_gelu="erf")
    model = BertModel.from_pretrained(FIXTURES / "tf_checkpoint" / "tiny", config=config).eval()
    with torch.no_grad():
        out = model(*_inputs(expected))
    assert np.abs(out.sequence_output.numpy() - expected["sequence_output"]).max() > 1e-4
