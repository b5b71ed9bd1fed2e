"""`bert pretrain --plan` (`bert.plan`): the FLOPs formula equals torch's FLOP counter, the activation formula
equals what autograd saves, the predicted peak memory is within 20% of the measured CPU peak for 3 shapes,
and the command prints the plan without reading data or writing anything."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from bert import cpu_kernels
from bert.config import BertConfig
from bert.errors import InputError
from bert.modeling import BertForPreTraining
from bert.plan import Shape, activation_bytes, make_plan, parse_devices, step_flops
from conftest import cli_error, shared_path

TINY = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
            max_position_embeddings=64)  # fmt: skip


def _batch(config: BertConfig, shape: Shape) -> dict[str, torch.Tensor]:
    b, s, m = shape.batch, shape.seq, shape.predictions
    return {
        "input_ids": torch.randint(5, config.vocab_size, (b, s)),
        "attention_mask": torch.ones(b, s, dtype=torch.long),
        "token_type_ids": torch.zeros(b, s, dtype=torch.long),
        "masked_lm_positions": torch.randint(1, s, (b, m)).sort(1).values,
        "masked_lm_ids": torch.randint(5, config.vocab_size, (b, m)),
        "masked_lm_weights": torch.ones(b, m),
        "next_sentence_labels": torch.zeros(b, 1, dtype=torch.long),
    }


@pytest.mark.parametrize("checkpointing", [False, True])
def test_flops_per_step_equal_torchs_flop_counter(checkpointing, monkeypatch):
    monkeypatch.setattr(cpu_kernels, "_ONEDNN_LINEAR", False)  # the counter knows aten's matmuls, not oneDNN's op
    config, shape = BertConfig(**TINY), Shape(3, 16, 4)
    model = BertForPreTraining(config).train()
    model.gradient_checkpointing_enable(checkpointing)
    with FlopCounterMode(display=False) as counter:
        model(**_batch(config, shape)).total_loss.backward()
    # attention dropout on the CPU recomputes QK^T in the backward pass (`cpu_kernels.attention_dropout`)
    assert step_flops(config, shape, checkpointing, recompute_attention=True) == counter.get_total_flops()


SHAPES = [({}, Shape(4, 32, 5)), (dict(num_attention_heads=8, intermediate_size=96), Shape(2, 48, 7))]


@pytest.mark.parametrize("checkpointing", [False, True])
@pytest.mark.parametrize(("overrides", "shape"), SHAPES)
def test_activation_formula_equals_what_autograd_saves(overrides, shape, checkpointing):
    config = BertConfig(**{**TINY, "hidden_dropout_prob": 0.1, **overrides})
    model = BertForPreTraining(config).train()
    model.gradient_checkpointing_enable(checkpointing)
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(**_batch(config, shape))
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    kept = sum(n for ptr, n in saved.items() if ptr not in weights)
    predicted = activation_bytes(config, shape, gradient_checkpointing=checkpointing)
    if checkpointing:  # the plan adds the layer recomputed in the backward pass, which the forward does not keep
        one_layer = activation_bytes(config, shape) - activation_bytes(
            BertConfig(**{**TINY, **overrides, "num_hidden_layers": 1}), shape
        )
        predicted -= one_layer
    assert predicted == pytest.approx(kept, rel=0.02)


# Three shapes, each some hundreds of MB at its peak, so that the runtime's own memory is small beside it
# (two of them `slow`; bench/bench_plan.py measures all three).
MEMORY_SHAPES = [
    pytest.param(dict(num_hidden_layers=4, hidden_size=256, num_attention_heads=4, intermediate_size=1024,
                      vocab_size=30522), Shape(8, 128, 20), marks=pytest.mark.slow),
    pytest.param(dict(num_hidden_layers=2, hidden_size=512, num_attention_heads=8, intermediate_size=2048,
                      vocab_size=8000), Shape(4, 256, 40), marks=pytest.mark.slow),
    (dict(num_hidden_layers=6, hidden_size=128, num_attention_heads=2, intermediate_size=512, vocab_size=30522),
     Shape(32, 64, 10)),
]  # fmt: skip
MEASURE = """
import json, sys
from bert.config import BertConfig
from bert.plan import Shape, measure_cpu_peak
fields, shape = json.loads(sys.argv[1])
print(measure_cpu_peak(BertConfig(max_position_embeddings=512, **fields), Shape(*shape)))
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="measures the peak through /proc (Linux)")
@pytest.mark.parametrize(("fields", "shape"), MEMORY_SHAPES)
def test_predicted_peak_memory_is_within_20_percent_of_the_measured_cpu_peak(fields, shape):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MALLOC_MMAP_THRESHOLD_": "131072"}
    arg = json.dumps([fields, [shape.batch, shape.seq, shape.predictions]])
    done = subprocess.run([sys.executable, "-c", MEASURE, arg], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    measured = int(done.stdout.split()[-1])
    plan = make_plan(BertConfig(max_position_embeddings=512, **fields), train_batch_size=shape.batch,
                     max_seq_length=shape.seq, max_predictions_per_seq=shape.predictions)  # fmt: skip
    predicted = plan["memory_per_device"]["no_checkpointing"]["peak"]
    assert abs(predicted - measured) <= 0.2 * measured, (predicted, measured)


def test_fsdp_divides_weights_gradients_and_optimizer_state():
    config = BertConfig(**TINY)
    common = dict(train_batch_size=8, max_seq_length=32, max_predictions_per_seq=5, devices="8xH100")
    ddp, fsdp = make_plan(config, **common), make_plan(config, fsdp=True, **common)
    for key in ("parameters", "gradients", "optimizer_state"):
        a, b = ddp["memory_per_device"]["no_checkpointing"][key], fsdp["memory_per_device"]["no_checkpointing"][key]
        assert b == a // 8
    assert ddp["micro_batch_per_device"] == 1
    # The time: the global batch's FLOPs over 8 devices at the stated MFU of the H100's bf16 peak.
    bf16 = make_plan(config, precision="bf16", mfu=0.5, **common)
    flops = bf16["flops_per_step"]["no_checkpointing"]
    assert bf16["seconds_per_step"]["no_checkpointing"] == pytest.approx(flops / (8 * 989e12 * 0.5))


def test_plan_devices_are_checked():
    assert parse_devices("8xH100") == (8, "H100") and parse_devices("cpu") == (1, "cpu")
    for bad in ("8xTPU", "0xH100", "H100x8"):
        with pytest.raises(InputError, match="--plan_devices"):
            parse_devices(bad)


def test_pretrain_plan_prints_and_writes_nothing(tmp_path, capsys):
    from bert.cli import main

    out = tmp_path / "out"
    argv = ["--plan", "--bert_config_file=base", f"--input_file={tmp_path / 'no-data'}",
            f"--output_dir={out}", "--plan_devices=8xH100", "--precision=bf16", "--train_batch_size=256",
            "--max_predictions_per_seq=20", "--num_train_steps=1000",
            f"--vocab_file={shared_path('data', 'vocab', 'uncased.txt')}"]  # fmt: skip
    assert main(["pretrain", *argv]) == 0
    text = capsys.readouterr().out
    assert "plan: 8 x H100, bf16, DDP, 110,106,428 parameters, 32 sequences per device" in text
    assert "hours for 1000 steps" in text and "fits" in text
    assert not out.exists()
    assert "--plan_devices=2xTPU: give N x a device" in cli_error(capsys, "pretrain", *argv, "--plan_devices=2xTPU")
    assert "--plan_mfu=1.5 must be in (0, 1]" in cli_error(capsys, "pretrain", *argv, "--plan_mfu=1.5")
