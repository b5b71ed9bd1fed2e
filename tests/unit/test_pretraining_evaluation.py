"""The original's pre-training evaluation (`bert.pretraining.evaluation.evaluate`), recomputed by hand from the
model's logits as run_pretraining.py's `metric_fn` defines each metric."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bert.config import BertConfig
from bert.distributed import DistContext
from bert.modeling import BertForPreTraining
from bert.pretraining.evaluation import evaluate
from bert.pretraining.inputs import features_to_model_inputs, open_pretraining_data
from conftest import synthetic_data


def _by_hand(model, source, batch_size: int, steps: int) -> dict[str, float]:
    """metric_fn over `steps` batches read in order, wrapping around at the end of the data."""
    model.eval()
    correct = weight = mlm = nsp_correct = nsp = examples = 0.0
    batch_losses = []
    with torch.no_grad():
        for step in range(steps):
            indices = np.arange(step * batch_size, (step + 1) * batch_size) % len(source)
            batch = features_to_model_inputs(source.get_batch(indices))
            out = model(**batch)
            logits = out.mlm_logits.reshape(-1, model.config.vocab_size).double()
            ids, w = batch["masked_lm_ids"].reshape(-1), batch["masked_lm_weights"].reshape(-1).double()
            token_loss = torch.logsumexp(logits, -1) - logits[torch.arange(len(ids)), ids]
            nsp_logits, labels = out.nsp_logits.double(), batch["next_sentence_labels"]
            nsp_loss = torch.logsumexp(nsp_logits, -1) - nsp_logits[torch.arange(len(labels)), labels]
            correct += float((w * (logits.argmax(-1) == ids)).sum())
            weight += float(w.sum())
            mlm += float((w * token_loss).sum())
            nsp_correct += float((nsp_logits.argmax(-1) == labels).sum())
            nsp += float(nsp_loss.sum())
            examples += len(labels)
            # The Estimator's `loss` is the mean over batches of the training loss of each batch.
            batch_losses.append(float((w * token_loss).sum() / (w.sum() + 1e-5) + nsp_loss.mean()))
    return {
        "loss": float(np.mean(batch_losses)),
        "masked_lm_accuracy": correct / weight,  # tf.metrics.accuracy weighted by masked_lm_weights
        "masked_lm_loss": mlm / weight,  # tf.metrics.mean of the per-prediction losses, same weights
        "next_sentence_accuracy": nsp_correct / examples,
        "next_sentence_loss": nsp / examples,
    }


def test_evaluate_computes_the_original_metrics(tmp_path):
    data, _ = synthetic_data(tmp_path, n=13, seq=32, preds=5)
    source = open_pretraining_data(str(data), 32, 5, None)
    config = BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=37, max_position_embeddings=32)  # fmt: skip
    model = BertForPreTraining(config).train()
    # Train the untrained model a little so that its accuracies are neither 0 nor chance.
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    batch = features_to_model_inputs(source.get_batch(np.arange(13)))
    model.eval()  # no dropout: the by-hand pass sees the same model
    for _ in range(30):
        optimizer.zero_grad()
        model(**batch).total_loss.backward()
        optimizer.step()
    model.train()
    # 5 batches of 4 from 13 records: the last two batches wrap around to the first records again.
    got = evaluate(model, source, 4, 5, DistContext(torch.device("cpu")))
    assert model.training  # the mode is restored
    want = _by_hand(model, source, 4, 5)
    assert got == {k: pytest.approx(v, rel=1e-5) for k, v in want.items()}
    assert got["masked_lm_accuracy"] > 0.2  # it learnt something: the accuracies are not trivially 0
    # Repeating batches counts them again: 3 batches differ from 5.
    assert evaluate(model, source, 4, 3, DistContext(torch.device("cpu"))) == {
        k: pytest.approx(v, rel=1e-5) for k, v in _by_hand(model, source, 4, 3).items()
    }
