"""The original's optimizer and learning-rate schedule, plus LAMB for large batches.

Mirrors google-research/bert `optimization.py` (`AdamWeightDecayOptimizer`, `create_optimizer`):
- `AdamWeightDecay` is `AdamWeightDecayOptimizer`: Adam *without* bias correction, epsilon added outside
  the square root, and decoupled weight decay computed from the pre-update parameter and multiplied by
  the learning rate (`param -= lr * (m / (sqrt(v) + eps) + wd * param)`).
- `param_groups` applies decay by the original's rule: a parameter is decayed unless one of "LayerNorm",
  "layer_norm" or "bias" is a substring of its name. Our names are transformers', which keep those
  substrings, so the same parameters are excluded (every bias, `cls.predictions.bias`, every LayerNorm)
  and the same are decayed (every kernel and all three embedding tables).
- `polynomial_warmup_lr` is `create_optimizer`'s schedule: linear decay from step 0 to 0 at
  `num_train_steps`, overridden by a linear warmup `init_lr * step / num_warmup_steps` for
  `step < num_warmup_steps`. The decay is not shifted by the warmup, so the rate drops from about
  `init_lr` to `init_lr * (1 - W / T)` at the end of warmup (the original's quirk, kept on purpose).
- `clip_grad_norm` clips all gradients together to a global norm of 1.0.

`Lamb` is the layer-wise adaptive optimizer of You et al. 2019 ("Large Batch Optimization for Deep
Learning: Training BERT in 76 minutes"), with bias correction, the same decay exclusions, and no trust
ratio for the excluded parameters (the usual `exclude_from_layer_adaptation` default).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from torch import nn

# Substrings of parameter names that exempt a parameter from weight decay (create_optimizer's list).
EXCLUDE_FROM_WEIGHT_DECAY = ("LayerNorm", "layer_norm", "bias")


def excluded_from_weight_decay(name: str, exclude: Sequence[str] = EXCLUDE_FROM_WEIGHT_DECAY) -> bool:
    """The original `_do_use_weight_decay` negated: True when any pattern is a substring of `name`."""
    return any(pattern in name for pattern in exclude)


def param_groups(
    named_parameters: Iterable[tuple[str, nn.Parameter]],
    weight_decay: float = 0.01,
    exclude: Sequence[str] = EXCLUDE_FROM_WEIGHT_DECAY,
) -> list[dict]:
    """Two optimizer parameter groups: decayed, and excluded from decay by name.

    Args:
        named_parameters: e.g. `model.named_parameters()` (a tied weight is listed once, under its first
            name: the word-embedding table, which the original decays).
        weight_decay: the decay rate of the first group (the original's 0.01).
        exclude: name substrings that exempt a parameter.

    Returns:
        `[{"params", "names", "weight_decay"}, ...]`; parameters with `requires_grad=False` are left out,
        and a group with no parameters is dropped.
    """
    decay: dict[str, Any] = {"params": [], "names": [], "weight_decay": weight_decay}
    no_decay: dict[str, Any] = {"params": [], "names": [], "weight_decay": 0.0}
    for name, p in named_parameters:
        if not p.requires_grad:
            continue
        group = no_decay if excluded_from_weight_decay(name, exclude) else decay
        group["params"].append(p)
        group["names"].append(name)
    return [g for g in (decay, no_decay) if g["params"]]


class AdamWeightDecay(torch.optim.Optimizer):
    """The original `AdamWeightDecayOptimizer`, update for update.

    Per parameter with a gradient `g`:

        m = beta1 * m + (1 - beta1) * g
        v = beta2 * v + (1 - beta2) * g * g
        update = m / (sqrt(v) + eps)            # no bias correction (issue #153: "mostly an oversight")
        update += weight_decay * param          # only in groups with weight_decay != 0
        param -= lr * update

    Args:
        params: parameters or parameter groups (see `param_groups`).
        lr: learning rate (a scheduler may change it per step).
        weight_decay: the decay rate; the original constructor's default is 0.0, `create_optimizer` passes
            0.01 with the name exclusions, which `param_groups` encodes per group.
        betas: (beta1, beta2).
        eps: added to `sqrt(v)`; 1e-6 as in the original.
        bias_correction: divide m and v by (1 - beta^t) as standard Adam does. Off by default, as in the
            original's `AdamWeightDecayOptimizer` (an oversight, its authors said in google-research/bert
            issue #153, harmless with warmup).
        foreach: update all parameters of a group with `torch._foreach_*` kernels (fewer kernel launches;
            the same arithmetic, tested equal to the per-parameter loop). Default: on for CUDA tensors.
        fused: update all parameters of a group in one pass with torch's fused AdamW kernel (`_adam_fused`;
            equal to the loop to float rounding). Default: on where the kernel runs (fp32 parameters on one
            CPU or CUDA device), which on the CPU is 30x the loop's speed for all-MiniLM-L6-v2's 22M weights.
    """

    def __init__(
        self,
        params,
        lr: float = 1e-3,
        weight_decay: float = 0.0,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        bias_correction: bool = False,
        foreach: bool | None = None,
        fused: bool | None = None,
    ):
        if lr < 0.0:
            raise ValueError(f"invalid learning rate {lr}")
        if not 0.0 <= betas[0] < 1.0 or not 0.0 <= betas[1] < 1.0:
            raise ValueError(f"invalid betas {betas}")
        if eps < 0.0:
            raise ValueError(f"invalid epsilon {eps}")
        defaults = dict(
            lr=lr,
            weight_decay=weight_decay,
            betas=betas,
            eps=eps,
            bias_correction=bias_correction,
            foreach=foreach,
            fused=fused,
        )
        super().__init__(params, defaults)

    @torch.no_grad()
    # Optimizer.step is two overloads (no closure -> None, a closure -> its loss); this one signature is both.
    def step(self, closure: Callable[[], torch.Tensor] | None = None) -> torch.Tensor | None:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params, grads, ms, vs = [], [], [], []
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError("AdamWeightDecay does not support sparse gradients")
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["step"] += 1
                params.append(p)
                grads.append(p.grad)
                ms.append(state["exp_avg"])
                vs.append(state["exp_avg_sq"])
            if not params:
                continue
            step = self.state[params[0]]["step"]
            fused, foreach = group["fused"], group["foreach"]
            if fused is None:
                fused = foreach is None and _fusable(params)
            if foreach is None:
                foreach = all(p.is_cuda for p in params)
            (_adam_fused if fused else _adam_foreach if foreach else _adam_loop)(params, grads, ms, vs, group, step)
        return loss


def _fusable(params: list[torch.Tensor]) -> bool:
    """Whether torch's fused AdamW kernel can update these parameters in one call."""
    device = params[0].device
    return (
        hasattr(torch, "_fused_adamw_")
        and device.type in ("cpu", "cuda")
        and all(p.dtype == torch.float32 and p.device == device for p in params)
    )


def _adam_fused(params, grads, ms, vs, group, step: int) -> None:
    """The update of `_adam_loop` in one call of torch's fused AdamW kernel (the one `torch.optim.AdamW(...,
    fused=True)` runs). The kernel always divides m by c1 = 1 - beta1^t and sqrt(v) by sqrt(c2), c2 = 1 - beta2^t;
    without bias correction lr, eps and the decay are given scaled so that those divisions cancel exactly:
    lr c1 / sqrt(c2) * (m / c1) / (sqrt(v) / sqrt(c2) + eps / sqrt(c2)) = lr m / (sqrt(v) + eps), and the
    decoupled decay lr * weight_decay * param is unchanged."""
    beta1, beta2 = group["betas"]
    lr, wd, eps = group["lr"], group["weight_decay"], group["eps"]
    if not group["bias_correction"]:
        c1, sqrt_c2 = 1 - beta1**step, math.sqrt(1 - beta2**step)
        lr, eps, wd = lr * c1 / sqrt_c2, eps / sqrt_c2, wd * sqrt_c2 / c1
    steps = [torch.tensor(float(step), device=params[0].device)] * len(params)  # the kernel only reads them
    torch._fused_adamw_(
        params,
        grads,
        ms,
        vs,
        [],
        steps,
        lr=lr,
        beta1=beta1,
        beta2=beta2,
        weight_decay=wd,
        eps=eps,
        amsgrad=False,
        maximize=False,
        grad_scale=None,
        found_inf=None,
    )


def _adam_loop(params, grads, ms, vs, group, step: int) -> None:
    """The readable path: one parameter at a time."""
    beta1, beta2 = group["betas"]
    lr, wd, eps = group["lr"], group["weight_decay"], group["eps"]
    c1, c2 = (1 - beta1**step, 1 - beta2**step) if group["bias_correction"] else (1.0, 1.0)
    for p, g, m, v in zip(params, grads, ms, vs):
        m.mul_(beta1).add_(g, alpha=1 - beta1)
        v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
        denom = (v / c2).sqrt_().add_(eps) if c2 != 1.0 else v.sqrt().add_(eps)
        update = (m / c1).div_(denom) if c1 != 1.0 else m / denom
        if wd != 0.0:
            update.add_(p, alpha=wd)
        p.add_(update, alpha=-lr)


def _adam_foreach(params, grads, ms, vs, group, step: int) -> None:
    """The same arithmetic as `_adam_loop`, op for op, on lists of tensors."""
    beta1, beta2 = group["betas"]
    lr, wd, eps = group["lr"], group["weight_decay"], group["eps"]
    c1, c2 = (1 - beta1**step, 1 - beta2**step) if group["bias_correction"] else (1.0, 1.0)
    torch._foreach_mul_(ms, beta1)
    torch._foreach_add_(ms, grads, alpha=1 - beta1)
    torch._foreach_mul_(vs, beta2)
    torch._foreach_addcmul_(vs, grads, grads, value=1 - beta2)
    denom = torch._foreach_div(vs, c2) if c2 != 1.0 else vs
    denom = torch._foreach_sqrt(denom)
    torch._foreach_add_(denom, eps)
    update = torch._foreach_div(ms, c1) if c1 != 1.0 else ms
    update = torch._foreach_div(update, denom)
    if wd != 0.0:
        torch._foreach_add_(update, params, alpha=wd)
    torch._foreach_add_(params, update, alpha=-lr)


def _norm(t: torch.Tensor) -> torch.Tensor:
    """L2 norm of a whole tensor; a sharded (FSDP) parameter's norm is reduced over its shards."""
    n = torch.linalg.vector_norm(t.float())
    return n.full_tensor() if hasattr(n, "full_tensor") else n


class Lamb(torch.optim.Optimizer):
    """LAMB: Adam's direction, rescaled per parameter tensor by the trust ratio ||w|| / ||update||.

    Per parameter with a gradient `g` (step t from 1):

        m = beta1 * m + (1 - beta1) * g;  v = beta2 * v + (1 - beta2) * g * g
        update = (m / (1 - beta1^t)) / (sqrt(v / (1 - beta2^t)) + eps) + weight_decay * param
        ratio = ||param|| / ||update||  (1 when either norm is 0; always 1 in groups with adapt=False)
        param -= lr * ratio * update

    Groups built by `param_groups` get `adapt=False` for the excluded parameters (weight_decay 0), as
    the reference implementations exclude the same names from both decay and layer adaptation.

    Args:
        params: parameters or groups; a group's "adapt" defaults to `weight_decay != 0`.
        lr, weight_decay, betas, eps: as in `AdamWeightDecay`.
    """

    def __init__(
        self,
        params,
        lr: float = 1e-3,
        weight_decay: float = 0.0,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
    ):
        if lr < 0.0:
            raise ValueError(f"invalid learning rate {lr}")
        super().__init__(params, dict(lr=lr, weight_decay=weight_decay, betas=betas, eps=eps, adapt=None))

    @torch.no_grad()
    # Optimizer.step is two overloads (no closure -> None, a closure -> its loss); this one signature is both.
    def step(self, closure: Callable[[], torch.Tensor] | None = None) -> torch.Tensor | None:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            lr, wd, eps = group["lr"], group["weight_decay"], group["eps"]
            adapt = group["adapt"] if group["adapt"] is not None else wd != 0.0
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p)
                    state["exp_avg_sq"] = torch.zeros_like(p)
                state["step"] += 1
                t = state["step"]
                m, v = state["exp_avg"], state["exp_avg_sq"]
                m.mul_(beta1).add_(g, alpha=1 - beta1)
                v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
                update = (m / (1 - beta1**t)).div_((v / (1 - beta2**t)).sqrt_().add_(eps))
                if wd != 0.0:
                    update.add_(p, alpha=wd)
                if adapt:
                    w_norm, u_norm = _norm(p), _norm(update)
                    ratio = torch.where((w_norm > 0) & (u_norm > 0), w_norm / u_norm, torch.ones_like(w_norm))
                    if hasattr(update, "to_local"):  # a sharded DTensor takes a Python scalar
                        update.mul_(float(ratio))
                    else:
                        update.mul_(ratio.to(update.dtype))
                p.add_(update, alpha=-lr)
        return loss


def polynomial_warmup_lr(step: int, init_lr: float, num_train_steps: int, num_warmup_steps: int) -> float:
    """The learning rate `create_optimizer` uses at 0-based global step `step` (before its increment).

    Linear decay `init_lr * (1 - min(step, T) / T)` from step 0, replaced by `init_lr * step / W` while
    `step < W` (warmup; so step 0 has rate 0). The decay is not shifted by the warmup: after step W-1
    (rate ~init_lr) comes `init_lr * (1 - W / T)`: the original's quirk (google-research/bert issue #193),
    kept so that learning rates match.
    """
    if num_train_steps <= 0:
        raise ValueError(f"num_train_steps must be positive, got {num_train_steps}")
    if num_warmup_steps and step < num_warmup_steps:
        return init_lr * step / num_warmup_steps
    return init_lr * (1.0 - min(step, num_train_steps) / num_train_steps)


def polynomial_warmup_schedule(
    optimizer: torch.optim.Optimizer, num_train_steps: int, num_warmup_steps: int, last_epoch: int = -1
) -> torch.optim.lr_scheduler.LambdaLR:
    """`polynomial_warmup_lr` as a LambdaLR: call `scheduler.step()` after each `optimizer.step()`.

    The group's learning rate at step t is `lr * polynomial_warmup_lr(t, 1.0, T, W)`, i.e. the formula
    with `init_lr` = the group's initial learning rate.
    """

    def factor(step: int) -> float:
        return polynomial_warmup_lr(step, 1.0, num_train_steps, num_warmup_steps)

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor, last_epoch=last_epoch)


def clip_grad_norm(parameters: Iterable[torch.Tensor], max_norm: float = 1.0) -> torch.Tensor:
    """Clip all gradients together so that their global L2 norm is at most `max_norm`.

    Returns the global norm before clipping. The original's `tf.clip_by_global_norm` scales by
    `max_norm / max(norm, max_norm)`; torch's `clip_grad_norm_` by `max_norm / (norm + 1e-6)` when the
    norm exceeds `max_norm`: a relative difference below 1e-6 of the norm.
    """
    return torch.nn.utils.clip_grad_norm_(list(parameters), max_norm)


def create_optimizer(
    model: nn.Module,
    init_lr: float,
    num_train_steps: int,
    num_warmup_steps: int,
    optimizer: str = "adamw_bert",
    weight_decay: float = 0.01,
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """The original `create_optimizer`: the optimizer over all trainable parameters and its schedule.

    Args:
        model: the (unwrapped) model; parameter names decide the decay groups.
        init_lr, num_train_steps, num_warmup_steps: the schedule (see `polynomial_warmup_lr`).
        optimizer: "adamw_bert" (the original), "adamw" (the same with bias correction and eps 1e-8: torch's
            AdamW update, for comparison with transformers' trainers) or "lamb".
        weight_decay: 0.01 as in the original.

    Clipping is the training loop's job (`clip_grad_norm` with 1.0), as it needs the reduced gradients.
    """
    groups = param_groups(model.named_parameters(), weight_decay)
    if optimizer == "adamw_bert":
        opt: torch.optim.Optimizer = AdamWeightDecay(groups, lr=init_lr, betas=(0.9, 0.999), eps=1e-6)
    elif optimizer == "adamw":
        opt = AdamWeightDecay(groups, lr=init_lr, betas=(0.9, 0.999), eps=1e-8, bias_correction=True)
    elif optimizer == "lamb":
        opt = Lamb(groups, lr=init_lr, betas=(0.9, 0.999), eps=1e-6)
    else:
        raise ValueError(f"unknown optimizer {optimizer!r}; use adamw_bert, adamw or lamb")
    return opt, polynomial_warmup_schedule(opt, num_train_steps, num_warmup_steps)


__all__ = [
    "EXCLUDE_FROM_WEIGHT_DECAY",
    "AdamWeightDecay",
    "Lamb",
    "clip_grad_norm",
    "create_optimizer",
    "excluded_from_weight_decay",
    "param_groups",
    "polynomial_warmup_lr",
    "polynomial_warmup_schedule",
]
