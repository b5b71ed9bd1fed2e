"""bert.csrc's CPU attention kernel: built for this CPU on first use (both vector widths), equal to torch's SDPA
within float32 rounding wherever the model calls it, and left aside (torch's kernel runs) where it does not apply
or cannot be built; in training, forward and backward equal autograd through the dropout mask it draws, and that
mask (and the hidden layers' dropout's) has the kept fraction and independence of a dropout mask and follows
torch's generator."""

from __future__ import annotations

import ctypes
import dataclasses
import logging
import os
import platform
import shutil
import subprocess

import pytest
import torch
import torch.nn.functional as F

from bert import cpu_kernels, csrc
from bert.errors import InputError
from bert.modeling import BertModel
from bert.quantization import quantize_int8

X86 = platform.machine().lower() in ("x86_64", "amd64")
CAN_BUILD = X86 and shutil.which(os.environ.get("CXX") or "c++") is not None
needs_build = pytest.mark.skipif(not CAN_BUILD, reason="needs an x86 CPU and a C++ compiler")
SOURCE = csrc.SOURCES / "attention.cpp"


@pytest.fixture
def kernel_cache(tmp_path, monkeypatch):
    """A fresh kernel cache, and `attention_kernel` asked again."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    csrc.load_attention.cache_clear()
    yield tmp_path / "bert" / "kernels"
    csrc.load_attention.cache_clear()


def _sdpa(q, k, v, mask_bias, heads):
    B, Tq, H = q.shape
    split = lambda x: x.view(B, x.shape[1], heads, H // heads).transpose(1, 2)  # noqa: E731
    return (
        F.scaled_dot_product_attention(split(q), split(k), split(v), attn_mask=mask_bias)
        .transpose(1, 2)
        .reshape(B, Tq, H)
    )


def _inputs(B, Tq, T, heads, D, masked, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, t, heads * D, generator=g) for t in (Tq, T, T))
    if not masked:
        return q, k, v, None
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    lengths[0] = T
    return q, k, v, torch.where(torch.arange(T) < lengths[:, None], 0.0, -10000.0)[:, None, None, :]


def _call(kernel, q, k, v, mask_bias, heads, products=0):
    B, Tq, H = q.shape
    bias = None if mask_bias is None else mask_bias.reshape(B, -1).contiguous()
    out = torch.empty_like(q)
    status = kernel(
        q.data_ptr(),
        k.data_ptr(),
        v.data_ptr(),
        None if bias is None else bias.data_ptr(),
        out.data_ptr(),
        Tq,
        k.shape[1],
        heads,
        H // heads,
        (H // heads) ** -0.5,
        0,
        B * heads,
        products,
    )
    return status, out


# (B, Tq, T, heads, D, masked): lengths off the kernel's tiles (rows of 6, keys in vectors of 8-16, in pairs), odd
# key counts, queries fewer than keys, both head sizes, with and without masks.
SHAPES = [(3, 37, 37, 12, 32, True), (2, 5, 71, 2, 64, True), (4, 1, 1, 4, 32, False), (2, 129, 129, 4, 64, False)]


def _load(library):
    kernel = ctypes.CDLL(str(library)).bert_attention
    kernel.argtypes, kernel.restype = csrc.ATTENTION_ARGS, ctypes.c_int
    return kernel


# A compiler without __builtin_shufflevector (GCC before 12), as GCC 12+ can pretend to be: the keys are then
# transposed element by element.
OLD_GCC = ["-U__GNUC__", "-D__GNUC__=11"]


@needs_build
@pytest.mark.parametrize(
    "isa, extra", [("AVX512", []), ("AVX2", []), ("AVX2", OLD_GCC)], ids=["avx512", "avx2", "gcc11"]
)
def test_each_vector_width_builds_and_equals_sdpa(isa, extra, kernel_cache):
    if isa == "AVX512" and torch.backends.cpu.get_cpu_capability() != "AVX512":
        pytest.skip("this CPU has no AVX-512")
    compiler = subprocess.run([os.environ.get("CXX") or "c++", "--version"], capture_output=True, text=True).stdout
    if extra and "clang" in compiler:
        pytest.skip("clang has __builtin_shufflevector at every version")
    library = csrc.build(SOURCE, csrc.ISA_FLAGS[isa] + extra)
    assert library is not None and library.parent == kernel_cache
    kernel = _load(library)
    for B, Tq, T, heads, D, masked in SHAPES:
        q, k, v, mask_bias = _inputs(B, Tq, T, heads, D, masked)
        status, out = _call(kernel, q, k, v, mask_bias, heads)
        assert status == 0
        torch.testing.assert_close(out, _sdpa(q, k, v, mask_bias, heads), atol=2e-6, rtol=1e-5)
    assert _call(kernel, *_inputs(1, 4, 4, 2, 16, False), 2)[0] == 1  # a head size not built: refused, not run
    assert _call(kernel, *_inputs(1, 4, 4, 2, 32, False), 2, products=1)[0] == 1  # built without pairs: refused


def _pairs_kernel(kernel_cache):
    if not (
        CAN_BUILD and torch.backends.cpu.get_cpu_capability() == "AVX512" and torch.cpu._is_avx512_bf16_supported()
    ):
        pytest.skip("needs AVX512-BF16 and a C++ compiler")
    return _load(csrc.build(SOURCE, csrc.ISA_FLAGS["AVX512"] + csrc.BF16_FLAGS))


def test_bfloat16_pairs_near_float32_attention_and_bfloat16_tensors_read_exactly(kernel_cache):
    kernel = _pairs_kernel(kernel_cache)
    for B, Tq, T, heads, D, masked in SHAPES:
        q, k, v, mask_bias = _inputs(B, Tq, T, heads, D, masked)
        status, out = _call(kernel, q, k, v, mask_bias, heads, products=1)
        assert status == 0
        exact = _sdpa(q, k, v, mask_bias, heads)
        fp32 = _call(kernel, q, k, v, mask_bias, heads)[1]
        # Not float32's result: the inputs were rounded; on average as near to it as torch's bfloat16 SDPA.
        sdpa_bf16 = _sdpa(
            *(x.bfloat16() for x in (q, k, v)), None if mask_bias is None else mask_bias.bfloat16(), heads
        )
        error = (out - exact).abs().mean()
        assert 1e-4 < error <= 1.1 * (sdpa_bf16.float() - exact).abs().mean()
        torch.testing.assert_close(fp32, exact, atol=2e-6, rtol=1e-5)  # the same build's float32 path is unchanged
        # bfloat16 tensors read as they are (2): float32 tensors of the same values multiplied in pairs (1), the
        # context rounded to bfloat16, bit for bit.
        q, k, v = (x.bfloat16() for x in (q, k, v))
        status, out16 = _call(kernel, q, k, v, mask_bias, heads, products=2)
        assert status == 0 and out16.dtype == torch.bfloat16
        widened = _call(kernel, q.float(), k.float(), v.float(), mask_bias, heads, products=1)[1]
        assert torch.equal(out16, widened.bfloat16())


@needs_build
@pytest.mark.parametrize("threads", [1, 2])
def test_inference_attention_equals_sdpa_on_every_thread_share(threads, monkeypatch):
    monkeypatch.setattr(cpu_kernels, "_SPLIT_MULTIPLY_ADDS", 1)  # split even these small calls
    calls = []
    kernel = csrc.attention_kernel()
    monkeypatch.setattr(
        csrc, "load_attention", lambda: csrc.Attention(lambda *a: calls.append(a[-3:-1]) or kernel(*a), "counted")
    )
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        q, k, v, mask_bias = _inputs(3, 24, 24, 12, 32, True)
        with torch.inference_mode():
            out = cpu_kernels.inference_attention(q, k, v, mask_bias, 12)
    finally:
        torch.set_num_threads(before)
    torch.testing.assert_close(out, _sdpa(q, k, v, mask_bias, 12), atol=2e-6, rtol=1e-5)
    assert sorted(calls) == ([(0, 36)] if threads == 1 else [(0, 18), (18, 36)])


@needs_build
def test_bfloat16_inputs_give_a_bfloat16_context_near_float32_attention():
    q, k, v, mask_bias = _inputs(2, 40, 40, 12, 32, True)
    q, k, v, mask_bias = (x.to(torch.bfloat16) for x in (q, k, v, mask_bias))
    with torch.inference_mode():
        out = cpu_kernels.inference_attention(q, k, v, mask_bias, 12)
        exact = _sdpa(q.float(), k.float(), v.float(), mask_bias.float(), 12)  # the same inputs, in float32
        sdpa_bf16 = _sdpa(q, k, v, mask_bias, 12)
    assert out is not None and out.dtype == torch.bfloat16
    # Read as they are and multiplied in bfloat16 pairs where those are built (the probabilities rounded too), else
    # widened to float32: within bfloat16's rounding of the exact result, and on average as near to it as torch's
    # bfloat16 SDPA (within 10%).
    torch.testing.assert_close(out.float(), exact, rtol=2**-7, atol=5e-3)
    assert (out.float() - exact).abs().mean() <= 1.1 * (sdpa_bf16.float() - exact).abs().mean()


@needs_build
@pytest.mark.parametrize("built", [True, False], ids=["pairs-built", "no-pairs"])
def test_an_int8_encoder_asks_for_bfloat16_pairs_where_they_are_built(tiny_config, built, monkeypatch):
    config = dataclasses.replace(tiny_config, num_attention_heads=1)
    model = quantize_int8(BertModel(config))
    assert all(layer.attention.self.bf16_products for layer in model.encoder.layer)
    plain = csrc.load_attention()
    pairs = []

    def kernel(*args):
        pairs.append(args[-1])
        return plain.kernel(*args[:-1], args[-1] if plain.bf16_pairs else 0)

    monkeypatch.setattr(csrc, "load_attention", lambda: csrc.Attention(kernel, "counted", bf16_pairs=built))
    with torch.inference_mode():
        model(torch.randint(0, 99, (2, 20)))
    assert pairs == [int(built)] * config.num_hidden_layers


@needs_build
def test_the_model_runs_the_kernel_in_inference_and_sdpa_where_a_gradient_is_wanted(tiny_config, monkeypatch):
    config = dataclasses.replace(tiny_config, num_attention_heads=1)  # one head of 32, a size the kernel is built for
    model = BertModel(config).eval()
    ids = torch.randint(0, 99, (3, 20))
    mask = torch.ones_like(ids)
    mask[1, 12:] = 0
    with torch.inference_mode():
        plain_kernel = csrc.attention_kernel()
        monkeypatch.setattr(csrc, "load_attention", lambda: csrc.Attention(None, "none"))
        reference = model(ids, attention_mask=mask).sequence_output
        counted = []
        kernel = csrc.Attention(lambda *a: counted.append(a[-1]) or plain_kernel(*a), "counted", bf16_pairs=True)
        monkeypatch.setattr(csrc, "load_attention", lambda: kernel)
        got = model(ids, attention_mask=mask).sequence_output
    assert counted == [0] * config.num_hidden_layers  # float32: float32 products, even where pairs are built
    torch.testing.assert_close(got, reference, atol=1e-5, rtol=1e-5)
    model(ids, attention_mask=mask).sequence_output.sum().backward()  # with grad: SDPA, whose backward torch has
    assert len(counted) == config.num_hidden_layers and model.embeddings.word_embeddings.weight.grad is not None


def test_switched_off_or_unbuildable_leaves_torchs_attention(kernel_cache, monkeypatch, caplog):
    monkeypatch.setenv(csrc.SWITCH, "0")
    assert csrc.attention_kernel() is None and csrc.load_attention().description == f"torch's ({csrc.SWITCH}=0)"
    csrc.load_attention.cache_clear()
    monkeypatch.delenv(csrc.SWITCH)
    monkeypatch.setenv("CXX", "false")  # a compiler that always fails
    with caplog.at_level(logging.WARNING, logger="bert.csrc"):
        assert csrc.attention_kernel() is None
    assert not X86 or torch.backends.cpu.get_cpu_capability() not in csrc.ISA_FLAGS or "did not compile" in caplog.text
    assert not kernel_cache.exists() or not list(kernel_cache.iterdir())  # nothing half-written left (nor hidden)
    q, k, v, mask_bias = _inputs(2, 8, 8, 2, 32, True)
    with torch.inference_mode():
        assert cpu_kernels.inference_attention(q, k, v, mask_bias, 2) is None


@needs_build
def test_a_built_kernel_is_found_in_the_cache_by_the_next_process(kernel_cache, monkeypatch):
    flags = csrc.ISA_FLAGS["AVX2"]
    first = csrc.build(SOURCE, flags)

    def no_compiler(*args, **kwargs):
        raise AssertionError("compiled again")

    monkeypatch.setattr(csrc.subprocess, "run", no_compiler)
    assert csrc.build(SOURCE, flags) == first and [p.name for p in kernel_cache.iterdir()] == [first.name]


def test_a_forked_child_gets_a_pool_of_its_own(monkeypatch):
    """A child forked after the parent split a call holds a copy of the pool whose threads did not follow it:
    submitting there would wait forever."""
    parent = cpu_kernels._helpers(1)
    assert cpu_kernels._helpers(1) is parent
    monkeypatch.setattr(cpu_kernels.os, "getpid", lambda: -1)
    child = cpu_kernels._helpers(1)
    assert child is not parent and child.submit(lambda: 7).result(timeout=10) == 7


def test_a_switch_value_it_does_not_know_is_an_error_naming_it(kernel_cache, monkeypatch):
    monkeypatch.setenv(csrc.SWITCH, "false")
    with pytest.raises(InputError, match=f"{csrc.SWITCH}='false': set it to 0"):
        csrc.attention_kernel()


def _training_kernel(isa):
    if isa == "AVX512" and torch.backends.cpu.get_cpu_capability() != "AVX512":
        pytest.skip("this CPU has no AVX-512")
    kernel = ctypes.CDLL(str(csrc.build(SOURCE, csrc.ISA_FLAGS[isa]))).bert_attention_training
    kernel.argtypes, kernel.restype = csrc.TRAINING_ARGS, ctypes.c_int
    return kernel


def _train(kernel, q, k, v, mask_bias, heads, p, seed, grad=None, lengths=None):
    """The training kernel's context and lse (grad None), or with `grad` also dq, dk, dv."""
    B, Tq, H = q.shape
    T, D = k.shape[1], H // heads
    bias = None if mask_bias is None else mask_bias.reshape(B, T).contiguous()
    out, lse = torch.empty_like(q), torch.empty(B * heads, Tq)
    shape = (Tq, T, heads, D, D**-0.5, p, seed, 0, B * heads)
    ptr = lambda x: None if x is None else x.data_ptr()  # noqa: E731
    assert kernel(*map(ptr, (q, k, v, bias, lengths, out, None, lse, None, None, None)), *shape) == 0
    if grad is None:
        return out, lse
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    assert kernel(*map(ptr, (q, k, v, bias, lengths, out, grad, lse, dq, dk, dv)), *shape) == 0
    return out, dq, dk, dv


def _keep_mask(kernel, q, k, mask_bias, heads, p, seed):
    """[B, N, Tq, T] the kernel's keep mask for this seed at every real key (masked keys' probabilities are 0, their
    draw unseen: True), read from its context with one-hot values, D keys at a time."""
    B, Tq, H = q.shape
    T, D = k.shape[1], H // heads
    keep = torch.ones(B, heads, Tq, T, dtype=torch.bool)
    for first in range(0, T, D):
        keys = min(D, T - first)
        v = torch.zeros(B, T, heads, D)
        v[:, first : first + keys, :, :keys] = torch.eye(keys)[None, :, None, :]
        out = _train(kernel, q, k, v.reshape(B, T, H), mask_bias, heads, p, seed)[0]
        seen = out.view(B, Tq, heads, D)[..., :keys].transpose(1, 2)  # [B, N, Tq, keys]
        real = seen if mask_bias is None else seen + (mask_bias[:, :, :, first : first + keys] < 0)
        keep[..., first : first + keys] = real != 0
    return keep


@needs_build
@pytest.mark.parametrize("isa", ["AVX512", "AVX2"])
def test_training_kernel_equals_autograd_through_its_own_dropout_mask(isa, kernel_cache):
    """Forward and backward against float64 autograd of dropout(softmax(q k^T / sqrt(D) + bias)) v with the mask
    the forward pass drew (read back from it): so the backward pass draws the same mask again."""
    kernel = _training_kernel(isa)
    for B, Tq, T, heads, D, masked in SHAPES:
        q, k, v, mask_bias = _inputs(B, Tq, T, heads, D, masked)
        grad = torch.randn(B, Tq, heads * D, generator=torch.Generator().manual_seed(1))
        for p in (0.0, 0.3):
            keep = _keep_mask(kernel, q, k, mask_bias, heads, p, seed=12345)
            out, dq, dk, dv = _train(kernel, q, k, v, mask_bias, heads, p, 12345, grad)
            split = lambda x: x.double().view(B, x.shape[1], heads, D).transpose(1, 2).requires_grad_()  # noqa: E731
            q64, k64, v64 = split(q), split(k), split(v)
            scores = q64 @ k64.transpose(-1, -2) * D**-0.5 + (0.0 if mask_bias is None else mask_bias.double())
            expected = (scores.softmax(-1) * keep / (1 - p)) @ v64
            expected.backward(split(grad))
            join = lambda x: x.transpose(1, 2).reshape(B, x.shape[2], heads * D).float()  # noqa: E731
            torch.testing.assert_close(out, join(expected.detach()), atol=1e-5, rtol=1e-5)
            for got, x in ((dq, q64), (dk, k64), (dv, v64)):
                torch.testing.assert_close(got, join(x.grad), atol=1e-5, rtol=1e-5)
            assert keep.all() if p == 0 else not keep.all()


@needs_build
def test_training_kernels_dropout_keeps_1_minus_p_independently_and_follows_the_seed(kernel_cache):
    kernel = _training_kernel("AVX2")
    q, k, _, _ = _inputs(8, 32, 32, 12, 32, False)  # 98,304 draws
    p = 0.1
    keep = _keep_mask(kernel, q, k, None, 12, p, seed=7).float()
    assert abs(keep.mean() - (1 - p)) < 0.005  # 5 standard deviations

    def correlation(a, b):
        a, b = a - a.mean(), b - b.mean()
        return float((a * b).mean() / (a.std() * b.std()))

    for a, b in (
        (keep[..., 1:], keep[..., :-1]),  # neighbouring keys
        (keep[:, :, 1:], keep[:, :, :-1]),  # neighbouring rows
        (keep[:, 1:], keep[:, :-1]),  # neighbouring heads
        (keep[1:], keep[:-1]),  # neighbouring sequences
    ):
        assert abs(correlation(a, b)) < 0.02  # ~6 standard deviations
    assert torch.equal(_keep_mask(kernel, q, k, None, 12, p, seed=7).float(), keep)
    other = _keep_mask(kernel, q, k, None, 12, p, seed=8).float()
    assert abs(correlation(keep, other)) < 0.02


@needs_build
@pytest.mark.parametrize("threads", [1, 2])
def test_training_attention_equals_autograd_without_dropout_on_every_thread_share(threads, monkeypatch):
    """p = 0 through `training_attention` (the autograd Function, split among threads; queries fewer than keys) is
    softmax attention: its context and gradients equal SDPA's through autograd."""
    monkeypatch.setattr(cpu_kernels, "_SPLIT_MULTIPLY_ADDS", 1)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        q, k, v, mask_bias = _inputs(3, 9, 24, 12, 32, True)
        grads = []
        for attention in (
            lambda q, k, v: cpu_kernels.training_attention(q, k, v, mask_bias, 12, 0.0),
            lambda q, k, v: _sdpa(q, k, v, mask_bias, 12),
        ):
            leaves = [x.clone().requires_grad_() for x in (q, k, v)]
            out = attention(*leaves)
            (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
            grads.append([out.detach()] + [x.grad for x in leaves])
    finally:
        torch.set_num_threads(before)
    for got, expected in zip(*grads):
        torch.testing.assert_close(got, expected, atol=2e-6, rtol=1e-5)


@needs_build
def test_the_model_trains_through_the_kernel_and_replays_its_masks_under_checkpointing(tiny_config, monkeypatch):
    """In training with attention dropout the model calls the training kernel forward and backward, keeps no
    [B, N, T, T] tensor for backward, and activation checkpointing (which replays torch's random state) gives the
    same loss and gradients: the masks follow torch's generator. Under autocast the plain ops run."""
    config = dataclasses.replace(tiny_config, num_attention_heads=1, attention_probs_dropout_prob=0.3)
    ids = torch.randint(0, 99, (3, 20))
    mask = torch.ones_like(ids)
    mask[1, 12:] = 0
    plain = csrc.load_attention()
    passes = []
    counted = csrc.Attention(
        plain.kernel, "counted", training=lambda *a: passes.append(a[6] is not None) or plain.training(*a)
    )
    monkeypatch.setattr(csrc, "load_attention", lambda: counted)
    torch.manual_seed(0)
    model = BertModel(config, add_pooling_layer=False).train()
    results = []
    for checkpointing in (False, True):
        model.gradient_checkpointing_enable(checkpointing)
        model.zero_grad()
        square = []
        torch.manual_seed(1)
        pack = lambda t: square.append(t.shape[-2:] == (20, 20)) or t  # noqa: E731
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = model(ids, attention_mask=mask).sequence_output.pow(2).mean()
        loss.backward()
        results.append([loss.detach()] + [p.grad.clone() for p in model.parameters()])
        assert not any(square)
    layers = config.num_hidden_layers
    # forward, then backward, per layer; with checkpointing each layer's forward runs again before its backward
    assert passes == [False] * layers + [True] * layers + [False] * layers + [False, True] * layers
    for got, expected in zip(*results):
        torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-5)
    passes.clear()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model(ids, attention_mask=mask).sequence_output.float().sum().backward()
    assert passes == []


@needs_build
@pytest.mark.parametrize("width", [384, 37])  # whole vectors; a tail past them
def test_compiled_dropout_keeps_1_minus_p_and_drops_the_gradient_where_it_dropped(width):
    """The hidden layers' dropout by the kernel's hash: kept elements scaled by 1 / (1 - p), the fraction kept
    1 - p with neighbours independent, the gradient masked alike with nothing kept for backward, and the mask set
    by torch's generator."""
    p = 0.1
    x = torch.randn(40_000, width).add_(5.0).requires_grad_()  # no zeros: a zero output is a dropped element
    saved = []
    torch.manual_seed(3)
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        out = cpu_kernels.dropout(x, p, True)
    keep = out.detach() != 0
    torch.testing.assert_close(out.detach()[keep], x.detach()[keep] / (1 - p))
    assert saved == [] and abs(keep.float().mean() - (1 - p)) < 0.002
    for a, b in ((keep[:, 1:], keep[:, :-1]), (keep[1:], keep[:-1])):
        a, b = a.float() - a.float().mean(), b.float() - b.float().mean()
        assert abs(float((a * b).mean() / (a.std() * b.std()))) < 0.02
    grad = torch.randn_like(x)
    out.backward(grad)
    torch.testing.assert_close(x.grad, grad * keep / (1 - p))
    torch.manual_seed(3)
    assert torch.equal(cpu_kernels.dropout(x.detach(), p, True), out.detach())
    assert not torch.equal(cpu_kernels.dropout(x.detach(), p, True), out.detach())  # the generator moved on


@needs_build
@pytest.mark.parametrize("isa", ["AVX512", "AVX2"])
def test_training_kernel_skips_padding_given_lengths(isa, kernel_cache):
    """Given each sequence's real-token count, the context and every gradient at real positions equal the masked
    call's (the same dropout draws), and the padded rows are zero. The context's gradient is zero at padded
    positions, as in the model, where nothing downstream reads them."""
    kernel = _training_kernel(isa)
    for B, _, T, heads, D, _ in SHAPES:
        q, k, v, mask_bias = _inputs(B, T, T, heads, D, True)
        lengths = (mask_bias.reshape(B, T) == 0).sum(1, dtype=torch.int32)
        real = (torch.arange(T) < lengths[:, None])[..., None]  # [B, T, 1]
        grad = torch.randn(B, T, heads * D, generator=torch.Generator().manual_seed(1)) * real
        masked = _train(kernel, q, k, v, mask_bias, heads, 0.3, 99, grad)
        skipped = _train(kernel, q, k, v, mask_bias, heads, 0.3, 99, grad, lengths)
        for a, b in zip(skipped, masked):
            torch.testing.assert_close(a * real, b * real, atol=1e-6, rtol=1e-5)
            assert not (a * ~real).any()
