"""The whole BERT model in one file: embeddings, post-LayerNorm encoder, pooler, and every head.

References:
- google-research/bert `modeling.py` (the numerics: tanh GELU at its last commit, LayerNorm epsilon
  1e-12, additive -10000 attention mask, truncated-normal init) and `run_pretraining.py` (the
  pre-training heads and losses).
- huggingface/transformers `modeling_bert.py` (the module and parameter names, so its checkpoints load
  with no key map and the original TF names map by a plain scope rename, see `bert/formats/keymaps.py`).

Dimension legend used in the shape comments:
    B batch, T sequence length, H hidden size, N attention heads, D head size (H / N),
    I intermediate size, V vocab size, P masked positions per sequence, C choices, L labels,
    R real (non-padding) tokens of a batch.
"""

from __future__ import annotations

import os
from collections.abc import Collection
from dataclasses import dataclass
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from bert import cpu_kernels as kernels
from bert.checkpoint import load_pretrained, save_pretrained
from bert.config import PROBLEM_TYPES, BertConfig
from bert.errors import InputError

# The original adds -10000 (not -inf) to the scores of padded keys; it is also representable in fp16.
MASK_BIAS = -10000.0


def _activation(name: str) -> nn.Module:
    return {
        "gelu": nn.GELU(approximate="none"),
        "gelu_new": nn.GELU(approximate="tanh"),  # the original's 0.5x(1 + tanh(sqrt(2/pi)(x + 0.044715x^3)))
        "gelu_pytorch_tanh": nn.GELU(approximate="tanh"),
        "relu": nn.ReLU(),
        "tanh": nn.Tanh(),
    }[name]


# ------------------------------------------------------------------------------------------- outputs
@dataclass
class EncoderOutput:
    sequence_output: torch.Tensor  # [B, T, H] the last encoder layer; [B, P, H] when run at P output positions
    pooled_output: torch.Tensor | None  # [B, H] tanh(dense(first token)); None without a pooler
    all_encoder_layers: list[torch.Tensor]  # L x [B, T, H]; index 0 is the first block, the embeddings are not in it
    embedding_output: torch.Tensor  # [B, T, H] after LayerNorm and dropout


@dataclass
class PreTrainingOutput:
    mlm_logits: torch.Tensor  # [B, P, V] at the given positions, or [B, T, V] at every position
    nsp_logits: torch.Tensor  # [B, 2]; label 0 = is next, 1 = random
    total_loss: torch.Tensor | None = None
    masked_lm_loss: torch.Tensor | None = None
    next_sentence_loss: torch.Tensor | None = None
    masked_lm_example_loss: torch.Tensor | None = None  # [B * P]
    next_sentence_example_loss: torch.Tensor | None = None  # [B]
    hidden: EncoderOutput | None = None


@dataclass
class TaskOutput:
    """A fine-tuning head's output. With labels, `loss` = `example_loss.sum()` / the normaliser (the
    number of loss terms of this batch, or of the global batch when the caller passes it)."""

    logits: torch.Tensor  # head-specific, see each head
    loss: torch.Tensor | None = None
    example_loss: torch.Tensor | None = None  # [B] the sum of each example's loss terms
    example_count: torch.Tensor | None = None  # [B] the number of each example's loss terms
    hidden: EncoderOutput | None = None  # the pooled heads' last block runs for [CLS] alone ([B, 1, H])


# ----------------------------------------------------------------------------------------- the model
# With fewer real tokens than this fraction of a padded batch, the encoder runs on real tokens only.
UNPAD_BELOW = 0.9


@dataclass
class Unpadding:
    """Where the real tokens of a padded batch are, to run the encoder on them alone.

    Every layer but attention works token by token, so those layers run on the [R, H] matrix of the R real
    tokens; attention re-pads its q, k, v to [B, T, H] and masks padded keys as usual. Outputs come
    back padded, with zeros at the padded positions (the padded path computes unused values there).
    """

    index: torch.Tensor  # [R] flat positions b * T + t of the real tokens
    batch: int
    seq_len: int

    @classmethod
    def from_mask(cls, attention_mask: torch.Tensor) -> Unpadding:
        B, T = attention_mask.shape
        return cls(attention_mask.reshape(-1).nonzero().squeeze(1), B, T)

    def unpad(self, x: torch.Tensor) -> torch.Tensor:
        return x.reshape(self.batch * self.seq_len, *x.shape[2:]).index_select(0, self.index)  # [B, T, H] -> [R, H]

    def pad(self, x: torch.Tensor) -> torch.Tensor:
        full = x.new_zeros(self.batch * self.seq_len, *x.shape[1:]).index_copy(0, self.index, x)  # [B*T, H]
        return full.view(self.batch, self.seq_len, *x.shape[1:])  # [R, H] -> [B, T, H]


def gather_positions(sequence_output: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Pick the hidden states at `positions` ([B, P]) of each sequence: [B, T, H] -> [B, P, H]."""
    index = positions.long()[:, :, None].expand(-1, -1, sequence_output.shape[-1])  # [B, P, H]
    return torch.gather(sequence_output, 1, index)


def first_token(input_ids: torch.Tensor) -> torch.Tensor:
    """`BertModel`'s output positions for a reader of [CLS] alone (the pooler, [CLS] pooling): [B, 1] zeros."""
    return input_ids.new_zeros(input_ids.shape[0], 1)


class BertEmbeddings(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=None)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        # Not snake case, to match the TF variable scope `LayerNorm` and every released checkpoint.
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = kernels.Dropout(config.hidden_dropout_prob)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor) -> torch.Tensor:
        T = input_ids.shape[1]
        positions = self.position_embeddings.weight[:T]  # [T, H], broadcast over the batch
        x = self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids) + positions
        return self.dropout(self.LayerNorm(x))  # [B, T, H]


class BertSelfAttention(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.head_size = config.head_size
        self.query = nn.Linear(config.hidden_size, config.hidden_size)
        self.key = nn.Linear(config.hidden_size, config.hidden_size)
        self.value = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout_p = config.attention_probs_dropout_prob
        # Set by bert.quantization.quantize_int8: its int8 projections carry less precision than bfloat16's products,
        # so inference attention may multiply in bfloat16 pairs (cpu_kernels.inference_attention).
        self.bf16_products = False

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        # Heads are contiguous D-wide slices of the projection, as in the original.
        return x.view(B, T, self.num_heads, self.head_size).transpose(1, 2)  # [B, T, H] -> [B, N, T, D]

    def forward(
        self,
        hidden: torch.Tensor,
        mask_bias: torch.Tensor | None,
        unpadding: Unpadding | None = None,
        queries: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Every token attends to every real token of its sequence; given `queries` ([B, P, H], some
        tokens of `hidden`), only those do, and the output is theirs alone."""
        # [B, T, H], or [R, H] unpadded
        q, k, v = (
            kernels.linear(self.query, hidden if queries is None else queries),
            kernels.linear(self.key, hidden),
            kernels.linear(self.value, hidden),
        )
        if unpadding is not None:
            k, v = unpadding.pad(k), unpadding.pad(v)  # [R, H] -> [B, T, H]
            q = unpadding.pad(q) if queries is None else q
        # softmax(q k^T / sqrt(D) + mask_bias) v, mask_bias [B, 1, 1, T] masks padded keys only.
        dropout = self.training and self.dropout_p > 0.0
        context = (
            kernels.training_attention(q, k, v, mask_bias, self.num_heads, self.dropout_p)
            if dropout
            else kernels.inference_attention(q, k, v, mask_bias, self.num_heads, self.bf16_products)
        )
        if context is None:
            B, T, H = q.shape
            q, k, v = self._heads(q), self._heads(k), self._heads(v)  # [B, N, T, D]
            if dropout and q.device.type == "cpu" and kernels.native_kernels():
                # SDPA's CPU kernels have no dropout: it would take this math path, keeping [B, N, T, T] tensors.
                context = kernels.attention_dropout(q, k, v, mask_bias, self.head_size**-0.5, self.dropout_p)
            else:
                context = F.scaled_dot_product_attention(
                    q, k, v, attn_mask=mask_bias, dropout_p=self.dropout_p if dropout else 0.0
                )  # [B, N, T, D]
            context = context.transpose(1, 2).reshape(B, T, H)  # [B, N, T, D] -> [B, T, H]
        return unpadding.unpad(context) if unpadding is not None and queries is None else context


class BertSelfOutput(nn.Module):
    """dense -> dropout -> add the sub-layer's input -> LayerNorm, after attention (`attention/output`)."""

    def __init__(self, config: BertConfig, in_features: int | None = None):
        super().__init__()
        self.dense = nn.Linear(in_features or config.hidden_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = kernels.Dropout(config.hidden_dropout_prob)

    def forward(self, hidden: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        if isinstance(self.dense, kernels.Int8Linear) and not self.training:
            return self.LayerNorm(self.dense(hidden, residual=residual))
        return self.LayerNorm(self.dropout(kernels.linear(self.dense, hidden)) + residual)


class BertAttention(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.self = BertSelfAttention(config)
        self.output = BertSelfOutput(config)

    def forward(
        self,
        hidden: torch.Tensor,
        mask_bias: torch.Tensor | None,
        unpadding: Unpadding | None = None,
        queries: torch.Tensor | None = None,
    ):
        residual = hidden if queries is None else queries
        return self.output(self.self(hidden, mask_bias, unpadding, queries), residual)


class BertIntermediate(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.intermediate_size)
        self.intermediate_act_fn = _activation(config.hidden_act)
        self.fused_activation = kernels.FUSED_ACTIVATIONS.get(config.hidden_act)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.fused_activation is not None and isinstance(self.dense, kernels.Int8Linear):
            return self.dense(hidden, self.fused_activation)
        if self.fused_activation is not None and kernels.onednn_inference(self.dense, hidden):
            d = self.dense
            weight = kernels.inference_weight(d.weight)
            return torch.ops.mkldnn._linear_pointwise(hidden, weight, d.bias, *self.fused_activation)  # [B, T, I]
        return self.intermediate_act_fn(kernels.linear(self.dense, hidden))  # [B, T, I]


class BertOutput(BertSelfOutput):
    """The same, after the feed-forward layer (`layer_n/output` in TF): its input is I wide."""

    def __init__(self, config: BertConfig):
        super().__init__(config, config.intermediate_size)


class BertLayer(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.attention = BertAttention(config)
        self.intermediate = BertIntermediate(config)
        self.output = BertOutput(config)

    def forward(
        self,
        hidden: torch.Tensor,
        mask_bias: torch.Tensor | None,
        unpadding: Unpadding | None = None,
        positions: torch.Tensor | None = None,
    ):
        """The block's output at every token, or at `positions` ([B, P]) alone ([B, P, H]): their keys
        and values still come from every token, and nothing else of the block reaches those tokens'
        outputs, so they are the whole block's at those positions."""
        queries = None
        if positions is not None:
            queries = gather_positions(hidden if unpadding is None else unpadding.pad(hidden), positions)
        attention_output = self.attention(hidden, mask_bias, unpadding, queries)
        return kernels.by_rows(self.feed_forward, attention_output, self.training)

    def feed_forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.output(self.intermediate(x), x)


class BertEncoder(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(config) for _ in range(config.num_hidden_layers))
        self.gradient_checkpointing = False

    def forward(
        self,
        hidden: torch.Tensor,
        mask_bias: torch.Tensor | None,
        unpadding: Unpadding | None = None,
        output_positions: torch.Tensor | None = None,
    ) -> list[torch.Tensor]:
        """Every block's output; with `output_positions` the last block's is theirs alone, [B, P, H]."""
        outputs = []
        for i, layer in enumerate(self.layer):
            positions = output_positions if i == len(self.layer) - 1 else None
            if self.gradient_checkpointing and self.training and torch.is_grad_enabled():
                hidden = checkpoint(layer, hidden, mask_bias, unpadding, positions, use_reentrant=False)
            else:
                hidden = layer(hidden, mask_bias, unpadding, positions)
            outputs.append(hidden)
        return outputs


class BertPooler(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.activation = nn.Tanh()

    def forward(self, sequence_output: torch.Tensor) -> torch.Tensor:
        return self.activation(kernels.linear(self.dense, sequence_output[:, 0]))  # [B, H]


class BertPreTrainedModel(nn.Module):
    """Weight initialisation, loading and saving shared by every model class."""

    config: BertConfig

    def _init_weights(self, module: nn.Module) -> None:
        # The original initialises every matrix and table with a normal truncated at 2 stddev.
        std = self.config.initializer_range
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.trunc_normal_(module.weight, std=std, a=-2 * std, b=2 * std)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)

    def init_weights(self, keep: Collection[str] = ()) -> None:
        """The original's initialisation of every parameter but those named in `keep` (weights a checkpoint gave:
        `bert.checkpoint.build_loaded`), in one order whatever `keep` holds."""
        kept = {id(p) for name, p in self.named_parameters(remove_duplicate=False) if name in keep}

        def init(module: nn.Module) -> None:
            own = list(module.parameters(recurse=False))
            if own and all(id(p) in kept for p in own):
                return
            # A layer partly in `keep` (a bias the checkpoint lacks) is initialised whole, its given part put back.
            given = [(p, p.detach().clone()) for p in own if id(p) in kept]
            self._init_weights(module)
            with torch.no_grad():
                for p, value in given:
                    p.copy_(value)

        self.apply(init)

    def set_unpad(self, unpad: bool | None) -> None:
        """Run the encoder on real tokens only (True), on padded batches (False), or decide per batch (None)."""
        for m in self.modules():
            if isinstance(m, BertModel):
                m.unpad = unpad

    def set_encoder_dtype(self, dtype: torch.dtype) -> None:
        """Run the Transformer blocks in `dtype` (bfloat16 or float16 for faster inference; float32 as built).

        The embeddings, the pooler and the heads stay float32, and so does every output: the blocks' input is
        cast down and their outputs back up, so callers see the float32 model's types with values within the
        dtype's rounding (bench/RESULTS.md measures what it costs in accuracy).
        """
        for m in self.modules():
            if isinstance(m, BertModel):
                m.encoder.to(dtype)
                m.encoder_dtype = None if dtype == torch.float32 else dtype

    def gradient_checkpointing_enable(self, enable: bool = True) -> None:
        """Recompute each block's activations in the backward pass: less memory, about 30% more compute."""
        for m in self.modules():
            if isinstance(m, BertEncoder):
                m.gradient_checkpointing = enable

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, config: BertConfig | None = None, **kwargs):
        """Load from a native or transformers directory, a safetensors/.bin file, or a TF checkpoint.

        Weights missing from the checkpoint (e.g. a new task head) keep their random initialisation;
        weights of other heads in the checkpoint (e.g. `cls.*` when fine-tuning) are ignored, as the
        original's `get_assignment_map_from_checkpoint` does. Extra keyword arguments go to the class
        constructor (e.g. `num_labels=3`).
        """
        return load_pretrained(cls, path, config=config, **kwargs)

    def save_pretrained(self, output_dir: str | os.PathLike) -> None:
        """Write `model.safetensors` and `config.json` into `output_dir` (atomically)."""
        save_pretrained(self, output_dir)


def validate_ids(config: BertConfig, input_ids: torch.Tensor, token_type_ids: torch.Tensor) -> None:
    """Clear errors for ids the embedding tables do not have (the original gives NaNs or zeros instead)."""
    if input_ids.numel() == 0:
        return
    lo, hi = int(input_ids.min()), int(input_ids.max())
    if lo < 0 or hi >= config.vocab_size:
        raise InputError(
            f"input_ids contain {hi if hi >= config.vocab_size else lo}, outside [0, {config.vocab_size - 1}] "
            f"(config vocab_size={config.vocab_size}); use the vocab.txt the model was trained with"
        )
    lo, hi = int(token_type_ids.min()), int(token_type_ids.max())
    if lo < 0 or hi >= config.type_vocab_size:
        raise InputError(
            f"token_type_ids (segment ids) contain {hi if hi >= config.type_vocab_size else lo}, outside "
            f"[0, {config.type_vocab_size - 1}] (config type_vocab_size={config.type_vocab_size})"
        )


class BertModel(BertPreTrainedModel):
    """The encoder: embeddings, L post-LayerNorm Transformer blocks, and the pooler.

    Args:
        config: the architecture.
        add_pooling_layer: build `pooler` (the original always has it; transformers' QA and token
            classification models do not).
        initialise: draw the weights (`init_weights`); False for the encoder of a head model, whose own
            `init_weights` draws every weight once (drawing the encoder's here as well took 3.7 s of BERT-Base's
            8.3 s construction, all of it drawn again).
    """

    def __init__(self, config: BertConfig, add_pooling_layer: bool = True, initialise: bool = True):
        super().__init__()
        self.config = config
        self.embeddings = BertEmbeddings(config)
        self.encoder = BertEncoder(config)
        self.pooler = BertPooler(config) if add_pooling_layer else None
        self.unpad: bool | None = None
        self.encoder_dtype: torch.dtype | None = None  # set_encoder_dtype
        if initialise:
            self.init_weights()

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        output_positions: torch.Tensor | None = None,
    ) -> EncoderOutput:
        """Run the encoder.

        Args:
            input_ids: [B, T] WordPiece ids.
            attention_mask: [B, T], 1 for real tokens and 0 for padding (the original's `input_mask`).
            token_type_ids: [B, T] segment ids (the original's `segment_ids`); zeros when None.
            output_positions: [B, P] positions whose last-block outputs alone the caller reads (the
                pooler reads position 0, the masked LM its masked positions): the last block runs for
                them alone, and `sequence_output` (the last of `all_encoder_layers`) is [B, P, H], the
                whole block's outputs at those positions; the pooler then reads `output_positions[:, 0]`.

        `self.unpad` chooses the path: True runs the encoder on real tokens only (see `Unpadding`), False
        on the padded batch, None (the default) decides per batch by the share of real tokens. Real
        tokens' outputs are the same either way.
        """
        if input_ids.dim() != 2:
            raise InputError(f"input_ids must have shape [batch, seq_len], got {tuple(input_ids.shape)}")
        B, T = input_ids.shape
        if T > self.config.max_position_embeddings:
            raise InputError(
                f"sequence length {T} exceeds max_position_embeddings={self.config.max_position_embeddings}; "
                f"lower max_seq_length to at most {self.config.max_position_embeddings}"
            )
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        if not torch.compiler.is_compiling():
            validate_ids(self.config, input_ids, token_type_ids)
        embedding_output = self.embeddings(input_ids, token_type_ids)
        hidden = embedding_output if self.encoder_dtype is None else embedding_output.to(self.encoder_dtype)
        mask_bias = unpadding = None
        if attention_mask is not None:
            # [B, T] -> [B, 1, 1, T]: only keys are masked; padded queries are computed and ignored (skipped by
            # the compiled training attention, `cpu_kernels.training_attention`).
            mask_bias = (1.0 - attention_mask[:, None, None, :].to(hidden.dtype)) * MASK_BIAS
            unpad = self.unpad
            if unpad is None:
                unpad = not torch.compiler.is_compiling() and float(attention_mask.float().mean()) < UNPAD_BELOW
            if unpad:
                unpadding = Unpadding.from_mask(attention_mask)
        if unpadding is not None:
            layers = self.encoder(unpadding.unpad(hidden), mask_bias, unpadding, output_positions)
            # A last block run at output positions gives [B, P, H] already.
            layers = [unpadding.pad(h) if h.dim() == 2 else h for h in layers]
        else:
            layers = self.encoder(hidden, mask_bias, output_positions=output_positions)
        if self.encoder_dtype is not None:
            layers = [h.to(embedding_output.dtype) for h in layers]
        pooled = self.pooler(layers[-1]) if self.pooler is not None else None
        return EncoderOutput(layers[-1], pooled, layers, embedding_output)

    def last_layer_qkv(self, out: EncoderOutput) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The queries, keys and values of the last block's self-attention in the pass that gave `out`,
        each [B, T, H] (all heads side by side, as the projections give them), for MiniLM-style distillation.

        They are recomputed from the block's input (the previous block's output) rather than kept by the
        forward pass, which so carries no switch and costs nothing when they are not asked for. Padded
        positions hold the projections of zeros: mask them.
        """
        inputs = out.all_encoder_layers[-2] if len(out.all_encoder_layers) > 1 else out.embedding_output
        # A ModuleList's items are typed as plain modules.
        attention = cast(BertLayer, self.encoder.layer[-1]).attention.self
        if self.encoder_dtype is not None:
            inputs = inputs.to(self.encoder_dtype)
        q, k, v = (
            kernels.linear(p, inputs).to(out.sequence_output.dtype)
            for p in (attention.query, attention.key, attention.value)
        )
        return q, k, v


# --------------------------------------------------------------------------------- pre-training heads
class BertPredictionHeadTransform(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.transform_act_fn = _activation(config.hidden_act)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.transform_act_fn(kernels.linear(self.dense, hidden)))


class BertLMPredictionHead(nn.Module):
    """Masked-LM head; its output matrix is the word-embedding table (tied, as in the original)."""

    def __init__(self, config: BertConfig, word_embeddings: nn.Embedding):
        super().__init__()
        self.transform = BertPredictionHeadTransform(config)
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.decoder.weight = word_embeddings.weight
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return kernels.dense(self.transform(hidden), self.decoder.weight, self.bias)  # [..., H] -> [..., V]


class BertPreTrainingHeads(nn.Module):
    def __init__(self, config: BertConfig, word_embeddings: nn.Embedding):
        super().__init__()
        self.predictions = BertLMPredictionHead(config, word_embeddings)
        self.seq_relationship = nn.Linear(config.hidden_size, 2)


def pretraining_loss_normalizers(masked_lm_weights: torch.Tensor) -> dict[str, torch.Tensor]:
    """What the pre-training losses divide by: the sum of the masked-LM weights and the number of
    sequences ([B, P] weights). A training loop sums these over the micro-batches and processes of a
    global batch and passes them back as `loss_normalizers`, so the shares add up to its loss."""
    return {
        "masked_lm_weight": masked_lm_weights.float().sum(),
        "examples": torch.tensor(float(masked_lm_weights.shape[0]), device=masked_lm_weights.device),
    }


def pretraining_losses(
    mlm_logits: torch.Tensor,
    nsp_logits: torch.Tensor,
    masked_lm_ids: torch.Tensor,
    masked_lm_weights: torch.Tensor,
    next_sentence_labels: torch.Tensor,
    loss_normalizers: dict[str, torch.Tensor] | None = None,
) -> dict[str, torch.Tensor]:
    """The losses of `run_pretraining.py` (`get_masked_lm_output`, `get_next_sentence_output`), in fp32
    whatever the logits' dtype.

    masked_lm_loss = sum(w * -log p(label)) / (sum(w) + 1e-5) over every slot, padding slots (weight
    0) included; next_sentence_loss = mean over the batch; total_loss = their sum. With
    `loss_normalizers` (see `pretraining_loss_normalizers`), sum(w) and the batch size are those given.
    """
    V = mlm_logits.shape[-1]
    log_probs = F.log_softmax(mlm_logits.float().reshape(-1, V), dim=-1)  # [B, P, V] -> [B*P, V]
    example_loss = -log_probs.gather(1, masked_lm_ids.reshape(-1, 1).long()).squeeze(1)  # [B*P]
    weights = masked_lm_weights.reshape(-1).float()  # [B*P]
    norm = loss_normalizers or pretraining_loss_normalizers(masked_lm_weights)
    masked_lm_loss = (weights * example_loss).sum() / (norm["masked_lm_weight"] + 1e-5)
    nsp_example_loss = F.cross_entropy(nsp_logits.float(), next_sentence_labels.reshape(-1).long(), reduction="none")
    nsp_loss = nsp_example_loss.sum() / norm["examples"]
    return {
        "total_loss": masked_lm_loss + nsp_loss,
        "masked_lm_loss": masked_lm_loss,
        "next_sentence_loss": nsp_loss,
        "masked_lm_example_loss": example_loss,
        "next_sentence_example_loss": nsp_example_loss,
    }


class BertForPreTraining(BertPreTrainedModel):
    """BERT with the masked-LM and next-sentence heads of `run_pretraining.py`."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.config = config
        self.bert = BertModel(config, initialise=False)
        self.cls = BertPreTrainingHeads(config, self.bert.embeddings.word_embeddings)
        self.init_weights()

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        masked_lm_positions: torch.Tensor | None = None,
        masked_lm_ids: torch.Tensor | None = None,
        masked_lm_weights: torch.Tensor | None = None,
        next_sentence_labels: torch.Tensor | None = None,
        loss_normalizers: dict[str, torch.Tensor] | None = None,
    ) -> PreTrainingOutput:
        """Args as `BertModel`, plus the pre-training features of the original's records.

        Args:
            masked_lm_positions: [B, P]; when given, the MLM head runs only at these positions (as the
                original does), otherwise at every position.
            masked_lm_ids, masked_lm_weights: [B, P] labels and weights (0 marks a padding slot).
            next_sentence_labels: [B] (0 = is next, 1 = random).
            loss_normalizers: the global batch's (see `pretraining_losses`); default this batch's.
        The losses are computed when all labels are given.
        """
        if masked_lm_positions is None:
            out = self.bert(input_ids, attention_mask, token_type_ids)
            hidden = out.sequence_output
        else:
            # The last block runs at [CLS] (the pooler's) and the masked positions alone.
            positions = torch.cat([first_token(input_ids), masked_lm_positions.to(input_ids.dtype)], 1)  # [B, 1 + P]
            out = self.bert(input_ids, attention_mask, token_type_ids, output_positions=positions)
            hidden = out.sequence_output[:, 1:]  # [B, P, H]
        mlm_logits = self.cls.predictions(hidden)  # [B, P or T, V]
        nsp_logits = self.cls.seq_relationship(out.pooled_output)  # [B, 2]
        result = PreTrainingOutput(mlm_logits, nsp_logits, hidden=out)
        if masked_lm_ids is not None and next_sentence_labels is not None:
            if masked_lm_weights is None:
                masked_lm_weights = torch.ones_like(masked_lm_ids, dtype=torch.float32)
            for name, value in pretraining_losses(
                mlm_logits, nsp_logits, masked_lm_ids, masked_lm_weights, next_sentence_labels, loss_normalizers
            ).items():
                setattr(result, name, value)
        return result

    @staticmethod
    def loss_normalizers(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return pretraining_loss_normalizers(batch["masked_lm_weights"])


# --------------------------------------------------------------------------------- fine-tuning heads
# Labels of this value (non-first sub-tokens, padding) are not predicted: the torch convention.
IGNORE_INDEX = -100


def _task_output(
    logits: torch.Tensor,
    example_loss: torch.Tensor | None,
    example_count: torch.Tensor | None,
    loss_normalizers: dict[str, torch.Tensor] | None,
    hidden: EncoderOutput,
) -> TaskOutput:
    if example_loss is None or example_count is None:  # both or neither: a head given no labels
        return TaskOutput(logits, hidden=hidden)
    count = loss_normalizers["count"] if loss_normalizers is not None else example_count.sum()
    loss = example_loss.sum() / count.clamp(min=1.0)
    return TaskOutput(logits, loss, example_loss, example_count, hidden)


class FineTuningHead(BertPreTrainedModel):
    """What every fine-tuning head shares: one loss term per example unless a head says otherwise."""

    @staticmethod
    def loss_normalizers(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The number of loss terms of a batch, from its inputs and labels alone (before the forward
        pass): a training loop sums it over the global batch and passes it back as `loss_normalizers`."""
        ids = batch["input_ids"]
        return {"count": torch.tensor(float(ids.shape[0]), device=ids.device)}


def classification_loss(logits: torch.Tensor, labels: torch.Tensor, regression: bool = False) -> torch.Tensor:
    """Per example [B]: softmax cross-entropy of [B, L] logits (run_classifier.py, `create_model`), or the
    squared error of [B, 1] logits for regression."""
    if regression:
        return (logits.float().squeeze(-1) - labels.float()) ** 2
    return F.cross_entropy(logits.float(), labels.long(), reduction="none")


def multi_label_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Per example [B]: the sum over the labels of the sigmoid cross-entropy of [B, L] logits against [B, L]
    0/1 targets (one loss term per label; transformers' multi-label loss is their mean over B*L)."""
    return F.binary_cross_entropy_with_logits(logits.float(), labels.float(), reduction="none").sum(-1)


class BertForSequenceClassification(FineTuningHead):
    """Pooled output -> dropout -> linear, as `run_classifier.create_model`; num_labels=1 is regression.

    `problem_type="multi_label_classification"` (the argument, else the config's `problem_type`) makes
    every label a yes/no decision: sigmoid cross-entropy per label, labels [B, L] of 0/1, as transformers'
    BertForSequenceClassification with that problem type.
    """

    def __init__(self, config: BertConfig, num_labels: int = 2, problem_type: str | None = None):
        super().__init__()
        self.config = config
        self.num_labels = num_labels
        problem_type = problem_type or config.extra.get("problem_type")
        if problem_type is not None and problem_type not in PROBLEM_TYPES:
            raise ValueError(f"problem_type={problem_type!r} must be one of {', '.join(PROBLEM_TYPES)}")
        if problem_type != "multi_label_classification":
            problem_type = "regression" if num_labels == 1 else "single_label_classification"
        self.problem_type = problem_type
        self.bert = BertModel(config, initialise=False)
        dropout = config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob
        self.dropout = kernels.Dropout(dropout)
        self.classifier = nn.Linear(config.hidden_size, num_labels)
        self.init_weights()

    def forward(
        self, input_ids, attention_mask=None, token_type_ids=None, labels=None, loss_normalizers=None
    ) -> TaskOutput:
        """Returns logits [B, L] (L = num_labels; [B, 1] for regression). Loss: cross-entropy, MSE, or for
        multi-label the mean sigmoid cross-entropy over the B*L (example, label) pairs."""
        out = self.bert(input_ids, attention_mask, token_type_ids, output_positions=first_token(input_ids))
        logits = self.classifier(self.dropout(out.pooled_output))  # [B, L]
        example_loss = count = None
        if labels is not None:
            if self.problem_type == "multi_label_classification":
                example_loss = multi_label_loss(logits, labels)
                count = torch.full_like(example_loss, float(self.num_labels))
            else:
                example_loss = classification_loss(logits, labels, regression=self.problem_type == "regression")
                count = torch.ones_like(example_loss)
        return _task_output(logits, example_loss, count, loss_normalizers, out)

    @staticmethod
    def loss_normalizers(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        labels = batch.get("labels")
        if labels is not None and labels.dim() == 2:  # multi-label [B, L]: a loss term per label
            return {"count": torch.tensor(float(labels.numel()), device=labels.device)}
        return FineTuningHead.loss_normalizers(batch)


class BertForQuestionAnswering(FineTuningHead):
    """Start and end logits per token, as `run_squad.create_model` (`cls/squad` in TF)."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.config = config
        self.bert = BertModel(config, add_pooling_layer=False, initialise=False)
        self.qa_outputs = nn.Linear(config.hidden_size, 2)
        self.init_weights()

    def forward(
        self,
        input_ids,
        attention_mask=None,
        token_type_ids=None,
        start_positions=None,
        end_positions=None,
        loss_normalizers=None,
    ) -> TaskOutput:
        """Returns logits [B, T, 2] (start, end). Loss: mean of the start and end cross-entropies, whose
        softmax runs over the real tokens only (the original's also runs over the padding up to
        max_seq_length, which no prediction reads; masking it makes the loss independent of padding)."""
        out = self.bert(input_ids, attention_mask, token_type_ids)
        logits = self.qa_outputs(out.sequence_output)  # [B, T, 2]
        example_loss = count = None
        if start_positions is not None and end_positions is not None:
            scores = logits.float()
            if attention_mask is not None:
                scores = scores.masked_fill((attention_mask == 0)[..., None], float("-inf"))  # [B, T, 1] mask
            start_logits, end_logits = scores.unbind(-1)  # 2 x [B, T]
            example_loss = (
                F.cross_entropy(start_logits, start_positions.long(), reduction="none")
                + F.cross_entropy(end_logits, end_positions.long(), reduction="none")
            ) / 2  # [B]
            count = torch.ones_like(example_loss)
        return _task_output(logits, example_loss, count, loss_normalizers, out)


class BertForTokenClassification(FineTuningHead):
    """A label per token (NER); labels of -100 (non-first sub-tokens, padding) are ignored by the loss."""

    def __init__(self, config: BertConfig, num_labels: int = 2):
        super().__init__()
        self.config = config
        self.num_labels = num_labels
        self.bert = BertModel(config, add_pooling_layer=False, initialise=False)
        dropout = config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob
        self.dropout = kernels.Dropout(dropout)
        self.classifier = nn.Linear(config.hidden_size, num_labels)
        self.init_weights()

    def forward(
        self, input_ids, attention_mask=None, token_type_ids=None, labels=None, loss_normalizers=None
    ) -> TaskOutput:
        """Returns logits [B, T, L]. Loss: the mean cross-entropy over the labelled tokens."""
        out = self.bert(input_ids, attention_mask, token_type_ids)
        logits = self.classifier(self.dropout(out.sequence_output))  # [B, T, L]
        example_loss = count = None
        if labels is not None:
            B, T, L = logits.shape
            token_loss = F.cross_entropy(
                logits.float().reshape(B * T, L), labels.reshape(-1).long(), ignore_index=IGNORE_INDEX, reduction="none"
            ).view(B, T)  # [B*T] -> [B, T]
            example_loss = token_loss.sum(-1)
            count = (labels != IGNORE_INDEX).sum(-1).to(token_loss.dtype)
        return _task_output(logits, example_loss, count, loss_normalizers, out)

    @staticmethod
    def loss_normalizers(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {"count": (batch["labels"] != IGNORE_INDEX).sum().float()}


class BertForMultipleChoice(FineTuningHead):
    """One score per choice from its pooled output (SWAG); inputs are [B, C, T]."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.config = config
        self.bert = BertModel(config, initialise=False)
        dropout = config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob
        self.dropout = kernels.Dropout(dropout)
        self.classifier = nn.Linear(config.hidden_size, 1)
        self.init_weights()

    def forward(
        self, input_ids, attention_mask=None, token_type_ids=None, labels=None, loss_normalizers=None
    ) -> TaskOutput:
        """Returns logits [B, C]. Loss: cross-entropy of the softmax over the choices."""
        B, C, T = input_ids.shape

        def flat(x):
            return None if x is None else x.reshape(B * C, T)  # [B, C, T] -> [B*C, T]

        ids = flat(input_ids)
        out = self.bert(ids, flat(attention_mask), flat(token_type_ids), output_positions=first_token(ids))
        logits = self.classifier(self.dropout(out.pooled_output)).view(B, C)  # [B*C, 1] -> [B, C]
        example_loss = count = None
        if labels is not None:
            example_loss = classification_loss(logits, labels)
            count = torch.ones_like(example_loss)
        return _task_output(logits, example_loss, count, loss_normalizers, out)


MODEL_CLASSES: dict[str, type[BertPreTrainedModel]] = {
    cls.__name__: cls
    for cls in (
        BertModel,
        BertForPreTraining,
        BertForSequenceClassification,
        BertForQuestionAnswering,
        BertForTokenClassification,
        BertForMultipleChoice,
    )
}


SENTENCE_POOLINGS = ("mean", "cls", "max")


def pool_tokens(sequence_output: torch.Tensor, attention_mask: torch.Tensor, pooling: str) -> torch.Tensor:
    """One vector per sequence from the last layer [B, T, H] -> [B, H], as sentence-transformers' Pooling:
    "mean" over the real tokens ([CLS] and [SEP] included), "cls" (position 0) or "max" (element-wise over
    the real tokens). `bert embed` and `bert train-embeddings` both pool here."""
    if pooling == "cls":
        return sequence_output[:, 0]
    if pooling == "mean":
        m = attention_mask[:, :, None].to(sequence_output.dtype)  # [B, T, 1]
        return (sequence_output * m).sum(1) / m.sum(1).clamp(min=1e-9)
    if pooling == "max":
        return sequence_output.masked_fill(attention_mask[:, :, None] == 0, -1e9).max(1).values
    raise ValueError(f"pooling={pooling!r} must be one of {', '.join(SENTENCE_POOLINGS)}")


def num_parameters(model: nn.Module) -> int:
    """Distinct parameters (the tied MLM decoder counted once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
