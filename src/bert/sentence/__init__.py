"""Training sentence-embedding models (bi-encoders) and rerankers (cross-encoders).

- `data`: the training and evaluation files (pairs, tuples with negatives, scored pairs, BEIR directories),
  torch-free (their batches: `bert.batching.BatchPlan`, which never repeats a text for the in-batch losses);
- `losses`: in-batch negatives (MNRL, symmetric, with gradient caching), CoSENT, cosine-MSE, Matryoshka,
  and the reranker's pointwise and listwise losses, each equal to sentence-transformers' on the same batch;
- `evaluation`: STS correlations and retrieval/reranking metrics (MRR@10, NDCG@10, Recall@k, MAP);
- `st_format`: the sentence-transformers files written beside a trained bi-encoder;
- `loss_table`: the `--loss` choices, a table of what each needs (`LossSpec`), and their checks;
- `runner`: `train_embeddings` and `train_reranker`, on `bert.training`'s `Trainer`.
"""
