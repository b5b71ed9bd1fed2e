"""int8 inference on CPU: the Linear layers in 8-bit integers.

On a CPU with VNNI every `nn.Linear` of the encoder and the heads is replaced by `bert.cpu_kernels.Int8Linear`:
its weight is stored as 8-bit integers (one scale per output row), and at run time each input (each chunk of 512
rows) is quantized to 8 bits with the zero point and scale of its own range, multiplied in integers by oneDNN's
int8 Linear and rescaled to fp32 with the bias, the feed-forward activation and the residual added in that pass.
Against torch's dynamically quantized Linear (fbgemm, 7-bit weights, the activation and the residual as passes of
their own) this path ran all-MiniLM-L6-v2's passages 1.05x faster at one thread and its embeddings nearer fp32's
(mean cosine 0.9928 against 0.9909; bench/RESULTS.md). Without VNNI (AVX2's products sum pairs into int16, so the
weights must be 7-bit either way) fbgemm's was the faster, and a model to be traced (`bert export
--format=torchscript --quantize=int8`) needs a module TorchScript can save: both take torch's dynamically quantized
Linear, its weights 7-bit and its inputs 8-bit (not torch's default of 8-bit weights and 7-bit inputs: BERT's
LayerNorm outputs have a few outlier features that set the input's scale, so the input's resolution matters more:
STS-B Spearman 86.61 against 86.30, fp32 86.72). Embeddings, LayerNorm and attention's softmax stay in fp32;
attention's products are taken in bfloat16 pairs where the CPU has AVX512-BF16 (`BertSelfAttention.bf16_products`,
bert.csrc's kernel), which round less than the int8 projections feeding them. The Linear layers hold about 85% of
BERT-Base's weights and most of its time, and their int8 weights take a quarter of the fp32 bytes (half where
Int8Linear keeps oneDNN's packed copy beside them), so the model is smaller in memory and runs faster on CPUs
without bf16 matrix units; the outputs move by about 1% (see bench/RESULTS.md for the measured cost on real tasks).

On oneDNN's path the inputs of the query, key, value and first feed-forward layers are smoothed first
(`smoothing_factors`; SmoothQuant, Xiao et al. 2023): a LayerNorm output's few large features are divided down and
the weight's matching columns multiplied up, so that the input's 8 bits resolve its other features; the factors
come from the model's own LayerNorm outputs on a fixed batch of random tokens (no data needed, the same factors on
every run; one forward pass of 2 x 128 tokens when the model is quantized). all-MiniLM-L6-v2's STS-B embeddings
came 1.75x nearer fp32's (mean cosine 0.99629 against 0.99349; bench/RESULTS.md), at no measurable cost in speed.

The masked-LM decoder is left in fp32: its weight is the word-embedding table (tied, as in the original), which the
embedding lookup needs unquantized.
"""

from __future__ import annotations

import warnings
from typing import cast

import torch
from torch import nn

from bert.cpu_kernels import Int8Linear, onednn_int8
from bert.errors import InputError
from bert.flags import QUANTIZE_CHOICES
from bert.modeling import BertLayer, BertModel, BertSelfAttention

_QCONFIG = torch.ao.quantization.QConfig(
    activation=torch.ao.quantization.PlaceholderObserver.with_args(
        dtype=torch.quint8, quant_min=0, quant_max=255, is_dynamic=True
    ),
    weight=torch.ao.quantization.PerChannelMinMaxObserver.with_args(
        dtype=torch.qint8, qscheme=torch.per_channel_symmetric, quant_min=-64, quant_max=63
    ),
)


def quantize_int8(model: nn.Module, bf16_products: bool = True) -> nn.Module:
    """Quantize every Linear layer of `model` (in eval mode, in place) to int8 weights for CPU inference, and
    let its attention multiply in bfloat16 pairs where the kernel can (`bf16_products`). `bf16_products=False`
    is for a model to be traced: its Linear layers are torch's dynamically quantized ones (which TorchScript
    saves) and its graph runs torch's float32 attention, so its eager outputs are the graph's.

    Returns the same model object. The model must stay on the CPU: the int8 Linear layers have no CUDA kernels.
    """
    model.eval()
    linears = {name for name, m in model.named_modules() if type(m) is nn.Linear and not _is_tied_decoder(name)}
    # oneDNN's int8 Linear where it multiplies by VNNI (8-bit weights); without VNNI torch's fbgemm path ran
    # all-MiniLM-L6-v2 1.03x faster (the AVX2 cap, bench/RESULTS.md), both with 7-bit weights, and 1.03x-1.06x
    # faster than oneDNN's with the smoothing, whose STS-B embeddings there were 1.6x nearer fp32's: speed kept.
    if bf16_products and onednn_int8():
        factors = smoothing_factors(model)
        for name in linears:
            owner, _, attr = name.rpartition(".")
            parent = model.get_submodule(owner)
            linear = getattr(parent, attr)
            setattr(parent, attr, Int8Linear(linear, factors.get(linear)))
    else:
        with warnings.catch_warnings():
            # torch.ao.quantization warns that it will move to the torchao package; in the torch versions this
            # project admits (< 2.14) it is present, and TorchScript saves its modules.
            warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"torch\.ao")
            warnings.filterwarnings("ignore", message=r".*torch\.ao\.quantization is deprecated")
            warnings.filterwarnings("ignore", message=r".*quantized tensor creation functions.*deprecated")
            torch.ao.quantization.quantize_dynamic(model, {name: _QCONFIG for name in linears}, inplace=True)
    for m in model.modules():
        if isinstance(m, torch.ao.nn.quantized.dynamic.Linear):
            # Version 4 of the module quantizes its input to 7 bits (reduce_range=True); version 3 to 8 bits.
            m.version = 3
        elif isinstance(m, BertSelfAttention):
            m.bf16_products = bf16_products
    return model


# SmoothQuant's migration strength: the factor is (input's largest magnitude)^alpha / (weight column's)^(1 - alpha).
# 0.5, its paper's default, splits the range evenly between the two (0.3-0.85 moved all-MiniLM-L6-v2's STS-B
# embeddings alike, bench/RESULTS.md).
SMOOTHING_ALPHA = 0.5
# The calibration batch: random token ids of the vocabulary's upper part (BERT's first thousand are padding, unused
# slots and specials); BERT's outlier features are the weights' doing and show on any tokens: these factors moved
# the embeddings as near fp32's as factors from 200 STS-B sentences (mean cosine 0.99636 against 0.99646). 1, 2, 4
# and 8 sequences gave the same (0.99629-0.99631); 2 cost all-MiniLM-L6-v2's quantization 64 ms, 8 198 ms.
CALIBRATION_SHAPE = (2, 128)


def smoothing_factors(model: nn.Module) -> dict[nn.Module, torch.Tensor]:
    """For each Linear of `model`'s encoder that reads a LayerNorm's output (query, key and value read the block
    input, the first feed-forward layer the attention's output), one factor per input feature: the LayerNorm
    output's largest magnitude over a fixed random batch to the power `SMOOTHING_ALPHA`, over the weight column's
    largest magnitude to the power 1 - alpha. Empty for a model without a `BertModel`."""
    encoder = next((m for m in model.modules() if isinstance(m, BertModel)), None)
    if encoder is None:
        return {}
    readers: dict[nn.Module, list[nn.Module]] = {}  # a LayerNorm -> the Linear layers reading its output
    norm: nn.Module = encoder.embeddings.LayerNorm
    for layer in encoder.encoder.layer:
        assert isinstance(layer, BertLayer)
        attention = layer.attention.self
        readers[norm] = [attention.query, attention.key, attention.value]
        readers[layer.attention.output.LayerNorm] = [layer.intermediate.dense]
        norm = layer.output.LayerNorm
    largest: dict[nn.Module, torch.Tensor] = {}

    def record(module: nn.Module, inputs: object, output: torch.Tensor) -> None:  # once a LayerNorm: one pass
        largest[module] = output.detach().reshape(-1, output.shape[-1]).abs().amax(0)

    hooks = [reader.register_forward_hook(record) for reader in readers]
    vocab = encoder.config.vocab_size
    batch, length = CALIBRATION_SHAPE
    length = min(length, encoder.config.max_position_embeddings)
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(min(1000, vocab // 2), vocab, (batch, length), generator=generator)
    try:
        with torch.inference_mode():
            encoder(ids, torch.ones_like(ids), torch.zeros_like(ids))
    finally:
        for hook in hooks:
            hook.remove()
    factors: dict[nn.Module, torch.Tensor] = {}
    for reader, linears in readers.items():
        x = largest[reader].clamp_min(1e-5) ** SMOOTHING_ALPHA
        for linear in linears:
            w = cast(torch.Tensor, linear.weight).detach().abs().amax(0).float().clamp_min(1e-5)
            factors[linear] = (x / w ** (1 - SMOOTHING_ALPHA)).contiguous()
    return factors


def _is_tied_decoder(name: str) -> bool:
    return name.endswith("cls.predictions.decoder")


def quantize_model(model: nn.Module, quantize: str | None, device: torch.device | str = "cpu") -> nn.Module:
    """Apply a `--quantize` flag's value ("none" or "int8") to a model about to run inference on `device`.

    Raises:
        InputError: an unknown value, or int8 on a device other than the CPU.
    """
    if quantize in (None, "none"):
        return model
    if quantize not in QUANTIZE_CHOICES:
        raise InputError(f"--quantize={quantize} is unknown; use one of {', '.join(QUANTIZE_CHOICES)}")
    if torch.device(device).type != "cpu":
        raise InputError(f"--quantize=int8 runs on the CPU only, not on {device}; pass --device=cpu or drop it")
    return quantize_int8(model)


def is_quantized(model: nn.Module) -> bool:
    """Whether `quantize_int8` was applied to `model`."""
    return any(isinstance(m, (Int8Linear, torch.ao.nn.quantized.dynamic.Linear)) for m in model.modules())
