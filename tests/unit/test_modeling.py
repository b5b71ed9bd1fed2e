import pytest
import torch
import torch.nn.functional as F

from bert import cpu_kernels
from bert.errors import InputError
from bert.modeling import (
    IGNORE_INDEX,
    BertForMultipleChoice,
    BertForPreTraining,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    BertModel,
    num_parameters,
)
from bert.tasks.ner import IGNORE_INDEX as TASK_IGNORE_INDEX

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
    # The pooler: tanh of a dense layer on the first token's final hidden state.
    torch.testing.assert_close(out.pooled_output, torch.tanh(model.pooler.dense(out.sequence_output[:, 0])))


# --------------------------------------------------------------------------------------------- heads
# A tester per head, in the style of the original's modeling_test.py: shapes on a tiny config, the loss
# against its formula written out, and the loss of a batch split in two (each half normalised by the
# whole batch's `loss_normalizers`, as the training loop does) adding up to the whole batch's loss.
def _halves_add_up(model, inputs: dict, whole: torch.Tensor) -> None:
    totals = type(model).loss_normalizers(inputs)
    n = inputs["input_ids"].shape[0]
    halves = [{k: v[s] for k, v in inputs.items()} for s in (slice(0, n // 2), slice(n // 2, n))]
    parts = [model(**h, loss_normalizers=totals) for h in halves]
    loss = getattr(parts[0], "total_loss", None) is not None
    torch.testing.assert_close(sum(p.total_loss if loss else p.loss for p in parts), whole)


def test_pretraining_head(tiny_config):
    ids, mask, types = _inputs(tiny_config)
    model = BertForPreTraining(tiny_config).eval()
    positions = torch.randint(1, T - 2, (B, 3))
    labels, weights = torch.randint(0, 99, (B, 3)), torch.ones(B, 3)
    weights[0, 2] = 0.0  # a padding slot
    nsp = torch.randint(0, 2, (B,))
    inputs = dict(input_ids=ids, attention_mask=mask, token_type_ids=types, masked_lm_positions=positions,
                  masked_lm_ids=labels, masked_lm_weights=weights, next_sentence_labels=nsp)  # fmt: skip
    out = model(**inputs)
    assert out.mlm_logits.shape == (B, 3, 99) and out.nsp_logits.shape == (B, 2)
    assert out.masked_lm_example_loss.shape == (B * 3,) and out.next_sentence_example_loss.shape == (B,)
    assert model(ids, mask, types).mlm_logits.shape == (B, T, 99)  # no positions: every position
    # run_pretraining.py: sum(w * -log p) / (sum(w) + 1e-5), plus the mean NSP cross-entropy.
    log_probs = torch.log_softmax(out.mlm_logits, -1)
    nll = -log_probs.gather(-1, labels[..., None]).squeeze(-1)  # [B, 3]
    mlm = (weights * nll).sum() / (weights.sum() + 1e-5)
    torch.testing.assert_close(out.masked_lm_loss, mlm)
    torch.testing.assert_close(out.next_sentence_loss, torch.nn.functional.cross_entropy(out.nsp_logits, nsp))
    torch.testing.assert_close(out.total_loss, mlm + out.next_sentence_loss)
    _halves_add_up(model, inputs, out.total_loss)


def test_sequence_classification_head(tiny_config):
    ids, mask, types = _inputs(tiny_config)
    model = BertForSequenceClassification(tiny_config, num_labels=3).eval()
    labels = torch.randint(0, 3, (B,))
    out = model(ids, mask, types, labels=labels)
    assert out.logits.shape == (B, 3) and out.example_loss.shape == (B,)
    torch.testing.assert_close(out.loss, torch.nn.functional.cross_entropy(out.logits, labels))
    _halves_add_up(model, dict(input_ids=ids, attention_mask=mask, token_type_ids=types, labels=labels), out.loss)
    reg = BertForSequenceClassification(tiny_config, num_labels=1).eval()
    scores = torch.rand(B) * 5
    out = reg(ids, mask, types, labels=scores)
    assert out.logits.shape == (B, 1)
    torch.testing.assert_close(out.loss, ((out.logits.squeeze(-1) - scores) ** 2).mean())  # MSE, as STS-B
    assert model(ids, mask, types).loss is None


def test_multi_label_sequence_classification_head(tiny_config):
    ids, mask, types = _inputs(tiny_config)
    model = BertForSequenceClassification(tiny_config, num_labels=4, problem_type="multi_label_classification").eval()
    labels = torch.randint(0, 2, (B, 4)).float()
    out = model(ids, mask, types, labels=labels)
    assert out.logits.shape == (B, 4) and out.example_loss.shape == (B,)
    assert torch.equal(out.example_count, torch.full((B,), 4.0))
    # -[y log sigmoid(x) + (1 - y) log(1 - sigmoid(x))], averaged over the B*4 (example, label) pairs, as
    # transformers' BCEWithLogitsLoss.
    p = torch.sigmoid(out.logits.double())
    bce = -(labels * torch.log(p) + (1 - labels) * torch.log(1 - p))  # [B, 4]
    torch.testing.assert_close(out.loss.double(), bce.mean())
    torch.testing.assert_close(out.example_loss.double(), bce.sum(-1))
    inputs = dict(input_ids=ids, attention_mask=mask, token_type_ids=types, labels=labels)
    assert type(model).loss_normalizers(inputs)["count"] == B * 4
    _halves_add_up(model, inputs, out.loss)
    # The problem type may come from the config, as transformers' `config.problem_type`.
    tiny_config.extra["problem_type"] = "multi_label_classification"
    assert BertForSequenceClassification(tiny_config, num_labels=4).problem_type == "multi_label_classification"
    tiny_config.extra["problem_type"] = "multi_label"
    with pytest.raises(ValueError, match="problem_type='multi_label' must be one of"):
        BertForSequenceClassification(tiny_config, num_labels=4)


def test_question_answering_head_masks_padding_in_its_loss(tiny_config):
    ids, mask, types = _inputs(tiny_config)
    model = BertForQuestionAnswering(tiny_config).eval()
    starts, ends = torch.randint(0, T - 2, (B,)), torch.randint(0, T - 2, (B,))
    out = model(ids, mask, types, starts, ends)
    assert out.logits.shape == (B, T, 2) and model.bert.pooler is None
    # run_squad.py: the mean of the start and end cross-entropies, here over each window's real tokens.
    scores = out.logits.masked_fill((mask == 0)[..., None], float("-inf"))
    expected = (
        torch.nn.functional.cross_entropy(scores[..., 0], starts)
        + torch.nn.functional.cross_entropy(scores[..., 1], ends)
    ) / 2
    torch.testing.assert_close(out.loss, expected)
    _halves_add_up(
        model,
        dict(input_ids=ids, attention_mask=mask, token_type_ids=types, start_positions=starts, end_positions=ends),
        out.loss,
    )
    # More padding, whatever its tokens, changes no example's loss.
    pad = torch.randint(0, 99, (B, 5))
    padded = model(torch.cat([ids, pad], 1), torch.cat([mask, torch.zeros(B, 5, dtype=torch.long)], 1),
                   torch.cat([types, torch.zeros(B, 5, dtype=torch.long)], 1), starts, ends)  # fmt: skip
    torch.testing.assert_close(padded.example_loss, out.example_loss, atol=1e-5, rtol=1e-5)


def test_token_classification_head(tiny_config):
    ids, mask, types = _inputs(tiny_config)
    model = BertForTokenClassification(tiny_config, num_labels=5).eval()
    labels = torch.randint(0, 5, (B, T))
    labels[:, 0] = -100  # [CLS] and non-first sub-tokens carry no label
    labels[mask == 0] = -100
    out = model(ids, mask, types, labels)
    assert out.logits.shape == (B, T, 5)
    expected = torch.nn.functional.cross_entropy(out.logits.reshape(-1, 5), labels.reshape(-1), ignore_index=-100)
    torch.testing.assert_close(out.loss, expected)  # the mean over labelled tokens, not over examples
    torch.testing.assert_close(out.example_count, (labels != -100).sum(-1).float())
    _halves_add_up(model, dict(input_ids=ids, attention_mask=mask, token_type_ids=types, labels=labels), out.loss)
    assert IGNORE_INDEX == TASK_IGNORE_INDEX == -100  # the NER features mark unlabelled tokens with it


def test_multiple_choice_head(tiny_config):
    ids, mask, types = _inputs(tiny_config, b=12)
    model = BertForMultipleChoice(tiny_config).eval()
    inputs = dict(input_ids=ids.view(3, 4, T), attention_mask=mask.view(3, 4, T), token_type_ids=types.view(3, 4, T))
    labels = torch.tensor([2, 0, 3])
    out = model(**inputs, labels=labels)
    assert out.logits.shape == (3, 4)
    # Each choice is scored alone, from its own pooled output.
    alone = model(ids[8:12].view(1, 4, T), mask[8:12].view(1, 4, T), types[8:12].view(1, 4, T)).logits
    torch.testing.assert_close(alone, out.logits[2:], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.loss, torch.nn.functional.cross_entropy(out.logits, labels))
    _halves_add_up(model, {**inputs, "labels": labels}, out.loss)


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


def _without_onednn(monkeypatch, fn):
    """`fn()` with every Linear on F.linear (MKL), the reference for the oneDNN paths."""
    with monkeypatch.context() as m:
        m.setattr(cpu_kernels, "_ONEDNN_LINEAR", False)
        return fn()


@pytest.mark.parametrize("hidden_act", ["gelu", "gelu_new", "relu", "tanh"])
def test_cpu_inference_runs_onednn_linear_and_equals_f_linear(tiny_config, hidden_act, monkeypatch):
    """Without grad, the encoder's Linear layers (and GELU/ReLU fused into the feed-forward one) run as
    oneDNN's fused Linear; the result equals F.linear's."""
    if not torch.backends.mkldnn.is_available():
        pytest.skip("this torch build has no oneDNN")
    tiny_config.hidden_act = hidden_act
    model = BertModel(tiny_config).eval()
    ids, mask, types = _inputs(tiny_config)
    mask[1, 3:] = 0  # padding: the unpadded path too
    expected = _without_onednn(monkeypatch, lambda: model(ids, mask, types).sequence_output.detach())
    with torch.profiler.profile() as prof, torch.inference_mode():
        got = model(ids, mask, types).sequence_output
    calls = sum(e.count for e in prof.key_averages() if e.key == "mkldnn::_linear_pointwise")
    # q, k, v, attention output, feed-forward in and out per layer, and the pooler
    assert calls == 6 * tiny_config.num_hidden_layers + 1
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_cpu_inference_runs_the_feed_forward_in_row_chunks_with_the_same_outputs(tiny_config, monkeypatch):
    """In CPU inference each layer's feed-forward sub-layer runs on FEED_FORWARD_ROWS tokens at a time (the
    batch's 79 real tokens in chunks of 16 here); the outputs equal the whole batch's; with grad, or in training
    mode, it runs whole."""
    model = BertModel(tiny_config).eval()
    ids, mask, types = _inputs(tiny_config)
    calls: list[int] = []
    for layer in model.encoder.layer:  # each call's rows
        layer.intermediate.register_forward_hook(lambda m, args, out: calls.append(args[0][..., 0].numel()))
    with torch.inference_mode():
        whole = model(ids, mask, types).sequence_output
    rows = int(mask.sum())  # the unpadded path's real tokens
    assert rows == 79 and calls == [rows] * tiny_config.num_hidden_layers  # under twice the chunk: one call
    calls.clear()
    monkeypatch.setattr(cpu_kernels, "FEED_FORWARD_ROWS", 16)
    with torch.inference_mode():
        chunked = model(ids, mask, types).sequence_output
    assert calls == ([16] * 4 + [15]) * tiny_config.num_hidden_layers
    torch.testing.assert_close(chunked, whole, atol=1e-6, rtol=1e-6)
    calls.clear()
    with_grad = model(ids, mask, types).sequence_output
    assert calls == [rows] * tiny_config.num_hidden_layers
    torch.testing.assert_close(with_grad.detach(), whole, atol=1e-5, rtol=1e-5)
    calls.clear()
    with torch.no_grad():  # training mode without grad (a cached loss's first pass) draws dropout for the whole
        model.train()(ids, mask, types)
    assert calls == [rows] * tiny_config.num_hidden_layers


def test_inference_packs_each_weight_once_and_again_after_it_changes(tiny_config, monkeypatch):
    """GEMMs in inference mode read oneDNN-packed copies of the weights, made at the first call and equal in
    result to the plain weights (no-grad passes outside it do not pack); a weight changed in place or given
    new data gets a new copy (never a stale one); released copies are made again; the model still deep-copies,
    and the copies go with it."""
    if not torch.backends.mkldnn.is_available():
        pytest.skip("this torch build has no oneDNN")
    model = BertModel(tiny_config).eval()
    ids, mask, types = _inputs(tiny_config)
    weights = [m.weight for m in model.modules() if type(m) is torch.nn.Linear]

    def run(packed=True):
        with monkeypatch.context() as m:
            if not packed:
                m.setattr(cpu_kernels, "inference_weight", lambda w: w)
            with torch.inference_mode():
                return model(ids, mask, types).sequence_output

    plain = run(packed=False)
    with torch.no_grad():  # no grad without inference mode (training's evaluation): the weights stay plain
        torch.testing.assert_close(model(ids, mask, types).sequence_output, plain)
    assert not any(id(w) in cpu_kernels._PACKED for w in weights)
    got = run()
    packed = [cpu_kernels._PACKED[id(w)][2] for w in weights]
    assert all(p.is_mkldnn for p in packed)
    torch.testing.assert_close(got, plain, atol=1e-6, rtol=1e-6)
    run()
    assert [cpu_kernels._PACKED[id(w)][2] for w in weights] == packed  # made once, not per call

    ffn = model.encoder.layer[0].intermediate.dense.weight
    with torch.no_grad():
        ffn.mul_(2.0)  # in place: the packed copy must follow
    torch.testing.assert_close(run(), run(packed=False), atol=1e-6, rtol=1e-6)
    assert not torch.allclose(run(), got)
    copy = __import__("copy").deepcopy(model)
    torch.testing.assert_close(copy(ids, mask, types).sequence_output.detach(), run(packed=False))
    before = run()
    ffn.data = ffn.data * 3.0  # new data in the same Parameter, as Module.to() casts: no in-place change
    torch.testing.assert_close(run(), run(packed=False), atol=1e-6, rtol=1e-6)
    assert not torch.allclose(run(), before)
    cpu_kernels.release_packed_weights(model)  # as after an evaluation between training steps
    assert all(cpu_kernels._PACKED[id(w)][2] is None for w in weights)
    torch.testing.assert_close(run(), run(packed=False), atol=1e-6, rtol=1e-6)
    assert all(cpu_kernels._PACKED[id(w)][2] is not None for w in weights)  # packed again at the next call
    keys = [id(w) for w in weights]
    model = copy = ffn = None  # the last references to the weights
    weights.clear()
    __import__("gc").collect()
    assert not any(k in cpu_kernels._PACKED for k in keys)


def test_cpu_training_runs_onednn_linear_forward_and_backward_and_equals_f_linear(tiny_config, monkeypatch):
    """With grad, every Linear of the encoder and the masked-LM head runs its forward and both backward GEMMs
    through oneDNN; the loss and every gradient equal F.linear's; under autocast F.linear runs."""
    if not torch.backends.mkldnn.is_available():
        pytest.skip("this torch build has no oneDNN")
    torch.manual_seed(0)
    model = BertForPreTraining(tiny_config).eval()  # no dropout, grad enabled: the two runs see one network
    ids, mask, types = _inputs(tiny_config)
    mask[1, 3:] = 0

    def step():
        model.zero_grad()
        out = model(ids, mask, types)
        loss = out.mlm_logits.logsumexp(-1).mean() + out.nsp_logits.square().mean()
        loss.backward()
        return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    expected_loss, expected = _without_onednn(monkeypatch, step)
    with torch.profiler.profile() as prof:
        loss, grads = step()
    calls = sum(e.count for e in prof.key_averages() if e.key == "mkldnn::_linear_pointwise")
    # per layer q, k, v, attention output, feed-forward in and out; the pooler; the head's transform and
    # decoder: each a forward GEMM and two backward ones (input and weight)
    assert calls == 3 * (6 * tiny_config.num_hidden_layers + 3)
    torch.testing.assert_close(loss, expected_loss, atol=1e-5, rtol=1e-5)
    assert grads.keys() == expected.keys()
    for name in grads:
        torch.testing.assert_close(grads[name], expected[name], atol=1e-5, rtol=1e-4, msg=name)
    with torch.profiler.profile() as prof, torch.autocast("cpu", dtype=torch.bfloat16):
        model(ids, mask, types).mlm_logits.float().mean().backward()
    assert not any(e.key == "mkldnn::_linear_pointwise" for e in prof.key_averages())


@pytest.mark.parametrize(
    "cls", [BertModel, BertForSequenceClassification, BertForTokenClassification, BertForQuestionAnswering]
)
def test_encoder_in_bfloat16_keeps_float32_outputs_within_its_rounding(tiny_config, cls):
    """set_encoder_dtype(bfloat16): the blocks' weights turn bfloat16, the embeddings, pooler and heads stay
    float32, and so does every output, within bfloat16's rounding of the float32 model's values (not equal to
    them: the blocks did run in bfloat16)."""
    torch.manual_seed(0)
    model = cls(tiny_config).eval()
    ids, mask, types = _inputs(tiny_config)
    with torch.inference_mode():
        before = model(ids, mask, types)
        model.set_encoder_dtype(torch.bfloat16)
        after = model(ids, mask, types)
    encoder = model if cls is BertModel else model.bert
    assert {p.dtype for p in encoder.encoder.parameters()} == {torch.bfloat16}
    others = [p for n, p in model.named_parameters() if ".encoder." not in f".{n}"]
    assert others and {p.dtype for p in others} == {torch.float32}
    pairs = [(before.sequence_output, after.sequence_output)] if cls is BertModel else []
    pairs += [(before.logits, after.logits)] if cls is not BertModel else [(before.pooled_output, after.pooled_output)]
    for full, reduced in pairs:
        full, reduced = torch.as_tensor(full), torch.as_tensor(reduced)
        assert reduced.dtype == torch.float32
        err = float((reduced - full).abs().max())
        assert 0 < err < 0.05 * float(full.abs().max()), err


def test_bfloat16_encoder_runs_onednn_where_the_cpu_multiplies_bfloat16(tiny_config):
    """On a CPU with bfloat16 instructions the blocks' Linear layers stay on oneDNN in bfloat16 (the speed of
    --dtype=bfloat16); elsewhere they fall back to F.linear rather than oneDNN's slower emulation."""
    if not torch.backends.mkldnn.is_available():
        pytest.skip("this torch build has no oneDNN")
    model = BertModel(tiny_config).eval()
    model.set_encoder_dtype(torch.bfloat16)
    with torch.profiler.profile() as prof, torch.inference_mode():
        model(*_inputs(tiny_config))
    calls = sum(e.count for e in prof.key_averages() if e.key == "mkldnn::_linear_pointwise")
    # six per block where oneDNN multiplies bfloat16; the float32 pooler's one always
    assert calls == (6 * tiny_config.num_hidden_layers if cpu_kernels.bf16_in_hardware() else 0) + 1


def _plain_attention(q, k, v, mask_bias, scale, p):
    """The attention core through autograd's plain ops, which keep every [B, N, T, T] tensor for backward, its
    dropout mask drawn as `attention_dropout` draws it (`_CpuDropout`'s)."""
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    if mask_bias is not None:
        scores = scores + mask_bias
    probs = scores.softmax(-1)
    keep = torch.rand(probs.shape) >= p
    return torch.matmul(probs.mul(keep).mul(1.0 / (1.0 - p)), v)


def test_cpu_training_attention_dropout_recomputes_probabilities_with_the_same_gradients(tiny_config, monkeypatch):
    """With attention dropout on the CPU, backward keeps no float [B, N, T, T] tensor (only the bool dropout
    mask) and the loss and every gradient equal autograd's through the plain ops, from the same seed (the same
    dropout masks), within float32 rounding."""
    tiny_config.attention_probs_dropout_prob = 0.3
    ids, mask, types = _inputs(tiny_config)
    torch.manual_seed(0)
    model = BertForSequenceClassification(tiny_config, num_labels=2).train()
    labels = torch.ones(B, dtype=torch.long)

    def step():
        torch.manual_seed(1)
        model.zero_grad()
        square = []  # the dtypes of the [B, N, T, T] tensors autograd keeps ([B, N, 1, T]: the last block, [CLS] alone)

        def pack(t):
            if t.dim() == 4 and t.shape[1] == tiny_config.num_attention_heads and t.shape[-1] == T:
                square.append(t.dtype)
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = model(ids, mask, types, labels=labels).loss
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in model.parameters()], square

    loss, grads, square = step()
    with monkeypatch.context() as m:
        m.setattr(cpu_kernels, "attention_dropout", _plain_attention)
        expected_loss, expected, plain_square = step()
    assert square == [torch.bool] * tiny_config.num_hidden_layers
    assert torch.float32 in plain_square  # the test sees what the plain ops keep
    torch.testing.assert_close(loss, expected_loss, atol=1e-6, rtol=1e-6)
    for a, b in zip(grads, expected):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("autocast", [False, True])
def test_attention_dropout_gradients_equal_the_plain_ops_including_the_mask_bias(autocast):
    """Also under bfloat16 autocast, where autograd runs through the ops and keeps the probabilities."""
    x = torch.randn(2, 5, 12, requires_grad=True)
    weight = torch.randn(36, 12, requires_grad=True)
    mask_bias = torch.randn(2, 1, 1, 5, requires_grad=True)
    grads = []
    for fn in (cpu_kernels.attention_dropout, _plain_attention):
        torch.manual_seed(0)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            q, k, v = (t.view(2, 5, 3, 4).transpose(1, 2) for t in F.linear(x, weight).split(12, -1))
            out = fn(q, k, v, mask_bias, 0.5, 0.2)
        weights = torch.arange(out.numel()).view_as(out) / 7.0
        grads.append(torch.autograd.grad((out.float() * weights).sum(), (x, weight, mask_bias)))
    for a, b in zip(*grads):
        # bfloat16 keeps 8 bits of mantissa: the two orders of the same ops part by a few percent of the largest
        tolerance = 0.1 * float(b.abs().max()) if autocast else 1e-5
        torch.testing.assert_close(a, b, atol=tolerance, rtol=1e-5)


@pytest.mark.parametrize("unpad", [False, True])
@pytest.mark.parametrize("checkpointing", [False, True])
def test_output_positions_equal_the_whole_last_block_there(tiny_config, unpad, checkpointing):
    """`output_positions` runs the last block at those positions alone ([CLS] first, then others in any
    order, repeated): their outputs and the pooler's, and every gradient of a loss on them, equal the whole
    block's there, padded or unpadded."""
    tiny_config.hidden_dropout_prob = tiny_config.attention_probs_dropout_prob = 0.0
    ids, mask, types = _inputs(tiny_config)
    torch.manual_seed(0)
    model = BertModel(tiny_config).train()
    model.set_unpad(unpad)
    model.gradient_checkpointing_enable(checkpointing)
    positions = torch.tensor([[0, 3, 1, 3]] * B)  # [B, P]
    index = positions[:, :, None].expand(-1, -1, tiny_config.hidden_size)
    results = []
    for at in (None, positions):
        model.zero_grad()
        out = model(ids, mask, types, output_positions=at)
        hidden = out.sequence_output if at is not None else out.sequence_output.gather(1, index)  # [B, P, H]
        (hidden.sin().sum() + out.pooled_output.pow(2).sum()).backward()
        results.append((out, hidden, [p.grad.clone() for p in model.parameters()]))
    (whole, whole_hidden, whole_grads), (part, part_hidden, part_grads) = results
    assert part.sequence_output.shape == (B, positions.shape[1], tiny_config.hidden_size)
    assert part.all_encoder_layers[-1] is part.sequence_output
    torch.testing.assert_close(part_hidden, whole_hidden, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(part.pooled_output, whole.pooled_output, atol=1e-5, rtol=1e-5)
    for layer_part, layer_whole in zip(part.all_encoder_layers[:-1], whole.all_encoder_layers[:-1]):
        torch.testing.assert_close(layer_part, layer_whole)
    for a, b in zip(part_grads, whole_grads):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("head", [BertForSequenceClassification, BertForMultipleChoice])
def test_pooled_heads_run_the_last_block_for_the_first_token_alone(tiny_config, head):
    """The heads that read the pooler alone (classification, reranking, multiple choice) ask for it."""
    ids, mask, types = _inputs(tiny_config)
    if head is BertForMultipleChoice:
        ids, mask, types = ids.view(1, B, T), mask.view(1, B, T), types.view(1, B, T)
    out = head(tiny_config).eval()(ids, mask, types)
    assert out.hidden.sequence_output.shape == (B, 1, tiny_config.hidden_size)


def test_pretraining_runs_the_last_block_at_cls_and_the_masked_positions(tiny_config):
    """Given masked positions, the last block runs at [CLS] and at them alone; the masked-LM and
    next-sentence logits equal those of the whole last block (the MLM head run at every position)."""
    tiny_config.hidden_dropout_prob = tiny_config.attention_probs_dropout_prob = 0.0
    ids, mask, types = _inputs(tiny_config)
    torch.manual_seed(0)
    model = BertForPreTraining(tiny_config).eval()
    positions = torch.tensor([[1, 4, 0]] * B)  # [B, P], a padding slot of 0 last, as the original pads
    out = model(ids, mask, types, masked_lm_positions=positions)
    whole = model(ids, mask, types)
    V = tiny_config.vocab_size
    assert out.hidden.sequence_output.shape == (B, 1 + positions.shape[1], tiny_config.hidden_size)
    expected = whole.mlm_logits.gather(1, positions[:, :, None].expand(-1, -1, V))  # [B, P, V]
    torch.testing.assert_close(out.mlm_logits, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.nsp_logits, whole.nsp_logits, atol=1e-5, rtol=1e-5)
