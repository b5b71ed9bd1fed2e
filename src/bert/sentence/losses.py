"""The losses of `bert train-embeddings` and `bert train-reranker`, on embeddings or scores.

Each equals sentence-transformers' loss of the same name on the same batch (tests/unit/test_sentence_losses.py):
- `mnrl`: in-batch negatives (MultipleNegativesRankingLoss): each anchor's cosine similarities, times
  `scale` (20), to every positive and hard negative of the batch, softmax cross-entropy towards its own
  positive, averaged over anchors; `symmetric` adds the positive -> anchors direction and averages the two
  log-partitions (MultipleNegativesRankingLoss with directions query_to_doc and doc_to_query,
  partition_mode per_direction, as MultipleNegativesSymmetricRankingLoss);
- `cached_mnrl_backward`: the same loss with gradient caching (CachedMultipleNegativesRankingLoss, GradCache):
  embeddings are computed without a graph in mini-batches, the loss's gradient with respect to them is
  taken once, then each mini-batch is recomputed with its graph and backpropagated from that gradient, so
  activation memory is that of one mini-batch; the dropout masks of the first pass are replayed;
- `cosent` (CoSENTLoss): log(1 + sum over pairs (i, j) with score_i > score_j of exp(scale * (cos_j - cos_i)));
- `cosine_mse` (CosineSimilarityLoss): the mean squared error between the cosine and the score;
- `matryoshka` (MatryoshkaLoss): the weighted sum of a loss over the embeddings cut to each dimension
  and re-normalised;
- reranker: `pointwise_bce` (BinaryCrossEntropyLoss: BCE with logits against 0/1 or soft labels) and
  `listwise_ce` (CrossEncoder MultipleNegativesRankingLoss on its hard negatives: softmax cross-entropy over
  the positive and k negatives of each query, of scale * sigmoid(logit)).

Distillation, a student learning a teacher's outputs (computed beforehand, `bert.distillation`):
- `mse` (MSELoss): the mean squared error between the student's embeddings and the teacher's, averaged over
  the columns; under `matryoshka` the teacher's vectors are cut to each size, not re-normalised, as
  MatryoshkaLoss cuts embedding labels;
- on scores of (query, positive, negatives...) groups, [B, 1 + k], the positive first: the bi-encoder's are
  `dot_scores` (the dot product, sentence-transformers' default similarity for these losses), the
  cross-encoder's its logits: `margin_mse` (MarginMSELoss, for both): the mean squared error between the
  student's margins s(q, p) - s(q, n) and the teacher's; `distill_kl` (DistillKLDivLoss): the KL divergence
  from the softmax of the teacher's scores to the student's, both divided by the temperature, averaged over
  queries and multiplied by the temperature squared.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

MNRL_SCALE = 20.0
COSENT_SCALE = 20.0
LISTWISE_SCALE = 10.0


def cos_sim(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """[N, H] x [M, H] -> [N, M] cosine similarities."""
    return F.normalize(a, p=2, dim=-1) @ F.normalize(b, p=2, dim=-1).T


def mnrl(
    embeddings: Sequence[torch.Tensor],
    scale: float = MNRL_SCALE,
    symmetric: bool = False,
    anchors: torch.Tensor | None = None,
) -> torch.Tensor:
    """`embeddings`: anchors [B, H], positives [B, H], then any hard-negative columns [B, H].

    `anchors`: the rows whose loss this is, a mean over them (default: all rows); the positives and
    negatives of every row are their in-batch negatives all the same. Under `--gather_across_devices` the columns are
    every process's rows and `anchors` this process's (MultipleNegativesRankingLoss with
    gather_across_devices=True): the processes' losses average to the whole batch's.
    """
    queries, positives = embeddings[0], embeddings[1]
    docs = torch.cat(list(embeddings[1:]), dim=0)  # [B * (1 + k), H]: positives first
    own = torch.arange(queries.shape[0], device=queries.device) if anchors is None else anchors  # [b]
    rows = torch.arange(own.shape[0], device=queries.device)
    forward = cos_sim(queries[own], docs) * scale  # [b, B * (1 + k)]
    positive = forward[rows, own]
    log_z = torch.logsumexp(forward, dim=1)
    if symmetric:
        backward = cos_sim(positives[own], queries) * scale  # [b, B]
        log_z = (log_z + torch.logsumexp(backward, dim=1)) / 2
    return (log_z - positive).mean()


def cosent(a: torch.Tensor, b: torch.Tensor, scores: torch.Tensor, scale: float = COSENT_SCALE) -> torch.Tensor:
    cos = F.cosine_similarity(a, b, dim=-1).float() * scale  # [B]
    diff = cos[None, :] - cos[:, None]  # [B, B]: cos_j - cos_i
    ordered = scores[:, None] > scores[None, :]  # pairs with score_i > score_j
    terms = torch.cat([cos.new_zeros(1), diff[ordered]])
    return torch.logsumexp(terms, dim=0)


def cosine_mse(a: torch.Tensor, b: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(F.cosine_similarity(a, b, dim=-1), scores.float())


def shrink(x: torch.Tensor, dim: int) -> torch.Tensor:
    """The first `dim` components, re-normalised (a Matryoshka embedding of that size)."""
    return F.normalize(x[..., :dim], p=2, dim=-1)


def matryoshka(
    loss: Callable[[list[torch.Tensor]], torch.Tensor],
    embeddings: Sequence[torch.Tensor],
    dims: Sequence[int],
    weights: Sequence[float] | None = None,
) -> torch.Tensor:
    """sum_d weight_d * loss(embeddings cut to d dimensions); `dims` empty: the loss itself."""
    if not dims:
        return loss(list(embeddings))
    weights = weights or [1.0] * len(dims)
    total = embeddings[0].new_zeros(())
    for dim, weight in zip(dims, weights):
        total = total + weight * loss([shrink(e, dim) for e in embeddings])
    return total


# -------------------------------------------------------------------------------------- distillation
def mse(student: Sequence[torch.Tensor], teacher: Sequence[torch.Tensor]) -> torch.Tensor:
    """Per column, the student's [B, H] and the teacher's [B, >= H] embeddings (the teacher's cut to the
    student's size: a Matryoshka size under `matryoshka`)."""
    terms = [F.mse_loss(s.float(), t[..., : s.shape[-1]].float()) for s, t in zip(student, teacher, strict=True)]
    return torch.stack(terms).mean()


def dot_scores(embeddings: Sequence[torch.Tensor]) -> torch.Tensor:
    """Queries [B, H], then the candidates' columns [B, H] each -> [B, columns - 1]: each query's dot
    product with its own candidates."""
    query = embeddings[0].float()
    return torch.stack([(query * c.float()).sum(-1) for c in embeddings[1:]], dim=1)


def margin_mse(student: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
    """student, teacher [B, 1 + k] scores, the positive first."""
    student, teacher = student.float(), teacher.float()
    return F.mse_loss(student[:, :1] - student[:, 1:], teacher[:, :1] - teacher[:, 1:])


def distill_kl(student: torch.Tensor, teacher: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """student, teacher [B, 1 + k] scores."""
    log_q = torch.log_softmax(student.float() / temperature, dim=1)
    p = torch.softmax(teacher.float() / temperature, dim=1)
    return F.kl_div(log_q, p, reduction="batchmean") * temperature**2


# ------------------------------------------------------------------------------------ gradient caching
class _RngReplay:
    """The CPU (and current CUDA device's) random state at construction, replayed on entering: a
    recomputed forward pass draws the same dropout masks as the first."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.cpu_state = torch.get_rng_state()
        self.cuda_state = torch.cuda.get_rng_state(device) if self.cuda else None
        self.device = device

    @contextlib.contextmanager
    def replay(self):
        devices = [self.device] if self.cuda else []
        with torch.random.fork_rng(devices=devices):
            torch.set_rng_state(self.cpu_state)
            if self.cuda:
                torch.cuda.set_rng_state(self.cuda_state, self.device)
            yield


def cached_mnrl_backward(
    encode: Callable[[int, slice], torch.Tensor],
    batch_size: int,
    num_columns: int,
    mini_batch_size: int,
    loss: Callable[[list[torch.Tensor]], torch.Tensor],
    device: torch.device,
    grad_scale: float = 1.0,
    no_sync: Callable[[], contextlib.AbstractContextManager] | None = None,
) -> torch.Tensor:
    """Backpropagate `loss` of the batch's embeddings through the model, `mini_batch_size` rows at a time.

    Args:
        encode: `(column, rows) -> [len(rows), H]` embeddings of those rows of that column (with a graph
            when grad is enabled).
        batch_size, num_columns: the batch's shape.
        loss: the loss of the full list of column embeddings (e.g. `mnrl`, or `matryoshka` over it).
        device: where `encode` computes (whose random state dropout draws from).
        grad_scale: multiplies the gradient (the data-parallel world size, as `bert.training.Trainer` does).
        no_sync: a context for every backward pass but the last (DDP's `no_sync`), so gradients are
            reduced across processes once.

    Returns:
        The loss, detached (the parameters' gradients are accumulated already).
    """
    chunks = [slice(i, min(i + mini_batch_size, batch_size)) for i in range(0, batch_size, mini_batch_size)]
    rng: list[list[_RngReplay]] = []
    columns = []
    with torch.no_grad():
        for c in range(num_columns):
            parts, states = [], []
            for rows in chunks:
                states.append(_RngReplay(device))
                parts.append(encode(c, rows))
            rng.append(states)
            columns.append(torch.cat(parts).detach().requires_grad_())
    with torch.enable_grad():
        value = loss(columns)
        value.backward()
    n = num_columns * len(chunks)
    k = 0
    for c in range(num_columns):
        grad = columns[c].grad
        assert grad is not None  # the loss reads every column
        grad = grad * grad_scale
        for rows, state in zip(chunks, rng[c]):
            k += 1
            ctx = no_sync() if no_sync is not None and k < n else contextlib.nullcontext()
            with ctx, state.replay():
                out = encode(c, rows)
                out.backward(grad[rows])
    return value.detach()


# ------------------------------------------------------------------------------------------ reranker
def pointwise_bce(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """logits [N], labels [N] in [0, 1]."""
    return F.binary_cross_entropy_with_logits(logits.float(), labels.float())


def listwise_ce(logits: torch.Tensor, scale: float = LISTWISE_SCALE) -> torch.Tensor:
    """logits [B, 1 + k], the positive first."""
    scores = torch.sigmoid(logits.float()) * scale
    return F.cross_entropy(scores, torch.zeros(scores.shape[0], dtype=torch.long, device=scores.device))
