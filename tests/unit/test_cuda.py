"""The model on a CUDA device: the same outputs and gradients as on the CPU, on the padded and the unpadded path.

Marked `gpu`: the default run (`-m 'not slow and not gpu'`) leaves it out; `python -m pytest -m gpu` runs it where
torch sees a CUDA device, and skips it, saying so, where it does not.
"""

from __future__ import annotations

import pytest
import torch

from bert.distributed import autocast
from bert.modeling import BertForSequenceClassification

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"),
]


@pytest.mark.parametrize("unpad", [False, True], ids=["padded", "unpadded"])
def test_cuda_step_equals_cpu_step(tiny_config, unpad):
    tiny_config.hidden_dropout_prob = tiny_config.attention_probs_dropout_prob = 0.0
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(0, tiny_config.vocab_size, (4, 16), generator=g)
    mask = (torch.arange(16) < torch.tensor([16, 9, 5, 12])[:, None]).long()  # [B, T]
    labels = torch.tensor([0, 1, 2, 1])
    results = []
    for device in ("cpu", "cuda"):
        torch.manual_seed(0)
        model = BertForSequenceClassification(tiny_config, num_labels=3).train().to(device)
        model.set_unpad(unpad)
        out = model(ids.to(device), mask.to(device), labels=labels.to(device))
        out.loss.backward()
        results.append((out.logits.cpu(), {n: p.grad.cpu() for n, p in model.named_parameters()}))
    (cpu_logits, cpu_grads), (cuda_logits, cuda_grads) = results
    torch.testing.assert_close(cuda_logits, cpu_logits, atol=1e-4, rtol=1e-4)
    for n in cpu_grads:
        torch.testing.assert_close(cuda_grads[n], cpu_grads[n], atol=1e-4, rtol=1e-3, msg=n)

    # The bf16 autocast of --precision=bf16 computes in bfloat16 on the GPU and stays close to fp32.
    with autocast(torch.device("cuda"), "bf16"):
        low = model(ids.cuda(), mask.cuda()).logits
    assert low.dtype == torch.bfloat16
    torch.testing.assert_close(low.float().cpu(), cpu_logits, atol=5e-2, rtol=5e-2)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_cuda_encoder_in_a_reduced_dtype_stays_close_and_float32(tiny_config, dtype):
    """--dtype=float16|bfloat16 on CUDA: the blocks in that type, outputs float32 within its rounding."""
    g = torch.Generator().manual_seed(6)
    ids = torch.randint(0, tiny_config.vocab_size, (4, 16), generator=g)
    mask = (torch.arange(16) < torch.tensor([16, 9, 5, 12])[:, None]).long()  # [B, T]
    torch.manual_seed(0)
    model = BertForSequenceClassification(tiny_config, num_labels=3).eval().cuda()
    with torch.inference_mode():
        full = model(ids.cuda(), mask.cuda()).logits
        model.set_encoder_dtype(dtype)
        reduced = model(ids.cuda(), mask.cuda()).logits
    assert reduced.dtype == torch.float32
    torch.testing.assert_close(reduced, full, atol=5e-2, rtol=5e-2)
