"""`bert train-embeddings` embeds a batch's columns in one pass where stacking them pads few tokens more, with the
same embeddings as a pass a column, and a pass a column where stacking would pad many more."""

from __future__ import annotations

import torch

from bert.modeling import BertModel, pool_tokens
from bert.sentence.embedding_run import STACK_PADDING, embed_columns


def _column(B, T, lengths, seed):
    g = torch.Generator().manual_seed(seed)
    mask = (torch.arange(T) < torch.tensor(lengths)[:, None]).long()
    return {
        "input_ids": torch.randint(1, 99, (B, T), generator=g) * mask,
        "attention_mask": mask,
        "token_type_ids": torch.zeros(B, T, dtype=torch.long),
    }


def _batch(*columns):
    return {f"{name}_{c}": x for c, column in enumerate(columns) for name, x in column.items()}


def test_columns_stacked_where_it_pads_little_with_each_columns_embeddings(tiny_config):
    model = BertModel(tiny_config).eval()
    passes = []

    def embed(batch, c):
        passes.append(tuple(batch[f"input_ids_{c}"].shape))
        out = model(batch[f"input_ids_{c}"], batch[f"attention_mask_{c}"], batch[f"token_type_ids_{c}"])
        return pool_tokens(out.sequence_output, batch[f"attention_mask_{c}"], "mean")

    similar = _batch(_column(3, 10, [10, 4, 7], 0), _column(3, 9, [9, 9, 2], 1), _column(3, 8, [8, 5, 1], 2))
    with torch.no_grad():
        stacked = embed_columns(embed, similar, 3)
        assert passes == [(9, 10)]
        apart = [embed(similar, c) for c in range(3)]
    for a, b in zip(stacked, apart):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    # 3 x 4 and 3 x 40 tokens: stacked, 6 x 40 = 1.82x theirs
    passes.clear()
    uneven = _batch(_column(3, 4, [4, 3, 2], 3), _column(3, 40, [40, 30, 20], 4))
    assert 6 * 40 > STACK_PADDING * (3 * 4 + 3 * 40)
    with torch.no_grad():
        embed_columns(embed, uneven, 2)
    assert passes == [(3, 4), (3, 40)]
