"""The original's pre-training evaluation (run_pretraining.py, `metric_fn`): masked-LM and
next-sentence accuracy and loss over `max_eval_steps` batches read in order."""

from __future__ import annotations

import torch

from bert.batching import RecordStream
from bert.distributed import autocast
from bert.pretraining.inputs import features_to_model_inputs
from bert.utils import progress

# The keys of eval_results.txt, as run_pretraining.py writes them.
EVAL_KEYS = (
    "global_step",
    "loss",
    "masked_lm_accuracy",
    "masked_lm_loss",
    "next_sentence_accuracy",
    "next_sentence_loss",
)


@torch.no_grad()
def evaluate(
    wrapped: torch.nn.Module,
    source,
    eval_batch_size: int,
    max_eval_steps: int,
    dist,
    precision: str = "fp32",
) -> dict[str, float]:
    """The original's evaluation: `max_eval_steps` batches read sequentially (repeating the data), metrics
    as `tf.metrics` computes them over all batches.

    Returns masked_lm_accuracy (weighted by masked_lm_weights), masked_lm_loss (weighted mean of the
    per-prediction losses), next_sentence_accuracy, next_sentence_loss (mean), and loss (the mean over
    batches of each batch's total loss, as the Estimator reports it).
    """
    stream = RecordStream(len(source), seed=0, shuffle=False)
    per_rank = eval_batch_size // dist.world_size
    rows = []  # per batch: this rank's sums
    was_training = wrapped.training
    wrapped.eval()
    for step in progress(range(max_eval_steps), desc="pretrain eval", unit="batch", disable=not dist.is_main):
        indices, _ = stream.take(step * eval_batch_size, eval_batch_size)
        batch = features_to_model_inputs(source.get_batch(indices[dist.rank * per_rank : (dist.rank + 1) * per_rank]))
        batch = {k: v.to(dist.device) for k, v in batch.items()}
        with autocast(dist.device, precision):
            out = wrapped(**batch)
        w = batch["masked_lm_weights"].reshape(-1).float()
        correct = (out.mlm_logits.float().argmax(-1).reshape(-1) == batch["masked_lm_ids"].reshape(-1)).float()
        nsp_correct = (out.nsp_logits.float().argmax(-1) == batch["next_sentence_labels"]).float()
        rows.append(
            torch.stack(
                [
                    (w * correct).sum(),
                    w.sum(),
                    (w * out.masked_lm_example_loss).sum(),
                    nsp_correct.sum(),
                    out.next_sentence_example_loss.sum(),
                    torch.tensor(float(len(batch["input_ids"])), device=dist.device),
                ]
            ).double()
        )
    wrapped.train(was_training)
    sums = dist.all_reduce_sum(torch.stack(rows)).cpu().numpy()  # [steps, 6]
    wc, ws, wl, nc, nl, nb = sums.T
    batch_loss = wl / (ws + 1e-5) + nl / nb
    return {
        "loss": float(batch_loss.mean()),
        "masked_lm_accuracy": float(wc.sum() / ws.sum()) if ws.sum() else 0.0,
        "masked_lm_loss": float(wl.sum() / ws.sum()) if ws.sum() else 0.0,
        "next_sentence_accuracy": float(nc.sum() / nb.sum()),
        "next_sentence_loss": float(nl.sum() / nb.sum()),
    }
