"""The optimizer, its decay exclusions, the learning-rate schedule and clipping, against hand computations."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from bert.modeling import BertForPreTraining
from bert.optimization import (
    AdamWeightDecay,
    Lamb,
    clip_grad_norm,
    create_optimizer,
    excluded_from_weight_decay,
    param_groups,
    polynomial_warmup_lr,
    polynomial_warmup_schedule,
)


class _Three(nn.Module):
    """A decayed weight and two excluded parameters, named as in BERT."""

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(1)
        self.dense = nn.Linear(2, 3)
        self.LayerNorm = nn.LayerNorm(3)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=g))


def _numpy_adam_bert(p, grads, lr, wd, b1=0.9, b2=0.999, eps=1e-6):
    """The original AdamWeightDecayOptimizer.apply_gradients, in float64."""
    p = p.astype(np.float64)
    m = np.zeros_like(p)
    v = np.zeros_like(p)
    for g in grads:
        g = g.astype(np.float64)
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        update = m / (np.sqrt(v) + eps)
        update = update + wd * p
        p = p - lr * update
    return p


def test_decay_exclusions_on_bert(tiny_config):
    model = BertForPreTraining(tiny_config)
    groups = param_groups(model.named_parameters(), weight_decay=0.01)
    decayed, excluded = groups[0]["names"], groups[1]["names"]
    assert groups[0]["weight_decay"] == 0.01 and groups[1]["weight_decay"] == 0.0
    # The original decays every kernel and all three embedding tables...
    for name in (
        "bert.embeddings.word_embeddings.weight",
        "bert.embeddings.position_embeddings.weight",
        "bert.embeddings.token_type_embeddings.weight",
        "bert.encoder.layer.0.attention.self.query.weight",
        "bert.pooler.dense.weight",
        "cls.predictions.transform.dense.weight",
        "cls.seq_relationship.weight",
    ):
        assert name in decayed
    # ... and excludes every bias (output_bias too) and every LayerNorm gamma and beta.
    for name in ("cls.predictions.bias", "bert.embeddings.LayerNorm.weight", "bert.encoder.layer.1.output.dense.bias"):
        assert name in excluded
    assert all(("bias" in n) or ("LayerNorm" in n) for n in excluded)
    assert not any(excluded_from_weight_decay(n) for n in decayed)
    # The tied MLM decoder is the word-embedding table: listed once, and every parameter is in a group.
    assert "cls.predictions.decoder.weight" not in decayed + excluded
    assert len(decayed) + len(excluded) == len(list(model.parameters()))


def test_one_step_equals_hand_computation():
    model = _Three()
    before = {n: p.detach().numpy().copy() for n, p in model.named_parameters()}
    opt = AdamWeightDecay(param_groups(model.named_parameters(), 0.01), lr=0.1)
    g = torch.Generator().manual_seed(2)
    grads = {n: [torch.randn(p.shape, generator=g) for _ in range(3)] for n, p in model.named_parameters()}
    for step in range(3):
        for n, p in model.named_parameters():
            p.grad = grads[n][step].clone()
        opt.step()
    for n, p in model.named_parameters():
        wd = 0.0 if ("bias" in n or "LayerNorm" in n) else 0.01
        want = _numpy_adam_bert(before[n], [x.numpy() for x in grads[n]], lr=0.1, wd=wd)
        np.testing.assert_allclose(p.detach().numpy(), want, rtol=1e-6, atol=1e-6, err_msg=n)
    # The excluded parameters really were not decayed: with decay, LayerNorm.weight would differ.
    ln = before["LayerNorm.weight"]
    decayed = _numpy_adam_bert(ln, [x.numpy() for x in grads["LayerNorm.weight"]], lr=0.1, wd=0.01)
    assert np.abs(model.LayerNorm.weight.detach().numpy() - decayed).max() > 1e-4


def test_no_bias_correction_and_eps_outside_sqrt():
    # First step from zero state: m = 0.1 g, v = 0.001 g^2, update = 0.1 g / (sqrt(0.001) |g| + 1e-6).
    p = nn.Parameter(torch.tensor([1.0, -2.0], dtype=torch.float64))
    p.grad = torch.tensor([1e-3, 0.5], dtype=torch.float64)
    AdamWeightDecay([p], lr=1.0).step()
    g = np.array([1e-3, 0.5])
    expected = np.array([1.0, -2.0]) - 0.1 * g / (np.sqrt(0.001) * np.abs(g) + 1e-6)
    np.testing.assert_allclose(p.detach().numpy(), expected, rtol=1e-12)
    # Standard Adam (bias-corrected) moves by ~lr on the first step; this one by ~3.16 * lr.
    assert abs(p.detach().numpy()[1] - (-2.0)) > 3.0


@pytest.mark.parametrize("bias_correction", [False, True])
@pytest.mark.parametrize("path", ["foreach", "fused"])
def test_foreach_and_fused_equal_loop(path, bias_correction):
    """foreach: the loop's arithmetic op for op (equal bits); fused (the CPU default): torch's fused AdamW
    kernel, equal to float rounding, with and without bias correction."""
    g = torch.Generator().manual_seed(3)
    shapes = [(5, 7), (7,), (3, 3, 2)]
    ps = [[nn.Parameter(torch.randn(s, generator=torch.Generator().manual_seed(i))) for i, s in enumerate(shapes)]]
    ps.append([nn.Parameter(p.detach().clone()) for p in ps[0]])
    start = [p.detach().clone() for p in ps[0]]
    variant = {"foreach": dict(foreach=True, fused=False), "fused": dict(fused=None)}[path]
    opts = [
        AdamWeightDecay(
            [{"params": ps[k][:2], "weight_decay": 0.01}, {"params": ps[k][2:], "weight_decay": 0.0}],
            lr=0.01,
            bias_correction=bias_correction,
            **settings,
        )
        for k, settings in ((0, dict(foreach=False, fused=False)), (1, variant))
    ]
    for _ in range(4):
        grads = [torch.randn(s, generator=g) for s in shapes]
        for k in range(2):
            for p, gr in zip(ps[k], grads):
                p.grad = gr.clone()
            with torch.profiler.profile() as prof:
                opts[k].step()
            assert any("fused_adamw" in e.key for e in prof.key_averages()) == (k == 1 and path == "fused")
    for a, b, s in zip(*ps, start):
        if path == "foreach":
            assert torch.equal(a, b)
        else:
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
        assert (b - s).abs().max() > 0.01  # 4 steps of about lr each


def test_original_optimization_test():
    # optimization_test.py: w -> x within 1e-2 after 100 steps at lr 0.2, no decay.
    w = nn.Parameter(torch.tensor([0.1, -0.2, -0.1]))
    x = torch.tensor([0.4, 0.2, -0.5])
    opt = AdamWeightDecay([w], lr=0.2)
    for _ in range(100):
        opt.zero_grad()
        loss = ((x - w) ** 2).mean()
        loss.backward()
        opt.step()
    np.testing.assert_allclose(w.detach().numpy(), x.numpy(), atol=1e-2)


def test_schedule_values():
    init, W, T = 1e-4, 10, 40
    expected = {
        0: 0.0,  # warmup from 0: the first step does not move the weights
        1: init * 1 / W,
        W - 1: init * (W - 1) / W,
        W: init * (1 - W / T),  # the jump after warmup: decay counted from step 0
        W + 1: init * (1 - (W + 1) / T),
        T: 0.0,
        T + 5: 0.0,
    }
    for step, want in expected.items():
        assert polynomial_warmup_lr(step, init, T, W) == pytest.approx(want, rel=1e-12, abs=1e-20), step
    # 0.9 * init, then 0.75 * init (a schedule decaying after warmup would give init, then ~init).
    assert polynomial_warmup_lr(W - 1, init, T, W) > polynomial_warmup_lr(W, init, T, W)
    assert polynomial_warmup_lr(0, init, T, 0) == init  # no warmup: decay starts at init_lr
    assert polynomial_warmup_lr(T // 2, init, T, 0) == pytest.approx(init / 2)


def test_schedule_as_lambda_lr():
    init, W, T = 2e-3, 4, 20
    p = nn.Parameter(torch.zeros(1))
    opt = AdamWeightDecay([p], lr=init)
    sched = polynomial_warmup_schedule(opt, T, W)
    for step in range(T + 3):
        assert opt.param_groups[0]["lr"] == pytest.approx(polynomial_warmup_lr(step, init, T, W), rel=1e-12, abs=1e-20)
        p.grad = torch.ones(1)
        opt.step()
        sched.step()


def test_clip_on_global_norm():
    a = nn.Parameter(torch.zeros(2))
    b = nn.Parameter(torch.zeros(2))
    a.grad = torch.tensor([3.0, 0.0])
    b.grad = torch.tensor([0.0, 4.0])
    norm = clip_grad_norm([a, b], 1.0)
    assert float(norm) == pytest.approx(5.0)
    # Scaled together by 1/5 (per-tensor clipping would give [1, 0] and [0, 1]).
    torch.testing.assert_close(a.grad, torch.tensor([0.6, 0.0]), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(b.grad, torch.tensor([0.0, 0.8]), rtol=1e-5, atol=1e-6)
    a.grad = torch.tensor([0.3, 0.0])
    b.grad = torch.tensor([0.0, 0.4])
    clip_grad_norm([a, b], 1.0)
    assert torch.equal(a.grad, torch.tensor([0.3, 0.0]))  # below the threshold: untouched


def test_lamb_one_step_equals_hand_computation():
    model = _Three()
    before = {n: p.detach().numpy().astype(np.float64) for n, p in model.named_parameters()}
    opt = Lamb(param_groups(model.named_parameters(), 0.01), lr=0.1)
    g = torch.Generator().manual_seed(4)
    grads = {n: torch.randn(p.shape, generator=g) for n, p in model.named_parameters()}
    for n, p in model.named_parameters():
        p.grad = grads[n].clone()
    opt.step()
    for n, p in model.named_parameters():
        gr = grads[n].numpy().astype(np.float64)
        m, v = 0.1 * gr, 0.001 * gr * gr
        update = (m / 0.1) / (np.sqrt(v / 0.001) + 1e-6)  # bias-corrected
        excluded = "bias" in n or "LayerNorm" in n
        ratio = 1.0
        if not excluded:
            update = update + 0.01 * before[n]
            ratio = np.linalg.norm(before[n]) / np.linalg.norm(update)
        want = before[n] - 0.1 * ratio * update
        np.testing.assert_allclose(p.detach().numpy(), want, rtol=1e-5, atol=1e-6, err_msg=n)
    # The trust ratio applied to the weight: its step has norm lr * ||w||.
    step = model.dense.weight.detach().numpy() - before["dense.weight"]
    assert np.linalg.norm(step) == pytest.approx(0.1 * np.linalg.norm(before["dense.weight"]), rel=1e-5)


def test_create_optimizer(tiny_config):
    model = BertForPreTraining(tiny_config)
    opt, sched = create_optimizer(model, 1e-4, 100, 10)
    assert isinstance(opt, AdamWeightDecay)
    assert [g["weight_decay"] for g in opt.param_groups] == [0.01, 0.0]
    assert opt.param_groups[0]["eps"] == 1e-6 and opt.param_groups[0]["betas"] == (0.9, 0.999)
    assert opt.param_groups[0]["lr"] == 0.0  # step 0 of the warmup
    opt2, _ = create_optimizer(model, 1e-4, 100, 10, optimizer="lamb")
    assert isinstance(opt2, Lamb)
    with pytest.raises(ValueError):
        create_optimizer(model, 1e-4, 100, 10, optimizer="sgd")


def test_adamw_choice_is_torch_adamw_update_for_update():
    """--optimizer=adamw: the update of torch.optim.AdamW (bias correction, eps 1e-8, decoupled decay), over
    the same decay groups and schedule as the original's optimizer; adamw_bert's differs from it."""
    steps, lr, wd = 5, 1e-2, 0.01

    def run(make):
        model = _Three()
        opt = make(model)
        g = torch.Generator().manual_seed(2)
        for _ in range(steps):
            opt.zero_grad()
            (model.LayerNorm(model.dense(torch.randn(4, 2, generator=g))) ** 2).sum().backward()
            opt.step()
        return torch.cat([p.detach().flatten() for p in model.parameters()])

    ours = run(lambda m: create_optimizer(m, lr, 1000, 0, optimizer="adamw", weight_decay=wd)[0])
    reference = run(
        lambda m: torch.optim.AdamW(param_groups(m.named_parameters(), wd), lr=lr, eps=1e-8, weight_decay=wd)
    )
    original = run(lambda m: create_optimizer(m, lr, 1000, 0, optimizer="adamw_bert", weight_decay=wd)[0])
    # The schedule's decay over 5 of 1000 steps changes lr by < 0.5%: compare with a reference at that lr.
    torch.testing.assert_close(ours, reference, rtol=0, atol=5e-5)
    assert (original - reference).abs().max() > 1e-3
