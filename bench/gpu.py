"""GPU benchmark: ours vs transformers (SDPA attention) on the same weights, batches and precision.

Usage on the H200 (one command, a few minutes; writes gpu.json and gpu.md into --out):

    PYTHONPATH=src python bench/gpu.py --out bench/out/gpu

Optional, separately (torch.compile variants add a minute or more of compilation per row):

    PYTHONPATH=src python bench/gpu.py --out bench/out/gpu-compile --compile --sections pretrain,squad,inference

CPU smoke test (tiny shapes, a few steps, every table):
    python bench/gpu.py --device cpu --quick --out bench/out/gpu_smoke

Sections (every row: forward + backward + global-norm clipping at 1.0 + the original's AdamWeightDecay step,
bf16 autocast with fp32 master weights, dropout as configured (0.1), inputs already on the device):
  (a) pretrain: BERT-Base at seq 128 (batch 256, 20 masked positions) and seq 512 (batch 64, 80 masked
      positions: the original's recipe). Lengths as `create_pretraining_data` makes them: 90% full, 10%
      shorter (`short_seq_prob=0.1`). Ours runs the MLM head at the masked positions only; transformers'
      BertForPreTraining at every position, with labels -100 at the others.
  (b) squad: BERT-Base and BERT-Large at seq 384, batch 32, on the feature lengths of the SQuAD v1.1 dev set
      (doc stride 128, question at most 64 pieces). Ours pads each batch to its longest feature and runs
      the encoder on real tokens only (unpadding); transformers is padded to 384 (the original's features).
      Also ours with gradient checkpointing (memory), against transformers without it.
  (c) inference: every GLUE dev sentence (pair) in the shared data, shuffled, seq <= 128, batch 128,
      BertForSequenceClassification in eval mode. Ours: dynamic padding + unpadding; transformers padded to
      each batch's longest (DataCollatorWithPadding) and to 128.
  (d) memory: every row's peak (torch.cuda.max_memory_allocated, reset before each row, minus what was
      allocated before the model was built: weights + gradients + optimizer state + activations).
  (e) --compile: the same rows with ours compiled by `bert.pretrain.compile_model` (what `--compile` does)
      and transformers by `model.compile()`; compilation happens in the warm-up steps, which are not timed.
  loss_curve: N steps in bf16 and N in fp32 of a small BERT (L-4_H-256) from the same seed on the same
      batches of real text (the shared corpus), and the relative difference of the two loss curves (goal:
      within 1% over 2,000 steps). fp32 is plain fp32 (TF32 off, torch's default).

Data: the shared data folder beside the checkout (../shared/data) or inside it (shared/data), or --data_dir.
Without it every section still runs, on synthetic lengths (a warning, and the report says so).

FLOPs ("model FLOPs": the useful work, counted on real tokens only, so padding, recomputation and
transformers' MLM logits at unmasked positions are not counted; ours and transformers are credited the same
work, so their MFU ratio is their speed ratio):

    training FLOPs per token = 6 * N + 12 * L * T * H  (+ the task head's own parameters, times 6)

N: the parameters of the L encoder blocks (no embeddings); 12 * L * T * H: attention scores q k^T and the
weighted sum of values, 2 * T * H FLOPs each per token and layer in the forward pass, times 3 for forward and
backward (PaLM, appendix B). With T a sequence's real length, a sequence costs 6 * N * T + 12 * L * H * T^2.
The masked-LM head (transform + tied decoder, H^2 + H * V) runs at the masked positions only: 6 * its
parameters per masked position; pooler and NSP/classifier once per sequence. Inference: a third (2 * N +
4 * L * T * H per token). BERT-Base, seq 128, 20 masked positions: 6 * 85.05M = 510.3 MFLOP, + attention
14.2 MFLOP, + the MLM head at 20/128 of the tokens 22.6 MFLOP = 547.1 MFLOP per token, which reproduces the
issue's ~545e6 (0.4% above it; with 6 * L * T * H for the attention, half the term derived above, it would
be 540.0e6). MFU = model FLOP/s / --peak_flops (default 790e12: the measured bf16 matmul peak of the H200).
"""

from __future__ import annotations

import argparse
import datetime
import gc
import gzip
import json
import logging
import math
import platform
import random
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from bert.config import BertConfig, named_config
from bert.distributed import autocast, resolve_device
from bert.modeling import BertForPreTraining, BertForQuestionAnswering, BertForSequenceClassification
from bert.optimization import create_optimizer
from bert.plan import DEVICES, make_plan
from bert.training import compile_model

REPO = Path(__file__).resolve().parents[1]
# The shared data folder beside the checkout (as the tests expect it), or inside it (the device copy).
DATA_DIRS = (REPO.parent / "shared" / "data", REPO / "shared" / "data")
SECTIONS = ("pretrain", "squad", "inference", "loss_curve")
GIB = 2**30


# ---------------------------------------------------------------------------------------------- FLOPs
def block_params(c: BertConfig) -> int:
    """Parameters of one encoder block: q, k, v, attention output, two feed-forward layers, two LayerNorms."""
    H, inner = c.hidden_size, c.intermediate_size
    return 4 * (H * H + H) + (H * inner + inner) + (inner * H + H) + 2 * 2 * H


def mlm_head_params(c: BertConfig) -> int:
    """The masked-LM head per masked position: transform (dense + LayerNorm) and the tied decoder with its bias."""
    H, V = c.hidden_size, c.vocab_size
    return H * H + H + 2 * H + H * V + V


def model_flops(
    c: BertConfig,
    lengths: list[int],
    masked: int = 0,
    per_token_head: int = 0,
    per_sequence_head: int = 0,
    train: bool = True,
) -> float:
    """Model FLOPs of one pass over sequences of the given real lengths (see the module docstring).

    Args:
        c: the model config.
        lengths: real tokens of each sequence.
        masked: masked-LM predictions in all (the MLM head's positions).
        per_token_head: head parameters applied at every token (e.g. the QA output layer).
        per_sequence_head: head parameters applied once per sequence (pooler, NSP, classifier).
        train: forward and backward (6 FLOPs per parameter and token), else forward only (2).
    """
    m = 6 if train else 2
    tokens = sum(lengths)
    squares = sum(t * t for t in lengths)
    attention = 2 * m * c.num_hidden_layers * c.hidden_size * squares  # 12 L H T^2 per sequence (training)
    return (
        m * (c.num_hidden_layers * block_params(c) + per_token_head) * tokens
        + attention
        + m * mlm_head_params(c) * masked
        + m * per_sequence_head * len(lengths)
    )


def pooler_params(c: BertConfig, outputs: int) -> int:
    return c.hidden_size * c.hidden_size + c.hidden_size + c.hidden_size * outputs + outputs


def flop_check() -> dict[str, float]:
    """The issue's reference number: BERT-Base, seq 128, 20 masked positions, about 545e6 FLOPs per token."""
    c = named_config("base")
    total = model_flops(c, [128], masked=20, per_sequence_head=pooler_params(c, 2)) / 128
    no_head = model_flops(c, [128]) / 128
    return {"base_seq128_flops_per_token": total, "without_mlm_head": no_head, "issue_reference": 545e6}


# ---------------------------------------------------------------------------------------------- batches
@dataclass
class Batch:
    ours: dict[str, torch.Tensor]
    theirs: dict[str, torch.Tensor]
    sequences: int
    tokens: int  # real tokens
    flops: float  # model FLOPs of one step on this batch
    extra: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)  # other input layouts by name

    def to(self, device: torch.device) -> Batch:
        def move(d):
            return {k: v.to(device) for k, v in d.items()}

        extra = {k: move(v) for k, v in self.extra.items()}
        return Batch(move(self.ours), move(self.theirs), self.sequences, self.tokens, self.flops, extra)


def pad_rows(rows: list[list[int]], length: int) -> torch.Tensor:
    return torch.tensor([r + [0] * (length - len(r)) for r in rows], dtype=torch.long)


def pretraining_batches(c: BertConfig, n: int, batch: int, seq: int, preds: int, seed: int) -> list[Batch]:
    """Random ids with the shape statistics of `create_pretraining_data` output (short_seq_prob 0.1,
    masked_lm_prob 0.15 capped at `preds`); ours in the original's feature layout, transformers with labels."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        lengths = np.where(rng.random(batch) < 0.9, seq, rng.integers(8, seq + 1, batch))
        mask = torch.from_numpy(np.arange(seq)[None, :] < lengths[:, None]).long()  # [B, T]
        ids = torch.from_numpy(rng.integers(1000, c.vocab_size, (batch, seq))) * mask
        types = torch.from_numpy(np.arange(seq)[None, :] >= lengths[:, None] // 2).long() * mask
        positions = torch.zeros(batch, preds, dtype=torch.long)
        weights = torch.zeros(batch, preds)
        labels = torch.full((batch, seq), -100, dtype=torch.long)  # transformers' MLM labels [B, T]
        masked = 0
        for b, length in enumerate(lengths.tolist()):
            k = min(preds, max(1, round(length * 0.15)))
            pos = np.sort(rng.choice(np.arange(1, length - 1), size=k, replace=False))
            positions[b, :k] = torch.from_numpy(pos)
            weights[b, :k] = 1.0
            masked += k
        lm_ids = torch.from_numpy(rng.integers(1000, c.vocab_size, (batch, preds))) * (weights > 0)
        for b in range(batch):
            k = int(weights[b].sum())
            labels[b, positions[b, :k]] = lm_ids[b, :k]
        nsp = torch.from_numpy(rng.integers(0, 2, batch))
        common = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
        ours = {
            **common,
            "masked_lm_positions": positions,
            "masked_lm_ids": lm_ids,
            "masked_lm_weights": weights,
            "next_sentence_labels": nsp,
        }
        theirs = {**common, "labels": labels, "next_sentence_label": nsp}
        flops = model_flops(c, lengths.tolist(), masked=masked, per_sequence_head=pooler_params(c, 2))
        out.append(Batch(ours, theirs, batch, int(lengths.sum()), flops))
    return out


def data_dir(arg: str | None) -> Path | None:
    if arg:
        return Path(arg)
    return next((d for d in DATA_DIRS if d.is_dir()), None)


def tokenizer_of(data: Path | None):
    from bert.tokenization import FullTokenizer

    vocab = data / "vocab" / "uncased.txt" if data else None
    if vocab is None or not vocab.is_file():
        return None
    return FullTokenizer(str(vocab), do_lower_case=True)


def squad_features(
    data: Path | None, tokenizer, max_seq: int, stride: int, max_query: int, limit: int | None
) -> tuple[list[tuple[list[int], list[int]]], str]:
    """(input_ids, token_type_ids) of every SQuAD v1.1 dev feature, as `convert_examples_to_features` cuts
    them (`[CLS] question [SEP] window [SEP]`), unpadded; or synthetic lengths when the data is absent."""
    from bert.tasks.squad import doc_spans_for

    path = data / "squad" / "dev-v1.1.json.gz" if data else None
    if tokenizer is None or path is None or not path.is_file():
        print(f"WARNING: {path or 'shared data'} or the vocab is absent: synthetic SQuAD-like lengths")
        rng = np.random.default_rng(0)
        # About a quarter of SQuAD v1.1 dev features fill the window; the rest spread around 150 tokens.
        lengths = np.where(rng.random(4096) < 0.25, max_seq, rng.normal(150, 50, 4096).clip(24, max_seq))
        return [([101] + [2000] * (int(n) - 2) + [102], [0] * int(n)) for n in lengths], "synthetic lengths"
    cls, sep = tokenizer.vocab["[CLS]"], tokenizer.vocab["[SEP]"]
    with gzip.open(path, "rt", encoding="utf-8") as f:
        articles = json.load(f)["data"]
    features = []
    questions = 0
    for article in articles:
        for paragraph in article["paragraphs"]:
            doc = tokenizer.encode(paragraph["context"])
            for qa in paragraph["qas"]:
                query = tokenizer.encode(qa["question"])[:max_query]
                for span in doc_spans_for(len(doc), max_seq - len(query) - 3, stride):
                    window = doc[span.start : span.start + span.length]
                    features.append(
                        ([cls, *query, sep, *window, sep], [0] * (len(query) + 2) + [1] * (span.length + 1))
                    )
                questions += 1
            if limit and questions >= limit:
                return features, f"{path.name}, first {questions} questions"
    return features, f"{path.name}, {questions} questions"


def squad_batches(c: BertConfig, features, n: int, batch: int, max_seq: int, seed: int) -> list[Batch]:
    rng = random.Random(seed)
    picked = rng.sample(features, min(len(features), n * batch))
    out = []
    for i in range(0, len(picked) - batch + 1, batch):
        rows = picked[i : i + batch]
        lengths = [len(ids) for ids, _ in rows]
        starts = torch.tensor([rng.randrange(length) for length in lengths])
        ends = torch.tensor([min(s + rng.randrange(8), t - 1) for s, t in zip(starts.tolist(), lengths)])
        labels = {"start_positions": starts, "end_positions": ends}

        def padded(length: int, rows=rows, lengths=lengths, labels=labels) -> dict[str, torch.Tensor]:
            return {
                "input_ids": pad_rows([ids for ids, _ in rows], length),
                "token_type_ids": pad_rows([types for _, types in rows], length),
                "attention_mask": pad_rows([[1] * n for n in lengths], length),
                **labels,
            }

        flops = model_flops(c, lengths, per_token_head=2 * c.hidden_size + 2)
        out.append(Batch(padded(max(lengths)), padded(max_seq), batch, sum(lengths), flops))
    return out


def glue_features(
    data: Path | None, tokenizer, max_seq: int, limit: int | None, seed: int
) -> tuple[list[tuple[list[int], list[int]]], str]:
    """Every GLUE dev example in the shared data, tokenized as `run_classifier` does (pairs truncated
    longest-first), shuffled across tasks; synthetic lengths (with a warning) when the data is absent."""
    from bert.tasks import get_processor
    from bert.tasks.glue import truncate_seq_pair

    glue = data / "glue" if data else None
    dirs = sorted(p for p in glue.iterdir() if (p / "dev.tsv").is_file()) if glue and glue.is_dir() else []
    if tokenizer is None or not dirs:
        print(f"WARNING: {glue or 'shared data'}/*/dev.tsv or the vocab is absent: synthetic sentence lengths")
        rng = np.random.default_rng(seed)
        lengths = rng.lognormal(math.log(40), 0.5, limit or 4096).clip(5, max_seq).astype(int)
        return [([101] + [2000] * (int(n) - 2) + [102], [0] * int(n)) for n in lengths], "synthetic lengths"
    examples, names = [], []
    for d in dirs:
        try:
            examples += get_processor(d.name).get_dev_examples(d)
            names.append(d.name)
        except Exception as e:  # one unreadable task does not stop the others
            print(f"WARNING: skipping {d}: {type(e).__name__}: {e}")
    random.Random(seed).shuffle(examples)
    examples = examples[:limit] if limit else examples
    cls, sep = tokenizer.vocab["[CLS]"], tokenizer.vocab["[SEP]"]
    tokens_a = tokenizer.tokenize_batch([e.text_a for e in examples])
    tokens_b = tokenizer.tokenize_batch([e.text_b or "" for e in examples])
    features = []
    for e, a, b in zip(examples, tokens_a, tokens_b):
        if e.text_b is not None:
            truncate_seq_pair(a, b, max_seq - 3)
            ids = [cls, *tokenizer.convert_tokens_to_ids(a), sep, *tokenizer.convert_tokens_to_ids(b), sep]
            features.append((ids, [0] * (len(a) + 2) + [1] * (len(b) + 1)))
        else:
            a = a[: max_seq - 2]
            features.append(([cls, *tokenizer.convert_tokens_to_ids(a), sep], [0] * (len(a) + 2)))
    return features, f"{len(features)} dev examples of {', '.join(names)}"


def inference_batches(c: BertConfig, features, batch: int, max_seq: int) -> list[Batch]:
    out = []
    for i in range(0, len(features) - batch + 1, batch):
        rows = features[i : i + batch]
        lengths = [len(ids) for ids, _ in rows]

        def padded(length: int, rows=rows, lengths=lengths) -> dict[str, torch.Tensor]:
            return {
                "input_ids": pad_rows([ids for ids, _ in rows], length),
                "token_type_ids": pad_rows([types for _, types in rows], length),
                "attention_mask": pad_rows([[1] * n for n in lengths], length),
            }

        flops = model_flops(c, lengths, per_sequence_head=pooler_params(c, 2), train=False)
        longest = padded(max(lengths))
        out.append(Batch(longest, longest, batch, sum(lengths), flops, extra={"max": padded(max_seq)}))
    return out


# ----------------------------------------------------------------------------------------------- models
OURS = {
    "pretraining": BertForPreTraining,
    "qa": BertForQuestionAnswering,
    "classification": BertForSequenceClassification,
}


def hf_model(kind: str, c: BertConfig) -> nn.Module:
    import transformers

    config = transformers.BertConfig(
        vocab_size=c.vocab_size,
        hidden_size=c.hidden_size,
        num_hidden_layers=c.num_hidden_layers,
        num_attention_heads=c.num_attention_heads,
        intermediate_size=c.intermediate_size,
        hidden_act=c.hidden_act,  # transformers' names, as ours
        hidden_dropout_prob=c.hidden_dropout_prob,
        attention_probs_dropout_prob=c.attention_probs_dropout_prob,
        max_position_embeddings=c.max_position_embeddings,
        type_vocab_size=c.type_vocab_size,
        initializer_range=c.initializer_range,
        layer_norm_eps=c.layer_norm_eps,
        pad_token_id=c.pad_token_id,
        num_labels=2,
        attn_implementation="sdpa",
    )
    cls = {
        "pretraining": transformers.BertForPreTraining,
        "qa": transformers.BertForQuestionAnswering,
        "classification": transformers.BertForSequenceClassification,
    }[kind]
    return cls(config)


def build(kind: str, side: str, c: BertConfig, state: dict[str, torch.Tensor], device: torch.device) -> nn.Module:
    """A model on `device` holding the weights `state` (ours' names; transformers' are the same)."""
    with torch.device(device):
        model = OURS[kind](c) if side == "ours" else hf_model(kind, c)
    missing, unexpected = model.load_state_dict(state, strict=False)
    # transformers keeps its own copy of the tied MLM bias (`cls.predictions.decoder.bias`) and buffers.
    missing = [k for k in missing if not k.endswith(("decoder.bias", "position_ids", "token_type_ids"))]
    if missing or unexpected:
        raise RuntimeError(f"{side} {kind}: weights missing {missing[:5]}, unexpected {unexpected[:5]}")
    return model


def reference_state(kind: str, c: BertConfig, device: torch.device, seed: int = 0) -> dict[str, torch.Tensor]:
    """Our randomly initialised weights (the original's truncated normal), on the CPU."""
    torch.manual_seed(seed)
    with torch.device(device):
        model = OURS[kind](c)
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    del model
    return state


def parity_note(kind: str, c: BertConfig, state, batch: Batch, device: torch.device) -> str:
    try:
        return f"max abs(ours - transformers) {parity(kind, c, state, batch, device):.1e} (fp32 eval)"
    except Exception as e:
        return f"parity check failed: {type(e).__name__}: {str(e)[:100]}"


def loss_of(side: str, out) -> torch.Tensor:
    return out.total_loss if side == "ours" and hasattr(out, "total_loss") else out.loss


def parity(kind: str, c: BertConfig, state, batch: Batch, device: torch.device) -> float:
    """max |ours - transformers| of the fp32 eval outputs at real tokens on two sequences: same weights?"""
    outs = []
    for side in ("ours", "theirs"):
        model = build(kind, side, c, state, device).eval()
        inputs = batch.ours if side == "ours" else batch.theirs
        T = batch.ours["input_ids"].shape[1]
        keep = ("input_ids", "attention_mask", "token_type_ids")
        inputs = {k: v[:2, :T] for k, v in inputs.items() if k in keep}
        with torch.no_grad():
            out = model(**inputs)
        if kind == "pretraining":
            outs.append(out.nsp_logits if side == "ours" else out.seq_relationship_logits)
        elif kind == "qa":
            mask = inputs["attention_mask"].bool()
            logits = out.logits[..., 0] if side == "ours" else out.start_logits
            outs.append(logits[mask])
        else:
            outs.append(out.logits)
        del model
    return float((outs[0].float() - outs[1].float()).abs().max())


# ------------------------------------------------------------------------------------------------ timing
@dataclass
class Row:
    section: str
    group: str  # rows of a group are compared with its transformers baseline
    model: str
    impl: str
    variant: str
    shape: str
    baseline: bool = False
    seq_per_s: float | None = None
    tokens_per_s: float | None = None
    tflops: float | None = None
    mfu: float | None = None
    peak_gib: float | None = None
    ratio: float | None = None
    memory_ratio: float | None = None
    steps: int = 0
    note: str = ""
    error: str | None = None


def measured_peak_flops(device: torch.device, n: int = 8192, reps: int = 10) -> float:
    """The device's bf16 matmul rate: the mean of `reps` n^3 products on random data after three warm-ups."""
    a, b = (torch.randn(n, n, device=device, dtype=torch.bfloat16) for _ in range(2))
    for _ in range(3):
        a @ b
    sync(device)
    start = time.perf_counter()
    for _ in range(reps):
        a @ b
    sync(device)
    return 2 * n**3 * reps / (time.perf_counter() - start)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def measure(
    row: Row,
    make_model: Callable[[], nn.Module],
    batches: list[Batch],
    device: torch.device,
    args,
    train: bool = True,
    layout: str | None = None,
    compiled: bool = False,
) -> Row:
    """Time `steps` steps over `batches` (after untimed warm-up) and record speed, MFU and peak memory."""
    side = "ours" if row.impl.startswith("ours") else "theirs"
    model = optimizer = None
    try:
        free(device)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
            before = torch.cuda.memory_allocated(device)
        model = make_model().train(train)
        if compiled:
            torch._dynamo.reset()
            if side == "ours":
                compile_model(model)
            else:
                model.compile()
        if train:
            optimizer, _ = create_optimizer(model, 1e-5, 1000, 0)

        def step(b: Batch) -> None:
            inputs = b.extra[layout] if layout else (b.ours if side == "ours" else b.theirs)
            if train:
                with autocast(device, "bf16"):
                    loss = loss_of(side, model(**inputs))
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            else:
                with torch.inference_mode(), autocast(device, "bf16"):
                    model(**inputs)

        # Compiled rows warm up on every batch: each new shape may compile before dynamic shapes kick in.
        warmup = len(batches) if compiled else min(args.warmup, len(batches))
        for i in range(warmup):
            step(batches[i % len(batches)])
        if compiled and side == "ours" and model._compiled_call_impl is None:
            row.note = (row.note + "; " if row.note else "") + "compilation failed: ran eagerly"
        steps = args.steps if args.steps else max(20, len(batches))
        sync(device)
        start = time.perf_counter()
        sequences = tokens = flops = 0.0
        for i in range(steps):
            b = batches[i % len(batches)]
            step(b)
            sequences, tokens, flops = sequences + b.sequences, tokens + b.tokens, flops + b.flops
        sync(device)
        seconds = time.perf_counter() - start
        row.steps = steps
        row.seq_per_s, row.tokens_per_s = sequences / seconds, tokens / seconds
        row.tflops = flops / seconds / 1e12
        row.mfu = flops / seconds / args.peak_flops
        if device.type == "cuda":
            row.peak_gib = (torch.cuda.max_memory_allocated(device) - before) / GIB
    except Exception as e:
        row.error = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"[:300]
        print(f"  ERROR in {row.model} {row.impl} {row.variant}: {row.error}")
        traceback.print_exc(limit=4)
    finally:
        model = optimizer = None  # freed before the next row
        if compiled:
            torch._dynamo.reset()  # its caches hold the model
        free(device)
    print(f"  {fmt_row(row)}", flush=True)
    return row


def fmt_row(r: Row) -> str:
    if r.error:
        return f"{r.model} {r.shape} {r.impl} ({r.variant}): ERROR {r.error}"
    mem = f"{r.peak_gib:.2f} GiB" if r.peak_gib is not None else "n/a"
    return (
        f"{r.model} {r.shape} {r.impl} ({r.variant}): {r.seq_per_s:.1f} seq/s, {r.tokens_per_s:,.0f} tok/s, "
        f"MFU {100 * r.mfu:.1f}%, peak {mem}"
    )


def add_ratios(rows: list[Row]) -> None:
    """Speed and memory relative to the group's transformers (eager) row."""
    for r in rows:
        base = next((b for b in rows if b.group == r.group and b.baseline and not b.error), None)
        if base is None or r.error:
            continue
        r.ratio = r.seq_per_s / base.seq_per_s
        if r.peak_gib is not None and base.peak_gib:
            r.memory_ratio = r.peak_gib / base.peak_gib


# ---------------------------------------------------------------------------------------------- sections
def shapes(args) -> dict[str, BertConfig]:
    """BERT-Base and BERT-Large, or tiny stand-ins with --quick (the vocab stays 30522: real token ids)."""
    names = {"base": "L-2_H-64", "large": "L-2_H-128"} if args.quick else {"base": "base", "large": "large"}
    return {k: named_config(v) for k, v in names.items()}


def have_transformers() -> bool:
    try:
        import transformers

        transformers.logging.set_verbosity_error()
        return True
    except ImportError:
        print("WARNING: transformers is not installed: only our rows are measured")
        return False


def section_pretrain(args, device, hf: bool, rows: list[Row]) -> None:
    """Appends each row as it is measured (a time limit keeps the rows before it)."""
    c = shapes(args)["base"]
    label = "BERT-Base" if not args.quick else "tiny (L-2_H-64)"
    configs = [(4, 32, 5), (2, 64, 10)] if args.quick else [(256, 128, 20), (64, 512, 80)]
    state = reference_state("pretraining", c, device)
    for i, (batch, seq, preds) in enumerate(configs):
        batches = [b.to(device) for b in pretraining_batches(c, 2 if args.quick else 4, batch, seq, preds, seed=i)]
        group = f"pretrain-{seq}"
        shape = f"{batch} x {seq}"
        note = parity_note("pretraining", c, state, batches[0], device) if hf else ""
        variants = [
            ("ours", f"MLM at {preds} masked positions", False, False),
            ("ours + grad ckpt", f"MLM at {preds} masked positions, gradient checkpointing", False, True),
            ("transformers", "MLM at all positions", False, False),
        ]
        if args.compile and (seq == 128 or args.quick):
            variants += [("ours + compile", f"MLM at {preds} masked positions", True, False)]
            variants += [("transformers + compile", "MLM at all positions", True, False)]
        for impl, variant, compiled, ckpt in variants:
            if impl.startswith("transformers") and not hf:
                continue
            side = "ours" if impl.startswith("ours") else "theirs"

            def make(side=side, ckpt=ckpt):
                model = build("pretraining", side, c, state, device)
                if ckpt:
                    model.gradient_checkpointing_enable()
                return model

            row = Row("pretrain", group, label, impl, variant, shape, baseline=impl == "transformers")
            row.note = note if impl == "transformers" else ""
            measure(row, make, batches, device, args, compiled=compiled)
            rows.append(row)
        del batches


def plan_check(rows: list[Row], args, device_name: str) -> list[dict[str, Any]]:
    """`bert pretrain --plan`'s prediction (bert.plan.make_plan) beside each measured pre-training row of ours:
    peak memory, and seconds per step at the plan's default MFU (0.4) and at the MFU the row measured."""
    kind = next((k for k in DEVICES if k in device_name), "H100")
    c = shapes(args)["base"]
    out = []
    for r in rows:
        if r.section != "pretrain" or r.impl not in ("ours", "ours + grad ckpt") or r.error or not r.seq_per_s:
            continue
        batch, seq = (int(x) for x in r.shape.split(" x "))
        preds = int(r.variant.split("MLM at ")[1].split()[0])
        ckpt = "gradient_checkpointing" if "grad ckpt" in r.impl else "no_checkpointing"
        plan = make_plan(
            c,
            train_batch_size=batch,
            max_seq_length=seq,
            max_predictions_per_seq=preds,
            devices=f"1x{kind}",
            precision="bf16",
        )
        measured_step = batch / r.seq_per_s
        out.append(
            {
                "row": f"{r.model} {r.shape} {r.impl}",
                "plan_device": kind,
                "plan_peak_gib": plan["memory_per_device"][ckpt]["peak"] / GIB,
                "measured_peak_gib": r.peak_gib,
                "plan_step_s_at_40pct": plan["seconds_per_step"][ckpt],
                "measured_step_s": measured_step,
                "plan_mfu_implied": plan["seconds_per_step"][ckpt] * plan["mfu"] / measured_step,
            }
        )
    return out


def section_squad(args, device, hf: bool, rows: list[Row]) -> None:
    """Appends each row as it is measured (a time limit keeps the rows before it)."""
    max_seq, batch = (64, 4) if args.quick else (384, 32)
    tokenizer = tokenizer_of(data_dir(args.data_dir))
    features, source = squad_features(
        data_dir(args.data_dir),
        tokenizer,
        max_seq,
        16 if args.quick else 128,
        16 if args.quick else 64,
        limit=40 if args.quick else None,
    )
    lengths = np.array([len(ids) for ids, _ in features])
    args.sources["squad"] = source
    print(
        f"  SQuAD features: {source}; {len(features)} features, mean length {lengths.mean():.1f}, "
        f"{100 * (lengths == max_seq).mean():.0f}% at {max_seq}"
    )
    for name, c in shapes(args).items():
        label = f"BERT-{name.capitalize()}" if not args.quick else f"tiny ({name} stand-in)"
        state = reference_state("qa", c, device)
        n = 3 if args.quick else 24
        batches = [b.to(device) for b in squad_batches(c, features, n, batch, max_seq, seed=1)]
        real = sum(b.tokens for b in batches) / (len(batches) * batch * max_seq)
        group = f"squad-{name}"
        shape = f"{batch} x {max_seq}"
        note = parity_note("qa", c, state, batches[0], device) if hf else ""
        variants = [
            ("ours", "dynamic padding + unpadding", False, False),
            ("ours + grad ckpt", "dynamic padding + unpadding + gradient checkpointing", False, True),
            ("transformers", f"padded to {max_seq}", False, False),
        ]
        if args.compile and (name == "base" or args.quick):
            variants += [("ours + compile", "dynamic padding + unpadding", True, False)]
            variants += [("transformers + compile", f"padded to {max_seq}", True, False)]
        for impl, variant, compiled, ckpt in variants:
            if impl.startswith("transformers") and not hf:
                continue
            side = "ours" if impl.startswith("ours") else "theirs"

            def make(side=side, ckpt=ckpt, c=c, state=state):
                model = build("qa", side, c, state, device)
                if ckpt:
                    model.gradient_checkpointing_enable()
                return model

            row = Row("squad", group, label, impl, variant, shape, baseline=impl == "transformers")
            row.note = note if impl == "transformers" else f"{100 * real:.0f}% real tokens"
            measure(row, make, batches, device, args, compiled=compiled)
            rows.append(row)
        del batches


def section_inference(args, device, hf: bool, rows: list[Row]) -> None:
    """Appends each row as it is measured (a time limit keeps the rows before it)."""
    max_seq, batch = (128, 16) if args.quick else (128, 128)
    c = shapes(args)["base"]
    label = "BERT-Base" if not args.quick else "tiny (L-2_H-64)"
    tokenizer = tokenizer_of(data_dir(args.data_dir))
    features, source = glue_features(data_dir(args.data_dir), tokenizer, max_seq, 64 if args.quick else None, seed=0)
    lengths = np.array([len(ids) for ids, _ in features])
    args.sources["glue"] = source
    print(f"  GLUE dev: {source}; mean length {lengths.mean():.1f}, max {lengths.max()}")
    state = reference_state("classification", c, device)
    batches = [b.to(device) for b in inference_batches(c, features, batch, max_seq)]
    real = sum(b.tokens for b in batches) / (len(batches) * batch * max_seq)
    group, shape = "inference", f"{batch} x <={max_seq}"
    note = parity_note("classification", c, state, batches[0], device) if hf else ""
    variants = [
        ("ours", "dynamic padding + unpadding", None, False),
        ("transformers", "padded to the batch's longest", None, False),
        ("transformers", f"padded to {max_seq}", "max", False),
    ]
    if args.compile:
        variants += [("ours + compile", "dynamic padding + unpadding", None, True)]
        variants += [("transformers + compile", "padded to the batch's longest", None, True)]
    for impl, variant, layout, compiled in variants:
        if impl.startswith("transformers") and not hf:
            continue
        side = "ours" if impl.startswith("ours") else "theirs"
        row = Row("inference", group, label, impl, variant, shape, baseline=impl == "transformers" and layout is None)
        row.note = (
            note if row.baseline else (f"{100 * real:.0f}% of 128-padded tokens are real" if side == "ours" else "")
        )
        measure(
            row,
            lambda s=side: build("classification", s, c, state, device),
            batches,
            device,
            args,
            train=False,
            layout=layout,
            compiled=compiled,
        )
        rows.append(row)


def loss_curve_data(c: BertConfig, data: Path | None, quick: bool, batch: int, seq: int, preds: int, seed: int):
    """Pre-training batches of real text (the shared corpus, or sample_text.txt with --quick), made by the
    original's instance creation; random ids with a warning when the data is absent."""
    from bert.pretraining.instances import create_training_instances, instance_to_features, read_documents

    tokenizer = tokenizer_of(data)
    files: list[Path] = []
    if data is not None and tokenizer is not None:
        if quick and (data / "sample_text.txt").is_file():
            files = [data / "sample_text.txt"]
        else:
            corpus = sorted((data / "corpus").glob("*/*.txt.gz")) if (data / "corpus").is_dir() else []
            files = corpus[:8]  # about 6 MB of text: ~25,000 instances of 128 tokens with dupe_factor 2
    if not files:
        print("WARNING: no corpus or vocab in the shared data: the loss curve uses random tokens")
        return pretraining_batches(c, 64, batch, seq, preds, seed), "random tokens"
    documents = read_documents([str(f) for f in files], tokenizer, decode_errors="replace")
    instances = create_training_instances(
        documents, list(tokenizer.vocab), seq, 2 if not quick else 1, 0.1, 0.15, preds, random.Random(seed)
    )
    keys = ("input_ids", "input_mask", "segment_ids", "masked_lm_positions", "masked_lm_ids", "masked_lm_weights")
    batches = []
    for i in range(0, len(instances) - batch + 1, batch):
        feats = [instance_to_features(x, tokenizer.vocab, seq, preds) for x in instances[i : i + batch]]
        t = {k: torch.tensor([f[k] for f in feats]) for k in (*keys, "next_sentence_labels")}
        ours = {
            "input_ids": t["input_ids"],
            "attention_mask": t["input_mask"],
            "token_type_ids": t["segment_ids"],
            "masked_lm_positions": t["masked_lm_positions"],
            "masked_lm_ids": t["masked_lm_ids"],
            "masked_lm_weights": t["masked_lm_weights"].float(),
            "next_sentence_labels": t["next_sentence_labels"].squeeze(1),
        }
        batches.append(Batch(ours, {}, batch, int(t["input_mask"].sum()), 0.0))
    names = ", ".join(f.name for f in files)
    return batches, f"{len(instances)} instances from {names}"


def smoothed(x: np.ndarray, window: int) -> np.ndarray:
    return np.convolve(x, np.ones(window) / window, mode="valid")


def section_loss_curve(args, device) -> dict[str, Any]:
    steps = args.loss_curve
    c = named_config("L-2_H-64" if args.quick else "L-4_H-256")
    batch, seq, preds = (8, 64, 10) if args.quick else (64, 128, 20)
    batches, source = loss_curve_data(c, data_dir(args.data_dir), args.quick, batch, seq, preds, seed=0)
    batches = [b.to(device) for b in batches]
    args.sources["loss_curve"] = source
    print(f"  data: {source}; {len(batches)} batches of {batch} x {seq}; {steps} steps each")
    curves = {}
    lr, warmup = 5e-4, max(1, steps // 10)
    for precision in ("bf16", "fp32"):
        torch.manual_seed(1234)  # the same initialisation and dropout masks
        with torch.device(device):
            model = BertForPreTraining(c).train()
        optimizer, scheduler = create_optimizer(model, lr, steps, warmup)
        losses = []
        start = time.perf_counter()
        for s in range(steps):
            with autocast(device, precision):
                loss = model(**batches[s % len(batches)].ours).total_loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(loss.detach())
        curves[precision] = torch.stack(losses).float().cpu().numpy()
        print(
            f"  {precision}: {steps} steps in {time.perf_counter() - start:.1f} s, "
            f"loss {curves[precision][0]:.4f} -> {curves[precision][-1]:.4f}"
        )
        del model, optimizer
        free(device)
    a, b = curves["bf16"], curves["fp32"]
    window = max(1, min(100, steps // 10))
    sa, sb = smoothed(a, window), smoothed(b, window)
    rel = np.abs(sa - sb) / np.abs(sb)
    return {
        "model": "L-2_H-64" if args.quick else "L-4_H-256",
        "data": source,
        "batch": batch,
        "seq": seq,
        "steps": steps,
        "learning_rate": lr,
        "warmup_steps": warmup,
        "window": window,
        "max_rel_diff": float(rel.max()),
        "mean_rel_diff": float(rel.mean()),
        "final_rel_diff": float(rel[-1]),
        "per_step_mean_rel_diff": float(np.mean(np.abs(a - b) / np.abs(b))),
        "within_1_percent": bool(rel.max() < 0.01),
        "first_loss": {"bf16": float(a[0]), "fp32": float(b[0])},
        "final_loss": {"bf16": float(sa[-1]), "fp32": float(sb[-1])},
        "loss_bf16": a.tolist(),
        "loss_fp32": b.tolist(),
    }


# ---------------------------------------------------------------------------------------------- report
TITLES = {
    "pretrain": "(a) Pre-training steps (forward + backward + AdamWeightDecay), bf16 autocast",
    "squad": "(b) SQuAD fine-tuning steps, real feature lengths, bf16 autocast",
    "inference": "(c) Inference on GLUE dev sentences, bf16 autocast",
}


def markdown(meta: dict[str, Any], rows: list[Row], curve: dict[str, Any] | None, errors: list[str]) -> str:
    lines = [f"# GPU benchmark ({meta['date']})", ""]
    lines += [f"{meta['device_name']}, torch {meta['torch']}, transformers {meta['transformers']}, `{meta['command']}`"]
    lines += ["", f"FLOPs: {meta['flops_formula']}", ""]
    sources = meta["args"].get("sources") or {}
    if sources:
        lines += ["Data: " + "; ".join(f"{k}: {v}" for k, v in sources.items()), ""]
    check = meta["flop_check"]
    lines += [
        f"FLOP check: BERT-Base, seq 128, 20 masked positions: {check['base_seq128_flops_per_token'] / 1e6:.1f} MFLOP "
        f"per token (issue: ~545; without the MLM head {check['without_mlm_head'] / 1e6:.1f}). "
        f"MFU against a peak of {meta['peak_flops'] / 1e12:.0f} TFLOP/s.",
        "",
    ]
    for section, title in TITLES.items():
        part = [r for r in rows if r.section == section]
        if not part:
            continue
        lines += [f"## {title}", ""]
        lines += [
            "| model | batch x seq | impl | variant | seq/s | real tok/s | vs transformers | TFLOP/s | MFU | peak GiB "
            "| note |",
            "|" + "---|" * 11,
        ]
        for r in part:
            if r.error:
                lines.append(f"| {r.model} | {r.shape} | {r.impl} | {r.variant} | ERROR | | | | | | {r.error} |")
                continue
            ratio = f"{r.ratio:.2f}x" if r.ratio is not None else ""
            mem = f"{r.peak_gib:.2f}" if r.peak_gib is not None else "n/a"
            lines.append(
                f"| {r.model} | {r.shape} | {r.impl} | {r.variant} | {r.seq_per_s:,.1f} | {r.tokens_per_s:,.0f} | "
                f"{ratio} | {r.tflops:,.1f} | {100 * r.mfu:.1f}% | {mem} | {r.note} |"
            )
        lines.append("")
    if rows:
        lines += ["## (d) Peak memory (weights, gradients, optimizer state, activations)", ""]
        lines += ["| section | model | batch x seq | impl | variant | peak GiB | vs transformers |", "|" + "---|" * 7]
        for r in rows:
            if r.error:
                continue
            mem = f"{r.peak_gib:.2f}" if r.peak_gib is not None else "n/a (not CUDA)"
            ratio = f"{r.memory_ratio:.2f}x" if r.memory_ratio is not None else ""
            lines.append(f"| {r.section} | {r.model} | {r.shape} | {r.impl} | {r.variant} | {mem} | {ratio} |")
        lines.append("")
    if curve:
        lines += ["## Loss curves: bf16 autocast vs fp32, same seed and batches", ""]
        lines += [
            f"{curve['model']}, batch {curve['batch']} x {curve['seq']}, {curve['steps']} steps, lr "
            f"{curve['learning_rate']} (warmup {curve['warmup_steps']}), data: {curve['data']}. Relative difference "
            f"of the {curve['window']}-step moving averages.",
            "",
            "| first loss bf16 / fp32 | final loss bf16 / fp32 | max rel diff | mean rel diff | final rel diff | "
            "per-step mean rel diff | within 1% |",
            "|" + "---|" * 7,
            f"| {curve['first_loss']['bf16']:.4f} / {curve['first_loss']['fp32']:.4f} | "
            f"{curve['final_loss']['bf16']:.4f} / {curve['final_loss']['fp32']:.4f} | "
            f"{100 * curve['max_rel_diff']:.2f}% | {100 * curve['mean_rel_diff']:.2f}% | "
            f"{100 * curve['final_rel_diff']:.2f}% | {100 * curve['per_step_mean_rel_diff']:.2f}% | "
            f"{'yes' if curve['within_1_percent'] else 'NO'} |",
            "",
        ]
    if errors:
        lines += ["## Errors", ""] + [f"- {e}" for e in errors] + [""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    parser.add_argument("--out", default="bench/out/gpu", help="directory for gpu.json and gpu.md")
    parser.add_argument("--quick", action="store_true", help="tiny shapes and few steps (the CPU smoke test)")
    parser.add_argument("--compile", action="store_true", help="also measure torch.compile variants")
    parser.add_argument("--sections", default=",".join(SECTIONS), help=f"comma separated, of {', '.join(SECTIONS)}")
    parser.add_argument(
        "--loss-curve",
        "--loss_curve",
        dest="loss_curve",
        type=int,
        default=None,
        help="steps per precision of the loss-curve comparison (default 2000; 10 with --quick)",
    )
    parser.add_argument(
        "--peak-flops",
        "--peak_flops",
        dest="peak_flops",
        type=float,
        default=790e12,
        help="peak FLOP/s for MFU (default: 790e12, the measured bf16 matmul peak of the H200)",
    )
    parser.add_argument(
        "--measure-peak",
        "--measure_peak",
        dest="measure_peak",
        action="store_true",
        help="on CUDA, measure the bf16 matmul peak first (8192^3 products on random data) and use it for MFU",
    )
    parser.add_argument("--steps", type=int, default=None, help="timed steps per row (default: 20, or every batch)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed steps per row (default 3; 1 with --quick)")
    parser.add_argument(
        "--data-dir",
        "--data_dir",
        dest="data_dir",
        default=None,
        help="the shared data folder (default: ../shared/data beside the repo, or shared/data in it)",
    )
    args = parser.parse_args()
    sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = sorted(set(sections) - set(SECTIONS))
    if unknown:
        parser.error(f"--sections: unknown {', '.join(unknown)}; use {', '.join(SECTIONS)}")
    if args.loss_curve is None:
        args.loss_curve = 10 if args.quick else 2000
    if args.warmup is None:
        args.warmup = 1 if args.quick else 3
    if args.steps is None and args.quick:
        args.steps = 2
    args.sources = {}  # the data each section used, for the report
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    device = resolve_device(args.device)
    if args.measure_peak and device.type == "cuda":
        args.peak_flops = measured_peak_flops(device)
        print(f"measured bf16 matmul peak: {args.peak_flops / 1e12:.0f} TFLOP/s (MFU is against it)")
    if args.compile:
        torch._dynamo.config.recompile_limit = 64  # dynamic padding: several shapes before dynamic kicks in
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    try:
        import transformers

        hf_version = transformers.__version__
    except ImportError:
        hf_version = "absent"
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else (platform.processor() or "cpu")
    meta = {
        "date": datetime.date.today().isoformat(),
        "command": "python bench/gpu.py " + " ".join(sys.argv[1:]),
        "device": str(device),
        "device_name": device_name,
        "torch": torch.__version__,
        "transformers": hf_version,
        "python": platform.python_version(),
        "peak_flops": args.peak_flops,
        "flops_formula": "training FLOPs per token = 6 * N(encoder blocks) + 12 * L * T * H (attention) "
        "+ 6 * (H^2 + H * V) per masked position (MLM head) + head terms; inference a third; real tokens only",
        "flop_check": flop_check(),
        "args": vars(args),
    }
    check = meta["flop_check"]
    print(f"{device_name}; torch {torch.__version__}; transformers {hf_version}")
    print(f"FLOPs: {meta['flops_formula']}")
    print(
        f"FLOP check: BERT-Base seq 128, 20 masked: {check['base_seq128_flops_per_token'] / 1e6:.1f} MFLOP/token "
        f"(issue: ~545; {100 * (check['base_seq128_flops_per_token'] / 545e6 - 1):+.1f}%), "
        f"without the MLM head {check['without_mlm_head'] / 1e6:.1f}"
    )
    hf = have_transformers()
    rows: list[Row] = []
    curve = None
    errors: list[str] = []
    runners = {"pretrain": section_pretrain, "squad": section_squad, "inference": section_inference}
    for section in sections:
        start = time.perf_counter()
        print(f"\n== {section} ==", flush=True)
        try:
            if section == "loss_curve":
                if args.loss_curve > 0:
                    curve = section_loss_curve(args, device)
            else:
                runners[section](args, device, hf, rows)
        except Exception as e:
            errors.append(f"{section}: {type(e).__name__}: {e}")
            print(f"  ERROR in section {section}: {type(e).__name__}: {e}")
            traceback.print_exc(limit=6)
        except KeyboardInterrupt:  # a time limit (SIGINT): report the rows measured so far
            errors.append(f"{section}: interrupted")
            print(f"  {section}: interrupted; reporting the rows measured so far")
            break
        print(f"  ({section}: {time.perf_counter() - start:.1f} s)")
        free(device)
    add_ratios(rows)
    plans = plan_check(rows, args, device_name)
    for p in plans:
        print(
            f"plan vs measured, {p['row']}: peak {p['plan_peak_gib']:.2f} GiB planned, "
            f"{p['measured_peak_gib'] if p['measured_peak_gib'] is None else round(p['measured_peak_gib'], 2)} "
            f"measured; step {p['plan_step_s_at_40pct']:.4f} s planned at 40% MFU ({p['plan_device']} peak), "
            f"{p['measured_step_s']:.4f} s measured (the plan's FLOPs at {100 * p['plan_mfu_implied']:.0f}% MFU)"
        )
    errors += [f"{r.section} {r.model} {r.impl} ({r.variant}): {r.error}" for r in rows if r.error]
    report = markdown(meta, rows, curve, errors)
    if plans:
        report += "\n\n## `--plan` against the measured pre-training rows\n\n"
        report += "| row | planned peak GiB | measured peak GiB | planned s/step at 40% MFU | measured s/step |\n"
        report += "|---|---:|---:|---:|---:|\n"
        for p in plans:
            measured = "n/a" if p["measured_peak_gib"] is None else f"{p['measured_peak_gib']:.2f}"
            report += (
                f"| {p['row']} | {p['plan_peak_gib']:.2f} | {measured} | {p['plan_step_s_at_40pct']:.4f} | "
                f"{p['measured_step_s']:.4f} |\n"
            )
    print("\n" + report)
    (out / "gpu.md").write_text(report + "\n", encoding="utf-8")
    result = {"meta": meta, "rows": [r.__dict__ for r in rows], "plan": plans, "loss_curve": curve, "errors": errors}
    (out / "gpu.json").write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {out / 'gpu.md'} and {out / 'gpu.json'}")


if __name__ == "__main__":
    main()
