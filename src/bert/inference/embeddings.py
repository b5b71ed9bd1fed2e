"""The `Predictor`'s embeddings: `embed` (pooled, normalized, Matryoshka-cut, long texts in windows),
`token_embeddings` and `similarity`, with sentence-transformers' prompts and pooling defaults."""

from __future__ import annotations

import collections
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, cast

import numpy as np
import torch
import torch.nn.functional as F

from bert.errors import InputError
from bert.inference.common import checked_windows, quiet_task_logs, require_texts
from bert.inference.core import PredictorCore, Prepared
from bert.input_lines import InputItemError
from bert.modeling import first_token, pool_tokens
from bert.request_rules import POOLINGS, check_dimensions, check_pooling
from bert.request_rules import truncation_direction as direction_of
from bert.tasks.classification import LONG_DOCUMENT
from bert.tasks.glue import InputExample
from bert.tasks.windows import convert_examples_to_windows, pool_windows
from bert.tokenization import SPECIAL_TOKENS

# What `_encode` runs on each batch: (last layer [B, T, H], pooling mask [B, T], attention mask [B, T],
# the encoder's output) -> a result per row.
EncodeFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, Any], list[Any]]


class EmbeddingMixin(PredictorCore):
    @property
    def default_pooling(self) -> str:
        """The sentence-transformers model's pooling, else mean pooling (see `embed`)."""
        st = self.sentence_transformers
        if st is None:
            return "mean"
        if st.pooling is None:
            raise InputError(
                f"{self.source}: the sentence-transformers configuration asks for {st.unsupported}, which this "
                f"project does not implement; choose a pooling ({', '.join(POOLINGS)}) explicitly"
            )
        return st.pooling

    @property
    def default_normalize(self) -> bool:
        return self.sentence_transformers.normalize if self.sentence_transformers is not None else False

    def embedding_sequences(
        self,
        texts: Sequence[str | Sequence[int]],
        *,
        truncate: bool = True,
        truncation_direction: str = "right",
        prompt: str | None = None,
    ) -> tuple[list[tuple[list[int], list[int]]], list[int]]:
        """The model inputs `embed` runs: ([(token ids, segment ids), ...], prompt lengths).

        A text becomes `[CLS] prompt+text [SEP]` (the prompt prepended to the text before tokenization, as
        sentence-transformers does); a list of token ids is the whole sequence as given (TEI's token-id
        inputs: no [CLS] or [SEP] added), or with a prompt `[CLS] prompt ids [SEP]` without the special
        tokens among the ids. Longer than
        `max_seq_length`: cut, keeping the start ("right") or the end ("left") of the text's tokens, or
        with `truncate=False` an `InputItemError` naming the input. A prompt length counts [CLS] and the
        prompt's tokens (sentence-transformers' `prompt_length`, the positions `include_prompt=False` leaves
        out of the pooling).
        """
        truncation_direction = direction_of(truncation_direction)
        parts, prompt_lengths = self.embedding_parts(texts, prompt)
        sequences, lengths = [], []
        for i, ((head, body, tail), prompt_length) in enumerate(zip(parts, prompt_lengths)):
            room = self.max_seq_length - len(head) - len(tail)
            if len(body) > room:
                if not truncate:
                    raise InputItemError(
                        i,
                        f"{len(head) + len(body) + len(tail)} tokens, more than max_seq_length="
                        f"{self.max_seq_length}; shorten it or let it be truncated",
                    )
                body = body[:room] if truncation_direction == "right" else body[len(body) - max(room, 0) :]
            ids = [*head, *body, *tail]
            sequences.append((ids, [0] * len(ids)))
            lengths.append(min(prompt_length, len(ids) - 1))
        return sequences, lengths

    def embedding_parts(
        self, texts: Sequence[str | Sequence[int]], prompt: str | None = None
    ) -> tuple[list[tuple[list[int], list[int], list[int]]], list[int]]:
        """Each input as (head, body, tail) ids, uncut (`embedding_sequences` cuts the body to
        `max_seq_length`; late chunking reads it whole, in windows), and its prompt length."""
        if isinstance(texts, str):
            raise TypeError("expected a list of texts, got one string")
        strings = {i: (prompt or "") + t for i, t in enumerate(texts) if isinstance(t, str)}
        encoded = dict(zip(strings, self.tokenizer.encode_batch(list(strings.values()))))
        prompt_ids = self.tokenizer.encode(prompt) if prompt else None
        parts, prompt_lengths = [], []
        for i, text in enumerate(texts):
            head, body, tail = self._sequence_parts(i, text, encoded, prompt_ids)
            parts.append((head, body, tail))
            if not isinstance(text, str):
                prompt_lengths.append(len(head))
            else:
                prompt_lengths.append(1 + len(prompt_ids) if prompt_ids is not None else 0)
        return parts, prompt_lengths

    def _sequence_parts(
        self, i: int, text: str | Sequence[int], encoded: dict[int, list[int]], prompt_ids: list[int] | None
    ) -> tuple[list[int], list[int], list[int]]:
        """Input `i` as (head, body, tail) ids, the body the part truncation cuts (see `embedding_sequences`):
        a text's pieces (`encoded[i]`, with the prompt) between [CLS] and [SEP], or a list of token ids (with
        the prompt's ids, None without a prompt)."""
        cls_id, sep_id = self._special_ids()
        if isinstance(text, str):
            if not text.strip():
                raise InputItemError(i, "empty text; give some text or leave the item out")
            return [cls_id], encoded[i], [sep_id]
        ids: list[int] = [t for t in text if type(t) is int] if isinstance(text, Sequence) else []
        if not isinstance(text, Sequence) or len(ids) != len(text):
            raise InputItemError(i, f"expected a text or a list of token ids, got {type(text).__name__}")
        if not ids:
            raise InputItemError(i, "an empty list of token ids; give at least one")
        vocab_size = self.config.vocab_size
        bad = next((t for t in ids if not 0 <= t < vocab_size), None)
        if bad is not None:
            raise InputItemError(i, f"token id {bad} is outside the vocabulary (0 to {vocab_size - 1})")
        if prompt_ids is None:
            return [], ids, []
        # As TEI, which decodes the ids without their special tokens and encodes the prompt and that text:
        # [CLS] prompt ids [SEP].
        special = {self.tokenizer.vocab.get(t) for t in SPECIAL_TOKENS}
        return [cls_id, *prompt_ids], [t for t in ids if t not in special], [sep_id]

    def prepare_embeddings(
        self,
        texts: Sequence[str | Sequence[int]],
        *,
        truncate: bool = True,
        truncation_direction: str = "right",
        prompt_name: str | None = None,
        prompt: str | None = None,
        doc_stride: int | None = None,
    ) -> Prepared:
        """`texts` tokenized once for `run_embed` or `run_token_embeddings` (the options as `embed` takes them):
        `embedding_sequences`, or with `doc_stride` the windows of each text as classification cuts them
        (`bert.tasks.windows.convert_examples_to_windows`), each window's feature saying the text it is of."""
        prompt = self.resolve_prompt(prompt_name, prompt)
        with self._lock:
            if doc_stride is None:
                sequences, prompt_lengths = self.embedding_sequences(
                    texts, truncate=truncate, truncation_direction=truncation_direction, prompt=prompt
                )
                return Prepared(sequences, len(sequences), prompt_lengths)
            if prompt:
                raise InputError("a prompt and windows do not go together: the prompt would be in one window only")
            require_texts(texts)  # strings only: token-id inputs have no text to cut into windows
            examples = [InputExample(str(i), text, None, 0.0) for i, text in enumerate(cast(list[str], texts))]
            with quiet_task_logs():
                windows = convert_examples_to_windows(
                    examples, [None], self.max_seq_length, self.tokenizer, doc_stride, pad=False
                )
            sequences = [(f.input_ids, f.segment_ids) for f in windows]
            return Prepared(sequences, len(texts), [0] * len(sequences), windows)

    def _encode(
        self, prepared: Prepared, fn: EncodeFn, batch_size: int | None, first_token_only: bool = False
    ) -> list[Any]:
        """`fn(last layer [B, T, H], pooling mask [B, T], attention mask [B, T], encoder output)` over the
        prepared sequences; the pooling mask is the attention mask without the prompt when the model's
        Pooling says `include_prompt: false`. `first_token_only`: `fn` reads the first token alone, so the
        torch backend runs the last block for it alone (`BertModel.forward`'s `output_positions`): the last layer
        is then [B, 1, H]."""
        first_token_only = first_token_only and self.backend == "torch"
        st = self.sentence_transformers
        exclude_prompt = st is not None and not st.include_prompt
        skip = torch.tensor(prepared.prompt_lengths if exclude_prompt else [0] * len(prepared.sequences))

        def run(ids, mask, types, idx):
            # An ONNX graph takes the three inputs alone.
            out = (
                self.encoder(ids, mask, types, output_positions=first_token(ids))
                if first_token_only
                else self.encoder(ids, mask, types)
            )
            hidden = out.sequence_output.float()  # [B, T, H]
            positions = torch.arange(ids.shape[1], device=ids.device)[None, :]  # [1, T]
            pool_mask = mask * (positions >= skip[idx].to(ids.device)[:, None])  # [B, T]
            return fn(hidden, pool_mask, mask, out)

        with self._lock:
            return self._run(prepared.sequences, run, batch_size)

    def embed(
        self,
        texts: Sequence[str | Sequence[int]],
        pooling: str | None = None,
        normalize: bool | None = None,
        batch_size: int | None = None,
        *,
        truncate: bool = True,
        truncation_direction: str = "right",
        prompt_name: str | None = None,
        prompt: str | None = None,
        dimensions: int | None = None,
        long_document: str = "truncate",
        doc_stride: int | None = None,
    ) -> np.ndarray:
        """One float32 vector per text, [len(texts), dimensions or hidden_size].

        Each text is `[CLS] text [SEP]`, cut to `max_seq_length` tokens (as sentence-transformers does);
        see `embedding_sequences` for token-id inputs, prompts and truncation.

        Args:
            texts: texts, or lists of token ids (TEI's and OpenAI's token-id inputs).
            pooling: "cls" (the last layer at [CLS]), "mean" (the mean of the last layer over the real
                tokens, [CLS] and [SEP] included, as sentence-transformers), "max" (their element-wise
                maximum) or "pooler" (the pre-training pooler: tanh(dense([CLS]))). Default: the
                sentence-transformers configuration beside the model, else "mean" (better than [CLS] for
                similarity without fine-tuning, Reimers & Gurevych 2019).
            normalize: scale each vector to unit length (default: as the sentence-transformers
                configuration says, else False).
            truncate: False raises `InputItemError` for an input longer than `max_seq_length`.
            truncation_direction: "right" keeps the start of a long input, "left" its end.
            prompt_name, prompt: the prompt to prepend (`resolve_prompt`); its tokens are pooled unless the
                model's Pooling configuration says `include_prompt: false`, as in sentence-transformers.
            dimensions: keep the first `dimensions` components (Matryoshka truncation), then normalize
                (when normalizing), as sentence-transformers' `truncate_dim` and TEI's `dimensions`.
            long_document: "truncate" (above), or "windows": a text longer than `max_seq_length` is read
                whole in windows `doc_stride` pieces apart, cut as classification cuts them
                (`bert.tasks.windows.window_spans`); each window's vector is what `embed` gives for it alone,
                the text's vector their mean (`bert.tasks.windows.pool_windows`), normalized again when
                normalizing. A text that fits one window gets its "truncate" vector.
            doc_stride: pieces between window starts (default: the config's `doc_stride`, else 128).
        """
        pooling, normalize, doc_stride = self._embed_options(pooling, normalize, dimensions, long_document, doc_stride)
        prepared = self.prepare_embeddings(
            texts,
            truncate=truncate,
            truncation_direction=truncation_direction,
            prompt_name=prompt_name,
            prompt=prompt,
            doc_stride=doc_stride,
        )
        return self.run_embed(prepared, pooling, normalize, batch_size, dimensions=dimensions)

    def run_embed(
        self,
        prepared: Prepared,
        pooling: str | None = None,
        normalize: bool | None = None,
        batch_size: int | None = None,
        *,
        dimensions: int | None = None,
    ) -> np.ndarray:
        """`embed`'s vectors of inputs `prepare_embeddings` prepared: [lead + inputs, dimensions or hidden_size],
        the lead sequence's first where there is one (`prepare_similarity`)."""
        pooling, normalize = self._pooling_options(pooling, normalize, dimensions)
        pooler = _pooler(pooling, normalize, dimensions)
        vectors = self._encode(prepared, pooler, batch_size, first_token_only=pooling in ("cls", "pooler"))
        if not vectors:
            return np.zeros((0, dimensions or self.config.hidden_size), dtype=np.float32)
        out = np.stack(vectors).astype(np.float32, copy=False)  # [N or windows, D]
        if prepared.windows is not None:
            out = pool_windows(list(out), prepared.windows, prepared.inputs, "mean")  # [N, D]
            if normalize:
                out = F.normalize(torch.from_numpy(out), p=2, dim=1).numpy()
        return out

    def _embed_options(
        self,
        pooling: str | None,
        normalize: bool | None,
        dimensions: int | None,
        long_document: str,
        doc_stride: int | None,
    ) -> tuple[str, bool, int | None]:
        """`embed`'s pooling and normalisation (defaults filled in) and window stride (None: no windows),
        each checked."""
        if long_document not in LONG_DOCUMENT:
            raise InputError(f"long_document={long_document!r} must be one of {', '.join(LONG_DOCUMENT)}")
        if long_document == "windows":
            doc_stride = checked_windows({"doc_stride": doc_stride}, "embed").get("doc_stride", self.doc_stride)
        else:
            doc_stride = None
        return (*self._pooling_options(pooling, normalize, dimensions), doc_stride)

    def _pooling_options(self, pooling: str | None, normalize: bool | None, dimensions: int | None) -> tuple[str, bool]:
        """The pooling and normalisation of embeddings (defaults filled in), each checked, with `dimensions`."""
        pooling = pooling or self.default_pooling
        normalize = self.default_normalize if normalize is None else normalize
        check_pooling(pooling)
        if pooling == "pooler" and not self.has_pooler:
            raise InputError(f"{self.source} has no pooler weights; use pooling cls, mean or max")
        check_dimensions(dimensions, self.config.hidden_size)
        return pooling, normalize

    def token_embeddings(
        self,
        texts: Sequence[str | Sequence[int]],
        batch_size: int | None = None,
        *,
        truncate: bool = True,
        truncation_direction: str = "right",
        prompt_name: str | None = None,
        prompt: str | None = None,
    ) -> list[np.ndarray]:
        """The last layer at every token of each text, [CLS] and [SEP] included: float32 [tokens, hidden_size]
        per text (TEI's /embed_all); inputs as `embed` takes them."""
        prepared = self.prepare_embeddings(
            texts, truncate=truncate, truncation_direction=truncation_direction, prompt_name=prompt_name, prompt=prompt
        )
        return self.run_token_embeddings(prepared, batch_size)

    def run_token_embeddings(self, prepared: Prepared, batch_size: int | None = None) -> list[np.ndarray]:
        """`token_embeddings` of inputs `prepare_embeddings` prepared."""

        def rows(hidden, pool_mask, attention_mask, out):
            return [h[: int(n)].cpu().numpy() for h, n in zip(hidden, attention_mask.sum(1))]

        return self._encode(prepared, rows, batch_size)

    def similarity(
        self,
        source: str,
        sentences: Sequence[str],
        *,
        truncate: bool = True,
        truncation_direction: str = "right",
        prompt_name: str | None = None,
        pooling: str | None = None,
        batch_size: int | None = None,
    ) -> list[float]:
        """The cosine similarity of `source`'s embedding with each sentence's (TEI's /similarity; `rank` of an
        embedding model); the embeddings as `embed` makes them."""
        self._pooling_options(pooling, True, None)  # checked before the texts, as `embed` checks its options
        prepared = self.prepare_similarity(
            source, sentences, truncate=truncate, truncation_direction=truncation_direction, prompt_name=prompt_name
        )
        return self.run_similarity(prepared, pooling, batch_size)

    def prepare_similarity(
        self,
        source: str,
        sentences: Sequence[str],
        *,
        truncate: bool = True,
        truncation_direction: str = "right",
        prompt_name: str | None = None,
    ) -> Prepared:
        """`source` and `sentences` tokenized once for `run_similarity` (input 0 is the source: an error names
        sentence i as input i + 1), the source the lead sequence."""
        prepared = self.prepare_embeddings(
            [source, *sentences], truncate=truncate, truncation_direction=truncation_direction, prompt_name=prompt_name
        )
        return replace(prepared, inputs=prepared.inputs - 1, lead=1)

    def run_similarity(
        self, prepared: Prepared, pooling: str | None = None, batch_size: int | None = None
    ) -> list[float]:
        """`similarity` of a source and sentences `prepare_similarity` prepared: one score per sentence."""
        if prepared.lead != 1:
            raise ValueError("run_similarity runs what prepare_similarity prepares")
        vectors = self.run_embed(prepared, pooling, True, batch_size)
        return [float(s) for s in vectors[1:] @ vectors[0]]


# The unit vectors a `UnitVectorCache` keeps by default (texts recur: `bert search`'s candidates across queries in
# `bert rerank`, a distillation teacher's documents across groups); the least recently used go past it.
VECTOR_CACHE_BYTES = 256 * 2**20


class UnitVectorCache:
    """An embedding model's unit vectors (`embed`'s, normalized, the default pooling) kept by token ids across
    calls, so a text that recurs runs once; at most `max_bytes` of vectors, the least recently used dropped."""

    def __init__(self, predictor: EmbeddingMixin, max_bytes: int = VECTOR_CACHE_BYTES) -> None:
        self.predictor = predictor
        self.vectors: collections.OrderedDict[tuple[int, ...], np.ndarray] = collections.OrderedDict()
        self.limit = max(1, max_bytes // (4 * predictor.config.hidden_size))

    def __call__(self, prepared: Sequence[Prepared]) -> list[list[np.ndarray]]:
        """The unit vector of each sequence of each `prepare_embeddings` or `prepare_similarity` result (one
        sequence an input: no windows), the sequences not kept computed together in one `run_embed`."""
        if any(p.windows is not None for p in prepared):
            raise ValueError("a vector cache keeps one vector an input; windows are pooled per input")
        keys = [[tuple(ids) for ids, _ in p.sequences] for p in prepared]
        missing: dict[tuple[int, ...], tuple[tuple[list[int], list[int]], int]] = {}
        for p, sequence_keys in zip(prepared, keys):
            for key, sequence, prompt_length in zip(sequence_keys, p.sequences, p.prompt_lengths):
                if key not in self.vectors and key not in missing:
                    missing[key] = (sequence, prompt_length)
        if missing:
            new = Prepared([s for s, _ in missing.values()], len(missing), [n for _, n in missing.values()])
            self.vectors.update(zip(missing, self.predictor.run_embed(new, normalize=True)))
        out = [[self.vectors[key] for key in sequence_keys] for sequence_keys in keys]
        for sequence_keys in keys:
            for key in sequence_keys:
                self.vectors.move_to_end(key)
        while len(self.vectors) > self.limit:
            self.vectors.popitem(last=False)
        return out


def _pooler(pooling: str, normalize: bool, dimensions: int | None) -> EncodeFn:
    """`embed`'s vectors from a batch's encoder outputs: pooled, cut to `dimensions`, normalized."""

    def pool(hidden: torch.Tensor, mask: torch.Tensor, attention_mask: torch.Tensor, out: Any) -> list[np.ndarray]:
        # mask: the tokens pooled (without the prompt's when the model's pooling excludes it)
        vectors = out.pooled_output.float() if pooling == "pooler" else pool_tokens(hidden, mask, pooling)
        vectors = vectors[:, :dimensions]
        if normalize:
            vectors = F.normalize(vectors, p=2, dim=1)
        return list(vectors.cpu().numpy())

    return pool


def cosine_similarity(vectors: np.ndarray) -> np.ndarray:
    """The [N, N] cosine similarity matrix of N vectors."""
    v = torch.from_numpy(np.asarray(vectors, dtype=np.float32))
    v = F.normalize(v, p=2, dim=1)
    return (v @ v.T).numpy()
