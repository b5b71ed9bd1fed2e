"""A plan before a run: memory per device, FLOPs per step and time at a stated MFU, without training.

Memory per device, in bytes:
- parameters, gradients and optimizer state (the original AdamW and LAMB keep two fp32 moments per weight)
  in fp32, whatever `--precision` (autocast keeps fp32 master weights); `--fsdp` divides all three by the
  world size.
- activations: what autograd keeps for the backward pass of one micro-batch. Per encoder layer (b sequences
  of s tokens, hidden h, a heads, intermediate i), counted on this implementation's CPU kernels with dropout
  on (the released configs): fp32 copies of 8 [b, s, h] tensors, 2 [b, s, i] (the GELU's input and output),
  LayerNorm statistics, and for attention [b, a, s] floats (bert.csrc's training kernel, head sizes 32 and 64:
  `cpu_kernels.training_attention`, which draws its dropout masks again in the backward pass, as the hidden
  layers' dropout does). Without the compiled kernels (no compiler here, or under autocast), two bool dropout
  masks of [b, s, h] and the bool dropout mask of the [b, a, s, s] attention probabilities (the backward pass
  recomputes the probabilities: `cpu_kernels.attention_dropout`; under autocast the probabilities before and
  after dropout too); with the compiled dropout but another head size, the latter alone. On CUDA (not
  measured: no GPU here) the plan counts 10 [b, s, h] and the fused SDPA kernels' [b, a, s] instead of
  [b, a, s, s]; bf16/fp16 halve the tensors autocast computes. The last layer runs its queries, attention
  output and feed-forward at [CLS] and the m masked positions alone (`BertModel`'s `output_positions`): its
  input, keys and values stay [b, s, h], the rest is [b, 1 + m, ...], and it keeps the gathered rows too.
  The embeddings keep a [b, s, h] (their output is the first layer's input) and, without the compiled
  dropout, a bool mask, and the heads
  4 h + V values per masked position (the log-softmax over the vocabulary).
  With `--gradient_checkpointing` each layer keeps its input only, and one layer's activations exist again
  while it is recomputed.
- the peak: weights, optimizer state and the activations at the end of the forward pass, plus the larger
  of what joins them in the backward pass: at its start the masked-LM head's gradients (log-probabilities,
  logits, the decoder's part of the word embeddings), later the weights' gradients, as the activations
  are freed. Checked on the CPU against the measured peak (`measure_cpu_peak`, bench/bench_plan.py).

FLOPs per step: matrix products only (2 multiply-adds per weight per token, attention's two products of
s x s x h per sequence; the last layer's queries, output and feed-forward at 1 + m tokens), forward x 3 for
forward and backward (x 4 for the encoder with gradient checkpointing, which recomputes its forward; on the
CPU with attention dropout plus QK^T once more, which its backward pass recomputes), over the global batch.
`tests/unit/test_plan.py` checks the count against `torch.utils.flop_counter.FlopCounterMode`.

Time: FLOPs / (devices x peak FLOP/s x MFU). The peaks are the vendors' dense figures (`DEVICES`).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any

import torch

from bert import csrc
from bert.config import BertConfig
from bert.errors import InputError
from bert.modeling import BertForPreTraining
from bert.optimization import create_optimizer

# Dense peak FLOP/s by precision, and memory in bytes. H100 SXM5, H200 SXM and A100 SXM4: NVIDIA's data sheets
# (bf16/fp16 tensor cores without sparsity; fp32 is TF32 on tensor cores, which fp32 matmuls use with
# torch.backends.cuda.matmul.allow_tf32). The H200 is the H100's chip with 141 GB of faster memory.
DEVICES: dict[str, dict[str, Any]] = {
    "H100": {"flops": {"bf16": 989e12, "fp16": 989e12, "fp32": 495e12}, "memory": 80 * 2**30},
    "H200": {"flops": {"bf16": 989e12, "fp16": 989e12, "fp32": 495e12}, "memory": 141 * 10**9},
    "A100": {"flops": {"bf16": 312e12, "fp16": 312e12, "fp32": 156e12}, "memory": 80 * 2**30},
}
OPTIMIZER_STATES = {"adamw_bert": 2, "adamw": 2, "lamb": 2}  # fp32 tensors per weight
FP32 = 4


@dataclass(frozen=True)
class Shape:
    """What a step computes on one device: `batch` sequences of `seq` tokens, `predictions` masked positions
    each."""

    batch: int
    seq: int
    predictions: int


def num_parameters(config: BertConfig) -> int:
    """The parameters of BertForPreTraining of `config`, counted on the meta device (nothing allocated)."""
    with torch.device("meta"):
        model = BertForPreTraining(config)
    return sum(p.numel() for p in model.parameters())


def _layer_bytes(config: BertConfig, shape: Shape, cuda: bool, half: bool, last: bool = False) -> int:
    """A layer's activations; `last`: the last layer, whose queries, attention output and feed-forward run at
    q = 1 + m rows of each sequence (its input, keys and values at all s; the gathered rows kept too)."""
    b, s, h, i, a = shape.batch, shape.seq, config.hidden_size, config.intermediate_size, config.num_attention_heads
    q = 1 + shape.predictions if last else s
    # the input, keys and values [b, s, h]; queries, context, two LayerNorm inputs and the feed-forward input
    rows = 3 * b * s * h + (6 if last else 5) * b * q * h
    if cuda:  # the fused SDPA kernels keep [b, a, q] log-sum-exps instead of the probabilities
        return (2 if half else FP32) * (rows + 2 * b * q * h + 2 * b * q * i) + b * a * q * FP32 + FP32 * 4 * b * q
    dropout, attention = _compiled(config, half)
    # without the compiled dropout, two bool dropout masks [b, q, h]; the compiled attention keeps [b, a, q] floats,
    # torch's ops the probabilities' bool dropout mask [b, a, q, s], and under autocast the probabilities (fp32: the
    # mask bias promotes them) before and after dropout too
    masks = 0 if dropout else 2 * b * q * h
    scores = FP32 * b * a * q if attention else (2 * FP32 + 1 if half else 1) * b * a * q * s
    return (2 if half else FP32) * (rows + 2 * b * q * i) + masks + scores + FP32 * 4 * b * q


def _compiled(config: BertConfig, half: bool) -> tuple[bool, bool]:
    """Whether CPU training here runs bert.csrc's dropout and its attention with dropout (float32 only; the
    attention for head sizes it is built for)."""
    built = not half and csrc.load_attention().dropout is not None
    return built, built and config.head_size in csrc.HEAD_SIZES


def activation_bytes(
    config: BertConfig, shape: Shape, cuda: bool = False, half: bool = False, gradient_checkpointing: bool = False
) -> int:
    """Bytes autograd keeps for one micro-batch's backward (see the module docstring)."""
    b, s, m, h, v = shape.batch, shape.seq, shape.predictions, config.hidden_size, config.vocab_size
    # the LayerNorm's input and, without the compiled dropout, its bool mask; their output is the first layer's
    # input, counted there
    embeddings = FP32 * (b * s * h + 8 * b * s) + (0 if not cuda and _compiled(config, half)[0] else b * s * h)
    heads = FP32 * b * m * (v + 4 * h + 7) + FP32 * b * (h + 5)
    layer, last = _layer_bytes(config, shape, cuda, half), _layer_bytes(config, shape, cuda, half, last=True)
    if gradient_checkpointing:  # and the largest layer's activations, while it is recomputed
        layer_inputs = config.num_hidden_layers * (2 if half else FP32) * b * s * h
        return layer_inputs + (layer if config.num_hidden_layers > 1 else last) + embeddings + heads
    return (config.num_hidden_layers - 1) * layer + last + embeddings + heads


def step_flops(
    config: BertConfig, shape: Shape, gradient_checkpointing: bool = False, recompute_attention: bool = False
) -> int:
    """Matrix-product FLOPs of one training step on `shape` (forward and backward); `recompute_attention`:
    QK^T once more per layer, as the CPU's attention dropout recomputes it (`cpu_kernels.attention_dropout`)."""
    b, s, m = shape.batch, shape.seq, shape.predictions
    h, i, v = config.hidden_size, config.intermediate_size, config.vocab_size

    def layer(q: int) -> int:  # K and V at s tokens; Q, output, FFN at q; QK^T and PV of q queries
        return b * s * 2 * 2 * h * h + b * q * (2 * 2 * h * h + 2 * 2 * h * i) + 2 * 2 * b * q * s * h

    encoder = (config.num_hidden_layers - 1) * layer(s) + layer(1 + m)  # the last at [CLS] and the masked positions
    heads = b * m * (2 * h * h + 2 * h * v) + b * (2 * h * h + 2 * h * 2)  # MLM transform + decoder; pooler + NSP
    queries = (config.num_hidden_layers - 1) * s + 1 + m
    recomputed = 2 * b * queries * s * h if recompute_attention else 0
    return 3 * (encoder + heads) + (encoder if gradient_checkpointing else 0) + recomputed


def parse_devices(spec: str) -> tuple[int, str]:
    """`8xH100` -> (8, "H100"); `H100` -> (1, "H100"); `cpu` -> (1, "cpu")."""
    m = re.fullmatch(r"(?:(\d+)x)?([A-Za-z0-9]+)", spec.strip())
    name = m.group(2) if m else ""
    if m is None or (name not in DEVICES and name.lower() != "cpu") or (m.group(1) is not None and int(m.group(1)) < 1):
        raise InputError(
            f"--plan_devices={spec}: give N x a device, e.g. 8xH100 ({', '.join(DEVICES)}), or cpu (this machine)"
        )
    return int(m.group(1) or 1), ("cpu" if name.lower() == "cpu" else name)


def check_plan_flags(devices: str, mfu: float) -> tuple[int, str]:
    """--plan_devices and --plan_mfu, checked before a model is read; returns the parsed devices."""
    if not 0 < mfu <= 1:
        raise InputError(f"--plan_mfu={mfu} must be in (0, 1]")
    return parse_devices(devices)


def measured_cpu_flops(seconds: float = 0.5) -> float:
    """This machine's fp32 matmul FLOP/s with the threads torch uses (a short measurement)."""
    n = 512
    x, y = torch.randn(n, n), torch.randn(n, n)
    x @ y
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        x @ y
        count += 1
    return 2 * n**3 * count / (time.perf_counter() - start)


def make_plan(
    config: BertConfig,
    *,
    train_batch_size: int,
    max_seq_length: int,
    max_predictions_per_seq: int,
    gradient_accumulation_steps: int = 1,
    num_train_steps: int = 1,
    devices: str = "cpu",
    precision: str = "fp32",
    optimizer: str = "adamw_bert",
    fsdp: bool = False,
    mfu: float = 0.4,
) -> dict[str, Any]:
    """The plan of a pre-training run (see the module docstring); JSON-able."""
    count, kind = check_plan_flags(devices, mfu)
    parts = count * gradient_accumulation_steps
    if train_batch_size % parts:
        raise InputError(
            f"--train_batch_size={train_batch_size} must be divisible by devices x --gradient_accumulation_steps "
            f"= {count} x {gradient_accumulation_steps} = {parts}"
        )
    micro = Shape(train_batch_size // parts, max_seq_length, max_predictions_per_seq)
    cuda, half = kind != "cpu", precision in ("bf16", "fp16")
    n = num_parameters(config)
    memory = _memory_per_device(config, micro, cuda, half, n, count if fsdp else 1, optimizer)
    recompute = not cuda and config.attention_probs_dropout_prob > 0
    flops = {
        name: step_flops(config, Shape(train_batch_size, max_seq_length, max_predictions_per_seq), ckpt, recompute)
        for name, ckpt in (("no_checkpointing", False), ("gradient_checkpointing", True))
    }
    if kind == "cpu":
        peak_flops, device_memory = measured_cpu_flops(), None
        peak_source = "measured fp32 matmul on this machine"
    else:
        peak_flops, device_memory = DEVICES[kind]["flops"][precision], DEVICES[kind]["memory"]
        peak_source = f"{kind} dense {precision} peak"
    step_seconds = {name: f / (count * peak_flops * mfu) for name, f in flops.items()}
    return {
        "devices": count,
        "device": kind,
        "device_memory": device_memory,
        "peak_flops_per_device": peak_flops,
        "peak_source": peak_source,
        "mfu": mfu,
        "precision": precision,
        "fsdp": fsdp,
        "parameters": n,
        "micro_batch_per_device": micro.batch,
        "memory_per_device": memory,
        "flops_per_step": flops,
        "seconds_per_step": step_seconds,
        "sequences_per_second": {k: train_batch_size / t for k, t in step_seconds.items()},
        "hours_for_run": {k: t * num_train_steps / 3600 for k, t in step_seconds.items()},
        "num_train_steps": num_train_steps,
    }


def _memory_per_device(
    config: BertConfig, micro: Shape, cuda: bool, half: bool, n: int, shard: int, optimizer: str
) -> dict[str, dict[str, int]]:
    """Each device's bytes of a step, without and with gradient checkpointing, of `n` parameters (sharded over
    `shard` devices)."""
    weights = n * FP32 // shard
    states = OPTIMIZER_STATES[optimizer] * n * FP32 // shard
    # At the start of the backward pass the masked-LM head's gradients (log-probabilities, logits, the word
    # embeddings' decoder part) join the activations; later the weights' gradients do, as activations go.
    v, h = config.vocab_size, config.hidden_size
    head_grads = FP32 * (2 * micro.batch * micro.predictions * v + v * h)
    memory = {}
    for name, ckpt in (("no_checkpointing", False), ("gradient_checkpointing", True)):
        act = activation_bytes(config, micro, cuda, half, ckpt)
        memory[name] = {
            "parameters": weights,
            "gradients": weights,
            "optimizer_state": states,
            "activations": act,
            "peak": weights + states + act + max(weights, head_grads),
        }
    return memory


def _rss(field: str) -> int:
    """A memory figure of this process from /proc/self/status (Linux), in bytes."""
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise OSError(f"/proc/self/status has no {field}")


def measure_cpu_peak(config: BertConfig, shape: Shape, optimizer: str = "adamw_bert", steps: int = 2) -> int:
    """The growth of this process's peak resident memory over `steps` fp32 training steps of a fresh model
    on random data of `shape`, on the CPU (Linux: the peak is reset through /proc/self/clear_refs). Run it
    in a fresh process with MALLOC_MMAP_THRESHOLD_=131072: memory freed earlier and kept by the allocator
    would hide allocations, and with glibc's adaptive threshold freed blocks stay resident, so the peak
    would be the allocator's, not the live tensors'."""
    b, s, m = shape.batch, shape.seq, shape.predictions
    gen = torch.Generator().manual_seed(0)

    def random_batch(config: BertConfig, b: int, s: int, m: int) -> dict[str, torch.Tensor]:
        return {
            "input_ids": torch.randint(5, config.vocab_size, (b, s), generator=gen),
            "attention_mask": torch.ones(b, s, dtype=torch.long),
            "token_type_ids": torch.zeros(b, s, dtype=torch.long),
            "masked_lm_positions": torch.randint(1, s, (b, m), generator=gen).sort(1).values,
            "masked_lm_ids": torch.randint(5, config.vocab_size, (b, m), generator=gen),
            "masked_lm_weights": torch.ones(b, m),
            "next_sentence_labels": torch.zeros(b, 1, dtype=torch.long),
        }

    def train(config: BertConfig, batch: dict[str, torch.Tensor]) -> None:
        model = BertForPreTraining(config)
        model.train()
        opt, _ = create_optimizer(model, 1e-4, 10, 1, optimizer)
        for _ in range(steps):
            model(**batch).total_loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

    # A tiny model first: the runtime's own first-use allocations (kernels, thread pools) are not the plan's.
    tiny = BertConfig(vocab_size=99, hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16)
    train(tiny, random_batch(tiny, 2, 8, 2))
    batch = random_batch(config, b, s, m)
    with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
        f.write("5")  # the peak (VmHWM) starts again from the current resident size
    before = _rss("VmRSS")
    train(config, batch)
    return _rss("VmHWM") - before


def _gib(x: float) -> str:
    return f"{x / 2**30:.2f} GiB"


def format_plan(plan: dict[str, Any]) -> str:
    """The plan as the terminal shows it: one column without, one with gradient checkpointing."""
    cols = ("no_checkpointing", "gradient_checkpointing")

    def row(label: str, values: dict[str, Any], fmt: Any) -> str:
        return f"  {label:<24}" + "".join(f"{fmt(values[c]):>24}" for c in cols)

    mem = plan["memory_per_device"]
    lines = [
        f"plan: {plan['devices']} x {plan['device']}, {plan['precision']}, {'FSDP' if plan['fsdp'] else 'DDP'}, "
        f"{plan['parameters']:,} parameters, {plan['micro_batch_per_device']} sequences per device and micro-batch",
        f"  {'per device':<24}{'no checkpointing':>24}{'gradient checkpointing':>24}",
    ]
    for key in ("parameters", "gradients", "optimizer_state", "activations", "peak"):
        lines.append(row(key, {c: mem[c][key] for c in cols}, _gib))
    if plan["device_memory"]:
        fits = {c: "fits" if mem[c]["peak"] <= plan["device_memory"] else "does not fit" for c in cols}
        lines.append(row(f"in {_gib(plan['device_memory'])}", fits, str))
    lines.append(row("TFLOPs per step", plan["flops_per_step"], lambda f: f"{f / 1e12:.3f}"))
    peak = plan["peak_flops_per_device"] / 1e12
    lines.append(f"at {plan['mfu']:.0%} MFU of {peak:.1f} TFLOP/s per device ({plan['peak_source']}):")
    lines.append(row("seconds per step", plan["seconds_per_step"], lambda t: f"{t:.4f}"))
    lines.append(row("sequences per second", plan["sequences_per_second"], lambda r: f"{r:.1f}"))
    lines.append(row(f"hours for {plan['num_train_steps']} steps", plan["hours_for_run"], lambda h: f"{h:.2f}"))
    return "\n".join(lines)
