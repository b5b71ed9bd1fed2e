"""Pre-training step throughput (sequences/s), ours vs transformers' BertForPreTraining.

One step = forward, the MLM + NSP loss, backward, global-norm clipping at 1.0 and an optimizer step, at
BERT-Tiny (L-2_H-128) and BERT-Mini (L-4_H-256) shapes, seq 128, 20 masked positions, batch 32, fp32.
Both models get the same config, the same weights, the same batch and the same optimizer (the
original's AdamWeightDecay). The difference is the models' own: ours computes MLM logits only at the 20
masked positions (as the original does), transformers computes them at all 128 positions and ignores
the unmasked ones with label -100 — that is part of the comparison. CPU time per step is also reported,
since the machine may be shared; the two models' steps alternate so that both see the same load, and
the best of the timed steps is kept. Ratios are transformers' time / ours (above 1: ours is faster).

    python bench/bench_pretrain_step.py [--shapes tiny,mini] [--steps 3] [--batch_size 32] [--threads N]
"""

from __future__ import annotations

import argparse
import time

import torch
from isa import add_argument as add_isa_argument  # this folder is sys.path[0]
from isa import apply as apply_isa
from isa import cpu_name

from bert.config import named_config
from bert.modeling import BertForPreTraining
from bert.optimization import create_optimizer


def make_batch(batch_size: int, seq: int, preds: int, vocab: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """A random pre-training batch in our layout; every sequence full length, `preds` masked positions."""
    g = torch.Generator().manual_seed(seed)
    positions = torch.stack([torch.randperm(seq - 2, generator=g)[:preds].sort().values + 1 for _ in range(batch_size)])
    return {
        "input_ids": torch.randint(1000, vocab, (batch_size, seq), generator=g),
        "attention_mask": torch.ones(batch_size, seq, dtype=torch.long),
        "token_type_ids": (torch.arange(seq) >= seq // 2).long().expand(batch_size, seq).contiguous(),
        "masked_lm_positions": positions,
        "masked_lm_ids": torch.randint(1000, vocab, (batch_size, preds), generator=g),
        "masked_lm_weights": torch.ones(batch_size, preds),
        "next_sentence_labels": torch.randint(0, 2, (batch_size,), generator=g),
    }


def hf_inputs(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    labels = torch.full_like(batch["input_ids"], -100)
    labels.scatter_(1, batch["masked_lm_positions"], batch["masked_lm_ids"])
    return {
        "input_ids": batch["input_ids"],
        "attention_mask": batch["attention_mask"],
        "token_type_ids": batch["token_type_ids"],
        "labels": labels,
        "next_sentence_label": batch["next_sentence_labels"],
    }


class Stepper:
    """One training step of a model: forward, loss, backward, clipping, optimizer step; timed."""

    def __init__(self, model, inputs, loss_of):
        self.model, self.inputs, self.loss_of = model.train(), inputs, loss_of
        self.opt, _ = create_optimizer(model, 1e-4, 1000, 0)
        self.wall, self.cpu = [], []

    def step(self) -> None:
        t0, c0 = time.perf_counter(), time.process_time()
        loss = self.loss_of(self.model(**self.inputs))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.wall.append(time.perf_counter() - t0)
        self.cpu.append(time.process_time() - c0)


def time_alternating(a: Stepper, b: Stepper, steps: int, warmup: int = 2) -> None:
    """Alternate steps of `a` and `b`, so that both see the same load on a shared machine."""
    for _ in range(warmup + steps):
        a.step()
        b.step()
    for s in (a, b):
        s.wall, s.cpu = s.wall[warmup:], s.cpu[warmup:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="tiny,mini")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--preds", type=int, default=20)
    parser.add_argument("--threads", type=int, default=None)
    add_isa_argument(parser)
    args = parser.parse_args()
    apply_isa(args.isa)
    if args.threads:
        torch.set_num_threads(args.threads)
    import transformers

    print(
        f"torch {torch.__version__}, transformers {transformers.__version__}, {cpu_name()}, {torch.get_num_threads()} "
        "threads;"
        f" batch {args.batch_size}, seq {args.seq}, {args.preds} predictions, fp32"
    )
    head = ("shape", "ours seq/s", "hf seq/s", "ratio", "ours cpu s", "hf cpu s", "cpu ratio")
    print(" ".join(f"{h:>{w}}" for h, w in zip(head, (6, 11, 9, 6, 10, 9, 9))))
    for shape in args.shapes.split(","):
        config = named_config(shape, vocab_size=30522)
        config.hidden_dropout_prob = config.attention_probs_dropout_prob = 0.0  # same work, no RNG difference
        torch.manual_seed(0)
        ours = BertForPreTraining(config)
        theirs = transformers.BertForPreTraining(
            transformers.BertConfig(
                vocab_size=config.vocab_size,
                hidden_size=config.hidden_size,
                num_hidden_layers=config.num_hidden_layers,
                num_attention_heads=config.num_attention_heads,
                intermediate_size=config.intermediate_size,
                hidden_act="gelu_new",  # the original's tanh GELU, as ours
                hidden_dropout_prob=0.0,
                attention_probs_dropout_prob=0.0,
                max_position_embeddings=config.max_position_embeddings,
                type_vocab_size=config.type_vocab_size,
                layer_norm_eps=config.layer_norm_eps,
                attn_implementation="sdpa",
            )
        )
        theirs.load_state_dict(ours.state_dict(), strict=False)
        batch = make_batch(args.batch_size, args.seq, args.preds, config.vocab_size)
        with torch.no_grad():  # same weights, same loss: the two models do the same job
            a, b = float(ours(**batch).total_loss), float(theirs(**hf_inputs(batch)).loss)
        assert abs(a - b) < 1e-3 * abs(a), (a, b)
        a = Stepper(ours, batch, lambda o: o.total_loss)
        h = Stepper(theirs, hf_inputs(batch), lambda o: o.loss)
        time_alternating(a, h, args.steps)
        # Best of the timed steps: the least disturbed by other work on the machine.
        ours_wall, hf_wall, ours_cpu, hf_cpu = min(a.wall), min(h.wall), min(a.cpu), min(h.cpu)
        n = args.batch_size
        print(
            f"{shape:<6} {n / ours_wall:>11.1f} {n / hf_wall:>9.1f} {hf_wall / ours_wall:>6.2f} "
            f"{ours_cpu:>10.3f} {hf_cpu:>9.3f} {hf_cpu / ours_cpu:>9.2f}"
        )


if __name__ == "__main__":
    main()
