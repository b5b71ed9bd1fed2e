"""CPU kernels of the model's layers, chosen at run time: oneDNN's Linear (with the feed-forward activation
fused in inference), weights packed once for inference mode, a faster dropout mask, and attention by bert.csrc's
compiled kernel, in inference and in training with dropout (its probabilities and mask recomputed in the backward
pass; where the kernel cannot be had, by torch's ops with the probabilities recomputed). Numerically each is the
plain PyTorch operation it replaces (`F.linear`, `F.dropout`, autograd through softmax and matmul, SDPA;
tests/unit/test_modeling.py and test_compiled_attention.py compare them), so
`bert.modeling` reads as the original's `modeling.py` and calls these where it multiplies or drops out. The one
approximation is `Int8Linear`, the Linear layers of `bert.quantization`'s int8 models.
"""

from __future__ import annotations

import ctypes
import os
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor

import torch
import torch.nn.functional as F
from torch import nn

from bert import csrc

# The encoder's Linear layers on CPU run as oneDNN's Linear (`torch.ops.mkldnn._linear_pointwise`, the kernel
# inductor emits for frozen CPU graphs) rather than F.linear's MKL sgemm, which takes a slow path on AMD CPUs:
# 2.4x the GFLOP/s on an AMD EPYC (Zen 5, one thread, MiniLM's feed-forward shape; bench/RESULTS.md). In
# inference the feed-forward GELU is applied inside the GEMM rather than as a second pass over [R, I]; in
# training `_OneDnnLinear` runs the two backward GEMMs through it too. Tracing, compiling and exporting keep
# F.linear (the exporters cannot trace the op), as do autocast (the op ignores it), quantized layers (not
# nn.Linear) and tensors off the CPU.
_ONEDNN_LINEAR = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")
# oneDNN makes one primitive (its JIT-compiled GEMM) per input shape and keeps it in two caches of 1,024
# entries each by default, oneDNN's own and ideep's (PyTorch's wrapper, `LRU_CACHE_CAPACITY`), about 0.4 MB
# an entry in each. Unpadded inference multiplies [R, H] with R the batch's token count, a new shape nearly
# every batch, so a server's memory grew by that much per batch for thousands of batches (bench/soak.py:
# +40-100 MB a round; shapes that recur are rare, so the caches hardly hit). A few entries still catch what
# does recur (the layers of one batch share three shapes; a fixed-shape loop has a handful), and bound the
# growth at a few MB. Both variables are read when oneDNN first runs, which is after this import; a value the
# user sets wins. (0 is not an option: ideep crashes on an LRU cache of capacity 0.)
ONEDNN_CACHE_CAPACITY = 32
for _variable in ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY"):
    os.environ.setdefault(_variable, str(ONEDNN_CACHE_CAPACITY))
# bfloat16 GEMMs in hardware (AVX512-BF16 or AMX): twice fp32's rate on an AMD EPYC Zen 5 core (bench/RESULTS.md).
# Elsewhere oneDNN would emulate them, slower than fp32, so a bfloat16 encoder there stays on F.linear.
_ONEDNN_BF16 = _ONEDNN_LINEAR and bool(getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: False)())
# hidden_act -> oneDNN's post-op and its algorithm, for the activations it fuses.
FUSED_ACTIVATIONS: dict[str, tuple[str, list[float], str]] = {
    "gelu": ("gelu", [], "none"),
    "gelu_new": ("gelu", [], "tanh"),
    "gelu_pytorch_tanh": ("gelu", [], "tanh"),
    "relu": ("relu", [], ""),
}


def bf16_in_hardware() -> bool:
    """Whether this CPU multiplies bfloat16 in hardware, so a bfloat16 encoder runs faster than float32 on it."""
    return _ONEDNN_BF16


def native_kernels() -> bool:
    """Whether this code runs eagerly (not traced, scripted, compiled or exported), so it may pick kernels."""
    return not (
        torch.jit.is_tracing()
        or torch.jit.is_scripting()
        or torch.compiler.is_compiling()
        or getattr(torch.compiler, "is_exporting", lambda: False)()  # torch 2.5+
    )


def _onednn_eligible(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether `x @ weight^T` may run through oneDNN: fp32 (or bfloat16 where the CPU has it) on the CPU, outside
    tracing, compiling and autocast."""
    return (
        _ONEDNN_LINEAR
        and x.device.type == "cpu"
        and (x.dtype == torch.float32 or (x.dtype == torch.bfloat16 and _ONEDNN_BF16))
        and weight.dtype == x.dtype
        and not torch.is_autocast_enabled("cpu")
        and native_kernels()
    )


def onednn_inference(layer: nn.Module, x: torch.Tensor) -> bool:
    """Whether `layer(x)` may run as oneDNN's fused Linear, whose output has no gradient."""
    return type(layer) is nn.Linear and not torch.is_grad_enabled() and _onednn_eligible(x, layer.weight)


def _onednn_gemm(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(a, b, bias, "none", [], "")  # a @ b^T + bias


# GEMMs under torch.inference_mode (the Predictor's: predict, embed, rerank, serve) read each weight in
# oneDNN's blocked layout, reordered once rather than at every call: 5-8% of all-MiniLM-L6-v2's embedding
# throughput (bench/RESULTS.md). The packed copies live here, keyed by the weight, so the model keeps plain
# tensors (it can still be copied, saved and trained); each is dropped with its weight, and made again after
# the weight changes (in place, or its data replaced by a cast). The cost is a second copy of the weights
# that inference multiplies by. Training's own no-grad passes (evaluation, cached losses) run outside
# inference mode and leave the weights plain; an evaluation through a Predictor between training steps packs
# them, and `release_packed_weights` drops those copies after it (the next step makes them stale).
_PACKED: dict[int, tuple[weakref.ref, tuple[int, int, torch.dtype] | None, torch.Tensor | None]] = {}
_PACK_ROWS = 1024  # oneDNN picks the layout for GEMMs of about this many rows (a batch of 32 short texts)


def inference_weight(weight: torch.Tensor) -> torch.Tensor:
    """`weight` as oneDNN's Linear reads it fastest: a model parameter in inference mode packed (`_PACKED`),
    anything else as is."""
    if not torch.is_inference_mode_enabled() or not isinstance(weight, nn.Parameter) or weight.is_inference():
        return weight  # (inference tensors have no version to tell a change by)
    key, stamp = id(weight), (weight._version, weight.data_ptr(), weight.dtype)
    entry = _PACKED.get(key)
    if entry is not None and entry[0]() is weight and entry[1] == stamp and entry[2] is not None:
        return entry[2]
    if entry is None:
        weakref.finalize(weight, _PACKED.pop, key, None)
    packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), _PACK_ROWS)
    _PACKED[key] = (weakref.ref(weight), stamp, packed)
    return packed


def release_packed_weights(model: nn.Module) -> None:
    """Drop the packed copies of `model`'s weights (`inference_weight`), for a model that trains on after an
    inference-mode evaluation; the next inference call packs them again."""
    for weight in model.parameters():
        entry = _PACKED.get(id(weight))
        if entry is not None and entry[0]() is weight:
            _PACKED[id(weight)] = (entry[0], None, None)  # the entry stays: its weight's finalizer is set


class _OneDnnLinear(torch.autograd.Function):
    """F.linear with its forward and both backward GEMMs through oneDNN."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return _onednn_gemm(x, weight, bias)  # [..., I] -> [..., O]

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: torch.Tensor):
        x, weight = ctx.saved_tensors
        g = grad.reshape(-1, grad.shape[-1])  # [..., O] -> [N, O]
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_x = _onednn_gemm(g, weight.t()).view(x.shape)  # g W: [N, O] x [O, I] -> [N, I] -> [..., I]
        if ctx.needs_input_grad[1]:
            flat = x.reshape(-1, x.shape[-1])  # [N, I]
            # g^T x multiplies two transposed operands: the GEMM's first is copied contiguous by ATen, its second
            # reordered by oneDNN, much the faster of the two on a large one. So the larger goes second: for
            # the MLM output layer ([N, 30522] gradients) the weight's gradient took half the time (measured,
            # bench/RESULTS.md), the result a transposed view that autograd lays out as the weight.
            if weight.shape[0] > weight.shape[1]:
                grad_w = _onednn_gemm(flat.t().contiguous(), g.t()).t()  # (x^T g)^T: [I, N] x [N, O] -> [O, I]
            else:
                grad_w = _onednn_gemm(g.t(), flat.t())  # g^T x: [O, N] x [N, I] -> [O, I]
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_b = g.sum(0)
        return grad_x, grad_w, grad_b


def dense(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """F.linear(x, weight, bias), through oneDNN where `_onednn_eligible` allows it."""
    if not _onednn_eligible(x, weight):
        return F.linear(x, weight, bias)
    if torch.is_grad_enabled():
        return _OneDnnLinear.apply(x, weight, bias)
    return _onednn_gemm(x, inference_weight(weight), bias)


def linear(layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """`layer(x)`, through oneDNN for a plain nn.Linear (`dense`)."""
    return dense(x, layer.weight, layer.bias) if type(layer) is nn.Linear else layer(x)


# Inference on the CPU runs the feed-forward sub-layer on this many rows (tokens) at a time. Whole, a batch of 32
# passages of 227 tokens makes a [7264, 1536] fp32 intermediate, 45 MB: past glibc's largest mmap threshold
# (32 MB), so every call maps fresh pages and faults them in, and the second GEMM reads its input back from memory.
# In chunks of 512 rows the intermediate (3 MB) stays in cache between the two GEMMs: all-MiniLM-L6-v2's encoder
# ran 11% faster on 512 such passages (`bench/bench_peak.py --texts passages`, bench/RESULTS.md), with the same
# results (GEMM rows are independent). int8's dynamically quantized Linear scales its input by the input's range,
# so there each chunk gets a scale of its own rather than the batch's one (a range over fewer rows, never coarser).
FEED_FORWARD_ROWS = 512


def by_rows(fn, x: torch.Tensor, training: bool) -> torch.Tensor:
    """fn(x) for a token-wise `fn` from and to x's width, in chunks of `FEED_FORWARD_ROWS` rows in eager CPU
    inference when x has more than twice that many rows. A module in training mode runs whole even without grad:
    cached losses replay a no-grad pass's dropout masks from its random state, drawn for the whole batch."""
    width = x.shape[-1]
    rows = x.numel() // width
    inference = not (training or torch.is_grad_enabled())
    parts = row_chunks(rows)
    if len(parts) == 1 or not inference or x.device.type != "cpu" or not native_kernels():
        return fn(x)
    flat = x.reshape(rows, width)
    out = torch.empty_like(flat)
    for part in parts:
        out[part] = fn(flat[part])
    return out.view(x.shape)


def row_chunks(rows: int) -> list[slice]:
    """The chunks of `FEED_FORWARD_ROWS` rows a pass over `rows` rows runs on: one, of all of them, up to twice that."""
    if rows <= 2 * FEED_FORWARD_ROWS:
        return [slice(0, rows)]
    return [slice(start, start + FEED_FORWARD_ROWS) for start in range(0, rows, FEED_FORWARD_ROWS)]


# oneDNN's int8 Linear (`torch.ops.onednn.qlinear_pointwise`, the kernel inductor emits for quantized CPU graphs):
# int8 products summed in int32 by VNNI where the CPU has it, rescaled to float32 with the bias, the feed-forward
# activation and the residual added in the same pass over the output.
ONEDNN_INT8 = hasattr(torch.ops.onednn, "qlinear_pointwise") and hasattr(torch.ops.onednn, "qlinear_prepack")


def int8_weight_limit() -> int:
    """The largest magnitude of Int8Linear's weights: 127 where oneDNN multiplies by VNNI (uint8 x int8 pairs summed
    straight into int32); 63 elsewhere, where AVX2's VPMADDUBSW sums the pairs into int16, which full-range inputs
    and weights overflow (oneDNN's documentation asks for 7-bit weights there). `ONEDNN_MAX_CPU_ISA` below VNNI
    (`bench/isa.py`'s AVX2 cap) counts as no VNNI."""
    cap = os.environ.get("ONEDNN_MAX_CPU_ISA", "ALL").upper()
    capped = cap not in ("ALL", "DEFAULT") and not any(isa in cap for isa in ("VNNI", "AMX", "AVX10"))
    return 127 if torch.cpu._is_vnni_supported() and not capped else 63


def onednn_int8() -> bool:
    """Whether eager int8 inference runs `Int8Linear` (oneDNN's int8 Linear multiplying by VNNI, 8-bit weights);
    elsewhere torch's dynamically quantized Linear (fbgemm) was the faster (`bert.quantization`)."""
    return ONEDNN_INT8 and int8_weight_limit() == 127


class Int8Linear(nn.Module):
    """An nn.Linear for inference in int8: its weight 8-bit per output row (symmetric, the scale the row's largest
    magnitude; 7-bit without VNNI, `int8_weight_limit`), each input 8-bit with the zero point and scale of its own
    range (taken per call), the products summed in int32 and rescaled to float32; `forward` adds the activation and
    the residual in that pass. With `smoothing` (one factor per input feature), the weight's columns are multiplied
    by it and the input's features divided by it before each is quantized: the same product, with an input whose
    few large features no longer set the scale of all the others (`quantization.smoothing_factors`)."""

    input_multiplier: torch.Tensor | None

    def __init__(self, linear: nn.Linear, smoothing: torch.Tensor | None = None):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        weight = linear.weight.detach().float()
        if smoothing is not None:
            weight = weight * smoothing[None, :]
        self.register_buffer("input_multiplier", None if smoothing is None else (1.0 / smoothing).float().contiguous())
        limit = int8_weight_limit()
        scale = weight.abs().amax(1).clamp_min(1e-12) / limit
        self.register_buffer("weight_scale", scale)
        self.register_buffer("weight_int8", torch.round(weight / scale[:, None]).clamp_(-limit, limit).to(torch.int8))
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().float().clone())
        self.zero_points = torch.zeros(self.out_features, dtype=torch.int64)
        self.packed = torch.ops.onednn.qlinear_prepack(self.weight_int8, [FEED_FORWARD_ROWS, self.in_features])

    def forward(
        self,
        x: torch.Tensor,
        activation: tuple[str, list[float], str] = ("none", [], ""),
        residual: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if residual is not None and activation[0] != "none":  # oneDNN fuses one or the other (BERT needs no both)
            return self(x, activation) + residual
        flat = x.reshape(-1, self.in_features).contiguous()
        rows = flat.shape[0]
        parts = row_chunks(rows)
        if len(parts) == 1:
            other = None if residual is None else residual.reshape(rows, self.out_features).contiguous()
            return self._rows(flat, activation, other, "add").view(*x.shape[:-1], self.out_features)
        # In chunks, as the feed-forward layer runs (`by_rows`): oneDNN's int8 GEMM ran at half its rate on
        # [7264, 384] rows as on 512; each chunk takes a scale of its own. The chunks' results are summed into their
        # rows of the output (oneDNN's "sum": in place), which holds the residual or zeros; after an activation the
        # chunks are written, not summed.
        if residual is not None:
            out = residual.reshape(rows, -1).clone()
        else:
            out = (torch.zeros if activation[0] == "none" else torch.empty)(rows, self.out_features)
        for part in parts:
            if activation[0] == "none":
                self._rows(flat[part], activation, out[part], "sum")
            else:  # (no "sum" after an activation in oneDNN's int8 Linear)
                out[part] = self._rows(flat[part], activation, None, "")
        return out.view(*x.shape[:-1], self.out_features)

    def _rows(
        self, flat: torch.Tensor, activation: tuple[str, list[float], str], other: torch.Tensor | None, how: str
    ) -> torch.Tensor:
        kernel = csrc.load_attention().quantize
        multiplier = self.input_multiplier
        if kernel is not None:
            q, scale, zero = torch.empty(flat.shape, dtype=torch.uint8), ctypes.c_float(), ctypes.c_int()
            mul = None if multiplier is None else multiplier.data_ptr()
            kernel(flat.data_ptr(), q.data_ptr(), *flat.shape, mul, ctypes.byref(scale), ctypes.byref(zero))
            x_scale, x_zero = scale.value, zero.value
        else:  # the same rule by torch's ops
            flat = flat if multiplier is None else flat * multiplier
            lo, hi = (float(v) for v in torch.aminmax(flat))
            x_scale = (max(hi, 0.0) - min(lo, 0.0)) / 255 or 0.1
            x_zero = min(max(round(-min(lo, 0.0) / x_scale), 0), 255)
            q = torch.round(flat / x_scale).add_(x_zero).clamp_(0, 255).to(torch.uint8)
        args = (q, x_scale, x_zero, self.packed, self.weight_scale, self.zero_points)
        if other is None:
            return torch.ops.onednn.qlinear_pointwise(*args, self.bias, 1.0, 0, torch.float32, *activation)
        return torch.ops.onednn.qlinear_pointwise.binary(
            *args, other, self.bias, 1.0, 0, torch.float32, 1.0, 0, how, 1.0, *activation
        )


class _CpuDropout(torch.autograd.Function):
    """F.dropout's output and gradient with the keep mask drawn as uniform floats compared with p: on the CPU
    half the time of the bernoulli_ kernel F.dropout draws it with (a fifth of a MiniLM training step went
    there). The same distribution, another random stream; the mask is kept as bool, as F.dropout keeps it."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, p: float) -> torch.Tensor:
        keep = torch.rand(x.shape) >= p  # x's shape, bool
        ctx.save_for_backward(keep)
        ctx.scale = 1.0 / (1.0 - p)
        return x.mul(keep).mul_(ctx.scale)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: torch.Tensor):
        (keep,) = ctx.saved_tensors
        return grad.mul(keep).mul_(ctx.scale), None


class _CompiledDropout(torch.autograd.Function):
    """F.dropout's output and gradient by bert.csrc's `bert_dropout`, the keep mask a hash of a seed drawn from
    torch's generator and each element's place (attention's dropout's): drawn again for the gradient, so nothing is
    kept for backward. The same distribution, another random stream."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, p: float, kernel) -> torch.Tensor:
        ctx.seed, ctx.p, ctx.kernel = _seed(), p, kernel
        return _CompiledDropout._apply(x.contiguous(), p, ctx.seed, kernel)

    @staticmethod
    def _apply(x: torch.Tensor, p: float, seed: int, kernel) -> torch.Tensor:
        out = torch.empty_like(x)
        width = x.shape[-1]
        pointers = (x.data_ptr(), out.data_ptr(), width, p, seed)
        _split(lambda first, last: kernel(*pointers, first, last), x.numel() // width, width, DROPOUT_EVENT)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: torch.Tensor):
        return _CompiledDropout._apply(grad.contiguous(), ctx.p, ctx.seed, ctx.kernel), None, None


def _seed() -> int:
    """A seed for the compiled kernels' dropout masks, from torch's generator: `torch.manual_seed`, a replayed
    random state and activation checkpointing give the same masks."""
    return int(torch.randint(0, 2**32, (), dtype=torch.int64))


def dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """F.dropout(x, p, training), on the CPU through `_CompiledDropout` where bert.csrc's kernels are built (float32,
    not under autocast), else `_CpuDropout`."""
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu" or not native_kernels():
        return F.dropout(x, p, True)
    kernel = csrc.load_attention().dropout
    if kernel is None or x.dtype != torch.float32 or x.dim() == 0 or x.numel() == 0 or torch.is_autocast_enabled("cpu"):
        return _CpuDropout.apply(x, p)
    return _CompiledDropout.apply(x, p, kernel)


class Dropout(nn.Dropout):
    """nn.Dropout through `dropout`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p, self.training)


class _AttentionDropout(torch.autograd.Function):
    """dropout(softmax(q k^T * scale + mask_bias)) v, keeping for backward only q, k, v, the mask bias and the
    dropout mask (bool), and recomputing the probabilities there. Autograd through the plain ops keeps the
    softmax, the dropout mask and the dropped probabilities: 9 bytes per [B, N, T, T] element and layer where
    this keeps 1 (all-MiniLM-L6-v2, 96 sequences of 256 tokens: 680 MB a layer, 75 MB here). The mask is kept
    rather than drawn again, which would cost more than the recomputed product and softmax together; it is drawn
    as `_CpuDropout` draws it (the same random stream). Each pass over a [B, N, T, T] tensor costs more than the
    small GEMMs around it (head size 32-64), so the scalars go where the tensors are [B, N, T, D]: the scale on q,
    dropout's 1/(1-p) on v and on the incoming gradient, and the mask bias is added in place; three passes fewer
    a layer and step (a fifth of the attention's time at 256 tokens), the results autograd's through the plain
    ops within float32 rounding."""

    @staticmethod
    def _probs(q, k, mask_bias: torch.Tensor | None, scale: float) -> torch.Tensor:
        B, N, T, D = q.shape
        S = k.shape[-2]
        scores = torch.bmm((q * scale).reshape(B * N, T, D), k.reshape(B * N, S, D).transpose(1, 2))
        scores = scores.view(B, N, T, S)
        return (scores if mask_bias is None else scores.add_(mask_bias)).softmax(-1)

    @staticmethod
    def forward(ctx, q, k, v, mask_bias: torch.Tensor | None, scale: float, p: float) -> torch.Tensor:
        probs = _AttentionDropout._probs(q, k, mask_bias, scale)
        keep = torch.rand(probs.shape) >= p  # as `_CpuDropout` draws it
        ctx.save_for_backward(q, k, v, mask_bias, keep)
        ctx.scale, ctx.keep_scale = scale, 1.0 / (1.0 - p)
        return torch.matmul(probs.mul_(keep), v * ctx.keep_scale)  # [B, N, T, D]

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: torch.Tensor):
        q, k, v, mask_bias, keep = ctx.saved_tensors
        probs = _AttentionDropout._probs(q, k, mask_bias, ctx.scale)
        grad = grad * ctx.keep_scale  # [B, N, T, D]
        grad_v = torch.matmul(probs.mul(keep).transpose(-1, -2), grad)
        grad_probs = torch.matmul(grad, v.transpose(-1, -2)).mul_(keep)  # [B, N, T, T]
        grad_scores = torch._softmax_backward_data(grad_probs, probs, -1, probs.dtype)
        grad_mask = grad_scores.sum_to_size(mask_bias.shape) if ctx.needs_input_grad[3] else None
        grad_scores = grad_scores.mul_(ctx.scale)
        grad_q = torch.matmul(grad_scores, k)
        grad_k = torch.matmul(q.transpose(-1, -2), grad_scores).transpose(-1, -2)
        return grad_q, grad_k, grad_v, grad_mask, None, None


class _CompiledTrainingAttention(torch.autograd.Function):
    """dropout(softmax(q k^T / sqrt(D) + bias), p) v per head by bert.csrc's `bert_attention_training`, forward
    and backward, on [B, T, H] tensors as the projections write them (no head transposes either way). The keep mask
    is a hash of a seed (`_seed`) and of each element's place: drawn again in the backward pass, never stored.
    Kept for backward: q, k, v, the context and one float a query row and head."""

    @staticmethod
    def forward(ctx, q, k, v, bias: torch.Tensor | None, lengths, num_heads: int, p: float, kernel) -> torch.Tensor:
        B, Tq, H = q.shape
        T, D = k.shape[1], H // num_heads
        seed = _seed()
        out, lse = torch.empty_like(q), q.new_empty(B * num_heads, Tq)
        pointers = [x.data_ptr() for x in (q, k, v)]
        pointers += [0 if x is None else x.data_ptr() for x in (bias, lengths)] + [out.data_ptr()]
        shape = (Tq, T, num_heads, D, D**-0.5, p, seed)
        _split(
            lambda first, last: kernel(*pointers, None, lse.data_ptr(), None, None, None, *shape, first, last),
            B * num_heads,
            Tq * T * D * 2,
        )
        ctx.save_for_backward(q, k, v, bias, lengths, out, lse)
        ctx.shape, ctx.kernel = shape, kernel
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: torch.Tensor):
        q, k, v, bias, lengths, out, lse = ctx.saved_tensors
        grad = grad.contiguous()
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        pointers = [x.data_ptr() for x in (q, k, v)] + [0 if x is None else x.data_ptr() for x in (bias, lengths)]
        pointers += [x.data_ptr() for x in (out, grad, lse, dq, dk, dv)]
        Tq, T, N, D = ctx.shape[:4]
        _split(lambda first, last: ctx.kernel(*pointers, *ctx.shape, first, last), q.shape[0] * N, Tq * T * D * 5)
        return dq, dk, dv, None, None, None, None, None


def training_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask_bias: torch.Tensor | None, num_heads: int, p: float
) -> torch.Tensor | None:
    """dropout(softmax(q k^T / sqrt(D) + mask_bias), p) v per head in training on the CPU, for queries [B, Tq, H]
    and keys and values [B, T, H] (heads side by side), mask_bias [B, 1, 1, T] or None, as [B, Tq, H], by bert.csrc's
    compiled kernel (`_CompiledTrainingAttention`; bench/RESULTS.md has its speed against `attention_dropout`), its
    dropout mask drawn as `_CompiledDropout` draws its own: the same distribution as F.dropout's, another random
    stream. Where each sequence's real tokens come first (the mask bias 0 there and nowhere else), the padding is
    skipped as keys and as queries: its rows of the context are zero (what padded positions hold matters to nothing
    downstream: no real token attends to them, and pooling and unpadding leave them out). None where it does not
    apply: not float32 on the CPU, autocast, tracing, a mask bias that wants a gradient, a head size it is not built
    for, or no kernel here; the caller runs `attention_dropout`."""
    B, Tq, H = q.shape
    T, D = k.shape[1], H // num_heads
    if (
        any(x.device.type != "cpu" or x.dtype != torch.float32 for x in (q, k, v))
        or D not in csrc.HEAD_SIZES
        or min(Tq, T) == 0
        or torch.is_autocast_enabled("cpu")
        or not native_kernels()
        or (mask_bias is not None and (mask_bias.shape != (B, 1, 1, T) or mask_bias.requires_grad))
    ):
        return None
    kernel = csrc.load_attention().training
    if kernel is None:
        return None
    bias = None if mask_bias is None else mask_bias.reshape(B, T).to(torch.float32).contiguous()
    lengths = None
    if bias is not None and Tq == T:
        real = bias == 0  # a padded key's bias is MASK_BIAS
        count = real.sum(1, dtype=torch.int32)
        if torch.equal(real, torch.arange(T) < count[:, None]):  # real tokens first: the padding can be skipped
            lengths = count
    q, k, v = (x.contiguous() for x in (q, k, v))
    return _CompiledTrainingAttention.apply(q, k, v, bias, lengths, num_heads, p, kernel)


def attention_dropout(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask_bias: torch.Tensor | None, scale: float, p: float
) -> torch.Tensor:
    """dropout(softmax(q k^T * scale + mask_bias), p) v in training on the CPU, where SDPA has no dropout, with
    the probabilities recomputed in the backward pass (`_AttentionDropout`). Under autocast the plain ops run
    (autograd keeps the probabilities): the backward pass would have to make autocast's casts again."""
    if torch.is_autocast_enabled("cpu"):
        return torch.matmul(dropout(_AttentionDropout._probs(q, k, mask_bias, scale), p, True), v)
    return _AttentionDropout.apply(q, k, v, mask_bias, scale, p)


# A call of the compiled attention kernel is split among the intra-op threads only when each share holds at least
# this many multiply-adds (~150 us of one core): handing a share to another thread costs ~60 us.
_SPLIT_MULTIPLY_ADDS = 1 << 23
# The kernel's calls as torch's profiler lists them (it sees torch's operators only).
ATTENTION_EVENT = "bert::compiled_attention"
DROPOUT_EVENT = "bert::compiled_dropout"
_pool: tuple[int, ThreadPoolExecutor] | None = None  # (the process that made it, the pool)
_pool_lock = threading.Lock()


def _helpers(count: int) -> ThreadPoolExecutor:
    """A pool of at least `count` threads, made on first need, again when torch's thread count grows, and in a
    forked child (whose copy of the pool has no threads)."""
    global _pool
    with _pool_lock:
        if _pool is None or _pool[0] != os.getpid() or _pool[1]._max_workers < count:
            _pool = (os.getpid(), ThreadPoolExecutor(count, thread_name_prefix="bert-attention"))
        return _pool[1]


def inference_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask_bias: torch.Tensor | None,
    num_heads: int,
    bf16_products: bool = False,
) -> torch.Tensor | None:
    """softmax(q k^T / sqrt(D) + mask_bias) v per head for queries [B, Tq, H] and keys and values [B, T, H]
    (heads side by side, as the projections write them), mask_bias [B, 1, 1, T] or None, as [B, Tq, H], by
    bert.csrc's CPU kernel (1.9x-3.5x torch's SDPA on an AMD EPYC Zen 5 core, 1.1x-2.6x on a Zen 4 core,
    bench/RESULTS.md), split among torch's intra-op threads (a bfloat16 encoder's SDPA took longer than float32's).
    The kernel multiplies in float32, or in bfloat16 pairs where it is built with them (AVX512-BF16) and the inputs
    are bfloat16 (read as they are, the context written in bfloat16) or `bf16_products` asks (an int8 encoder, whose
    inputs carry less precision than that): 1.5x-1.7x its float32 speed on 64-254 tokens; elsewhere bfloat16
    inputs are widened and the context rounded back. None where it does not apply: a gradient wanted, not float32
    or bfloat16 on the CPU, tracing or autocast, a head size it is not built for, or no kernel on this machine
    (`bert.csrc`); the caller runs torch's."""
    B, Tq, H = q.shape
    T, D = k.shape[1], H // num_heads
    if (
        torch.is_grad_enabled()
        and (q.requires_grad or k.requires_grad or v.requires_grad)
        or any(x.device.type != "cpu" or x.dtype not in (torch.float32, torch.bfloat16) for x in (q, k, v))
        or D not in csrc.HEAD_SIZES
        or min(Tq, T) == 0
        or torch.is_autocast_enabled("cpu")
        or not native_kernels()
        or (mask_bias is not None and (mask_bias.shape != (B, 1, 1, T) or not mask_bias.is_floating_point()))
    ):
        return None
    kernel, _, pairs_built = csrc.load_attention()[:3]
    if kernel is None:
        return None
    dtype = q.dtype
    # 2: bfloat16 tensors in and out, 1: float32 ones multiplied in pairs, 0: in float32 (attention.cpp)
    products = (2 if dtype == torch.bfloat16 else int(bf16_products)) if pairs_built else 0
    q, k, v = (x.to(torch.float32 if products < 2 else dtype).contiguous() for x in (q, k, v))
    bias = None if mask_bias is None else mask_bias.reshape(B, T).to(torch.float32).contiguous()
    out = torch.empty_like(q)
    pointers = (q.data_ptr(), k.data_ptr(), v.data_ptr(), 0 if bias is None else bias.data_ptr(), out.data_ptr())
    heads = B * num_heads

    _split(
        lambda first, last: kernel(*pointers, Tq, T, num_heads, D, D**-0.5, first, last, products),
        heads,
        Tq * T * D * 2,
    )
    return out.to(dtype)


def _split(call, units: int, multiply_adds: int, event: str = ATTENTION_EVENT) -> None:
    """call(first, last) over units (heads, rows) 0..units-1, split among torch's intra-op threads by
    `_SPLIT_MULTIPLY_ADDS` (`multiply_adds` a unit), listed by the profiler as `event`; a kernel's nonzero status is
    its buffers (a few KB a thread) not allocated."""

    def run(first: int, last: int) -> None:
        if call(first, last) != 0:
            raise MemoryError("the attention kernel could not allocate its buffers")

    shares = min(torch.get_num_threads(), units, max(1, units * multiply_adds // _SPLIT_MULTIPLY_ADDS))
    bounds = [units * i // shares for i in range(shares + 1)]
    with torch.profiler.record_function(event):
        others = (
            [_helpers(shares - 1).submit(run, a, b) for a, b in zip(bounds[1:-1], bounds[2:])] if shares > 1 else []
        )
        run(bounds[0], bounds[1])
        for share in others:
            share.result()
