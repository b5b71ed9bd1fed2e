"""Training sentence-embedding models (bi-encoders) and rerankers (cross-encoders).

- `data`: the training and evaluation files (pairs, tuples with negatives, scored pairs, BEIR directories)
  and the batches that never repeat a text (torch-free);
- `losses`: in-batch negatives (MNRL, symmetric, with gradient caching), CoSENT, cosine-MSE, Matryoshka,
  and the reranker's pointwise and listwise losses, each equal to sentence-transformers' on the same batch;
- `evaluation`: STS correlations and retrieval/reranking metrics (MRR@10, NDCG@10, Recall@k, MAP);
- `st_format`: the sentence-transformers files written beside a trained bi-encoder;
- `runner`: `run_train_embeddings` and `run_train_reranker`, on `bert.training`'s runner.
"""
