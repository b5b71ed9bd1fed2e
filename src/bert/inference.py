"""Models on raw text: load a model once, then classify, tag, answer, choose, embed or fill masks, batch
after batch.

    predictor = Predictor.from_pretrained("out/mrpc/model")
    predictor.classify([("He said so.", "He did say that.")], top_k=2)

`Predictor.from_pretrained` reads a model in any format `bert.checkpoint.read_checkpoint` reads: the
native (= transformers) layout, a directory with `config.json`, `model.safetensors` or
`pytorch_model.bin`, `vocab.txt` and `tokenizer_config.json`, or an original TF checkpoint with
`bert_config.json` and `vocab.txt` beside it. The head is the one `config.json`'s `architectures[0]`
names; without it (TF checkpoints), the one the weights hold. Inputs are tokenized with the model's
own settings (`tokenizer_config.json`: `do_lower_case`, `tokenize_chinese_chars`, `strip_accents`).

What each head offers (every model also offers `embed`, `token_embeddings`, `similarity`, `tokenize` with
character offsets and `decode`; `rank` scores by a cross-encoder, else by cosine similarity):
- BertForSequenceClassification: `classify` (single-label, multi-label or regression); with one label, a
  cross-encoder's `rank`;
- BertForTokenClassification: `ner` (entity spans) and `tag_words` (a tag per word);
- BertForQuestionAnswering: `answer`;
- BertForMultipleChoice: `choose`;
- BertForPreTraining / BertForMaskedLM: `fill_mask`;
- BertModel: `embed`.

Features and post-processing are the fine-tuning tasks' own, so answers equal the task commands':
`bert.tasks.glue` (classification: truncated as run_classifier.py does, or read in windows whose logits
are pooled, as the model was fine-tuned),
`bert.tasks.ner.convert_ner_examples_to_features` and `word_predictions` (a word's tag is its first
piece's), `bert.tasks.squad` (doc-stride windows, run_squad.py's `write_predictions` n-best rules over
all windows), `bert.tasks.swag`. Each call sorts its sequences by length, runs them in batches padded
only to the batch's longest (the model skips padding itself when a batch has much of it), and returns
the results in input order, under `torch.inference_mode()` with the model in eval mode.

Config keys read from `config.json` (the fine-tuning commands write them; transformers' names where it
has them), each with a fallback: `problem_type` ("single_label_classification", "regression" or
"multi_label_classification"; default regression for one output, else single-label), `id2label`
(default LABEL_0, LABEL_1, ...), `label_thresholds` ({label: threshold} for multi-label, default 0.5),
`max_seq_length` (the fine-tuning length; default 384 for question answering, 128 for the other heads,
the position table's size for embeddings and fill-mask; never above `max_position_embeddings`), for
classification `long_document` ("truncate"), `doc_stride` (128) and `window_pooling` ("mean") (`bert
classify --long_document=windows` saves them; `Predictor.set_windows` overrides them), and for question
answering `doc_stride` (128), `max_query_length` (64, or half of `max_seq_length` when that is
shorter than 128), `n_best_size` (20), `max_answer_length` (30), `version_2_with_negative` (false) and
`null_score_diff_threshold` (0.0). A sentence-transformers
model directory (`modules.json`, `1_Pooling/config.json`, `sentence_bert_config.json`) sets `embed`'s
default pooling, normalisation and length, so it gives what sentence-transformers gives.

Character offsets (`start`, `end`) are Python string indices (code points) into the input, `end`
exclusive. A `Predictor` is safe to share between threads: calls run one at a time (a lock), since the
model and the tokenizer's memo are shared.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
import torch.nn.functional as F

from bert import onnx_backend
from bert.checkpoint import CONFIG_NAME, Checkpoint
from bert.checkpoint import architecture as checkpoint_architecture
from bert.config import BertConfig, check_setting, check_task_settings
from bert.cpu_kernels import bf16_in_hardware
from bert.distributed import resolve_device
from bert.errors import InputError
from bert.flags import POOLINGS, check_backend, check_dtype
from bert.input_lines import InputItemError
from bert.loading import (
    ARCHITECTURES,
    FINE_TUNING_COMMANDS,
    build_model,
    has_mlm_head,
    has_pooler,
    read_model_checkpoint,
)
from bert.metrics import iob_chunks
from bert.modeling import (
    BertModel,
    BertPreTrainedModel,
    pool_tokens,
)
from bert.quantization import is_quantized, quantize_model
from bert.tasks.classification import LONG_DOCUMENT
from bert.tasks.common import (
    CLASSIFICATION,
    EMBEDDINGS,
    FILL_MASK,
    MULTIPLE_CHOICE,
    NER,
    QUESTION_ANSWERING,
    pad_2d,
    sigmoid,
    softmax,
    truncate_seq_pair,
)
from bert.tasks.glue import InputExample, InputFeatures, convert_examples_to_features
from bert.tasks.ner import NerExample, convert_ner_examples_to_features, word_predictions
from bert.tasks.squad import RawResult, compute_predictions, squad_examples_from_json
from bert.tasks.squad import convert_examples_to_features as squad_features
from bert.tasks.swag import SwagExample, convert_swag_examples_to_features
from bert.tasks.windows import WINDOW_POOLINGS, convert_examples_to_windows, pool_windows
from bert.tokenization import SPECIAL_TOKENS, FullTokenizer, load_vocab
from bert.utils import load_json_file

logger = logging.getLogger(__name__)

# The task of each architecture `bert.loading.ARCHITECTURES` builds (the same names).
TASKS = {
    "BertForSequenceClassification": CLASSIFICATION,
    "BertForTokenClassification": NER,
    "BertForQuestionAnswering": QUESTION_ANSWERING,
    "BertForMultipleChoice": MULTIPLE_CHOICE,
    "BertForPreTraining": FILL_MASK,
    "BertForMaskedLM": FILL_MASK,
    "BertModel": EMBEDDINGS,
}
# What to do with a model that lacks a head a method needs.
_HEAD_ADVICE = {
    **{TASKS[name]: f"fine-tune it with `{command}`" for name, command in FINE_TUNING_COMMANDS.items()},
    FILL_MASK: "use a pre-trained BertForPreTraining or BertForMaskedLM model",
}
TRUNCATION_DIRECTIONS = ("right", "left")
# What a warning of inputs cut to max_seq_length suggests, unless its caller has no windows to offer.
WINDOWS_ADVICE = "windows read long texts whole"
LONGER_ADVICE = "a longer --max_seq_length (up to the model's max_position_embeddings) reads more of each"
MASK_TOKEN = "[MASK]"
# The task modules log their first examples field by field, which would repeat on every call here.
_TASK_LOGGERS = ("bert.tasks.glue", "bert.tasks.windows", "bert.tasks.ner", "bert.tasks.squad", "bert.tasks.swag")


@dataclass
class SentenceTransformersConfig:
    """What a sentence-transformers model directory says about its embeddings."""

    pooling: str | None  # None: a pooling (or module) this project does not implement
    normalize: bool
    max_seq_length: int | None
    unsupported: str | None = None  # why `pooling` is None
    # `config_sentence_transformers.json`: prompt texts by name, and the one used when a call names none.
    prompts: dict[str, str] = field(default_factory=dict)
    default_prompt_name: str | None = None
    include_prompt: bool = True  # the Pooling module's: whether the prompt's tokens are pooled


def read_sentence_transformers_config(model_dir: str | os.PathLike) -> SentenceTransformersConfig | None:
    """`modules.json`, its Pooling module's `config.json` and `sentence_bert_config.json`, or None."""
    base = Path(model_dir)
    modules_file = base / "modules.json"
    if not modules_file.is_file():
        return None
    modules = load_json_file(modules_file, "sentence-transformers file")
    if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
        raise InputError(f"{modules_file}: expected a list of modules; fix or delete it")
    pooling, normalize, unsupported, include_prompt = None, False, None, True
    for m in modules:
        kind = str(m.get("type", "")).rsplit(".", 1)[-1]
        if kind == "Transformer":
            continue
        if kind == "Normalize":
            normalize = True
        elif kind == "Pooling":
            config = _json_object(base / str(m.get("path", "")) / "config.json", "Pooling module file")
            modes = sorted(k[len("pooling_mode_") :] for k, v in config.items() if k.startswith("pooling_mode_") and v)
            pooling = {"cls_token": "cls", "mean_tokens": "mean", "max_tokens": "max"}.get(modes[0]) if modes else None
            if len(modes) != 1 or pooling is None:
                unsupported = f"pooling modes {modes}"
            include_prompt = config.get("include_prompt", True) is not False
        else:
            unsupported = f"a {kind} module"
    if unsupported:
        pooling = None
    settings = base / "sentence_bert_config.json"
    st_settings = _json_object(settings, "sentence-transformers file", missing_ok=True)
    check_setting(st_settings, "max_seq_length", int, settings, null=True)
    max_seq_length = st_settings.get("max_seq_length")
    prompts_file = base / "config_sentence_transformers.json"
    described = _json_object(prompts_file, "sentence-transformers file", missing_ok=True)
    prompts = described.get("prompts") or {}
    if not isinstance(prompts, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in prompts.items()):
        raise InputError(f'{prompts_file}: "prompts" must map prompt names to texts; fix or delete it')
    default_prompt_name = described.get("default_prompt_name")
    if default_prompt_name is not None and default_prompt_name not in prompts:
        raise InputError(
            f'{prompts_file}: "default_prompt_name" {default_prompt_name!r} is not one of the prompts '
            f"({', '.join(prompts) or 'none'}); fix or delete it"
        )
    return SentenceTransformersConfig(
        pooling, normalize, max_seq_length, unsupported, prompts, default_prompt_name, include_prompt
    )


def _json_object(path: Path, what: str, missing_ok: bool = False) -> dict:
    """A sentence-transformers settings file, which must hold one JSON object ({} when missing and
    `missing_ok`): a list or a number there would fail later with a bare AttributeError."""
    settings = load_json_file(path, what, missing_ok=missing_ok)
    if settings is None:
        return {}
    if not isinstance(settings, dict):
        raise InputError(f"{path}: expected a JSON object of settings; fix or delete it")
    return settings


def _set_dtype(model: torch.nn.Module, dtype: str, device: torch.device) -> None:
    """Apply a `dtype` (`bert.flags.INFERENCE_DTYPES`, checked) to a loaded model about to run on `device`."""
    check_dtype(dtype, device=device)
    if dtype == "float32":
        return
    if dtype == "bfloat16" and device.type == "cpu" and not bf16_in_hardware():
        logger.warning(
            "this CPU has no bfloat16 instructions (AVX512-BF16 or AMX): bfloat16 runs emulated, slower than "
            "float32; leave dtype at float32 here"
        )
    assert isinstance(model, BertPreTrainedModel)  # every architecture this module loads
    model.set_encoder_dtype(getattr(torch, dtype))


def _labels(config: BertConfig, num_labels: int) -> list[str]:
    id2label = config.extra.get("id2label")
    if isinstance(id2label, dict) and len(id2label) == num_labels:
        with contextlib.suppress(KeyError):
            return [str(id2label[str(i)]) for i in range(num_labels)]
    return [f"LABEL_{i}" for i in range(num_labels)]


@contextlib.contextmanager
def _quiet_task_logs() -> Iterator[None]:
    loggers = [logging.getLogger(name) for name in _TASK_LOGGERS]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.WARNING)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


WINDOW_SETTINGS = ("long_document", "doc_stride", "window_pooling")


def _checked_windows(values: dict[str, Any], source: str) -> dict[str, Any]:
    """The window settings among `values` that are not None, each checked (`InputError` naming `source`)."""
    out = {name: value for name, value in values.items() if value is not None}
    check_setting(out, "doc_stride", int, source)  # a positive integer, as in config.json
    for name, value in out.items():
        if name == "long_document" and value not in LONG_DOCUMENT:
            raise InputError(f"{source}: long_document={value!r} must be one of {', '.join(LONG_DOCUMENT)}")
        if name == "window_pooling" and value not in WINDOW_POOLINGS:
            raise InputError(f"{source}: window_pooling={value!r} must be one of {', '.join(WINDOW_POOLINGS)}")
    return out


def _require_texts(texts: Sequence[Any], what: str = "text") -> None:
    if isinstance(texts, str):
        raise TypeError(f"expected a list of {what}s, got one string")
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise InputItemError(i, f"{what} must be a string, got {type(t).__name__}")
        if not t.strip():
            raise InputItemError(i, f"empty {what}; give some text or leave the item out")


def _top(scores: np.ndarray, labels: Sequence[str], k: int | None) -> list[dict[str, Any]]:
    order = np.argsort(-scores, kind="stable")[: k or None]
    return [{"label": labels[i], "score": float(scores[i])} for i in order]


class Predictor:
    """A model with its tokenizer and settings, ready for raw text. Build it with `from_pretrained`.

    Attributes:
        model: the `bert.modeling` model, in eval mode on `device` (or a `bert.onnx_backend.OnnxModel`).
        architecture: its class name as `config.json` names it (e.g. "BertForMaskedLM").
        task: the head's task: "classification", "ner", "question-answering", "multiple-choice",
            "fill-mask" or "embeddings".
        tokenizer: a `FullTokenizer` with the model's settings.
        max_seq_length: the longest sequence, in WordPiece tokens with [CLS] and [SEP].
        labels: the label list of a classification or NER head (else None).
        problem_type: classification only, see the module docstring.
        batch_size: sequences per forward pass when a call does not say.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: FullTokenizer,
        architecture: str,
        device: torch.device,
        *,
        max_seq_length: int | None = None,
        batch_size: int = 32,
        has_mlm_head: bool = False,
        has_pooler: bool = True,
        sentence_transformers: SentenceTransformersConfig | None = None,
        source: str = "model",
    ):
        if batch_size < 1:
            raise InputError(f"batch_size={batch_size} must be at least 1")
        self.model = model.to(device).eval()
        self.tokenizer = tokenizer
        self.architecture = architecture
        self.task = TASKS[architecture]
        self.device = device
        self.batch_size = batch_size
        self.source = source
        self.config: BertConfig = model.config
        self.encoder: BertModel = model if isinstance(model, BertModel) else model.bert
        self.has_mlm_head = has_mlm_head
        self.has_pooler = has_pooler and self.encoder.pooler is not None
        self.sentence_transformers = sentence_transformers
        extra = self.config.extra
        config_file = Path(source) / CONFIG_NAME
        # Checked when config.json was read; again for a model whose config was built in Python.
        check_task_settings(extra, f"{config_file}: config")
        self.labels: list[str] | None = None
        self.problem_type: str | None = None
        self.label_thresholds: dict[str, float] = {}
        if self.task in (CLASSIFICATION, NER):
            self.labels = _labels(self.config, model.num_labels)
        if self.task == CLASSIFICATION:
            default = "regression" if model.num_labels == 1 else "single_label_classification"
            self.problem_type = extra.get("problem_type") or default
            thresholds = extra.get("label_thresholds") or {}
            self.label_thresholds = {label: float(thresholds.get(label, 0.5)) for label in self.labels}
        # How the model was fine-tuned to read long inputs (`bert classify`'s defaults where config.json
        # says nothing, as for models trained elsewhere); `set_windows` overrides them.
        saved = _checked_windows({name: extra.get(name) for name in WINDOW_SETTINGS}, str(config_file))
        self.long_document: str = saved.get("long_document", LONG_DOCUMENT[0])
        self.doc_stride: int = saved.get("doc_stride", 128)
        self.window_pooling: str = saved.get("window_pooling", WINDOW_POOLINGS[0])
        self.n_best_size = int(extra.get("n_best_size", 20))
        self.max_answer_length = int(extra.get("max_answer_length", 30))
        self.version_2_with_negative = bool(extra.get("version_2_with_negative", False))
        self.null_score_diff_threshold = float(extra.get("null_score_diff_threshold", 0.0))
        limit = self.config.max_position_embeddings
        if max_seq_length is None:
            max_seq_length = extra.get("max_seq_length")
        if max_seq_length is None and self.task == EMBEDDINGS and sentence_transformers is not None:
            max_seq_length = sentence_transformers.max_seq_length
        if max_seq_length is None:
            max_seq_length = {QUESTION_ANSWERING: 384, FILL_MASK: limit, EMBEDDINGS: limit}.get(self.task, 128)
            max_seq_length = min(max_seq_length, limit)
        self.max_seq_length = int(max_seq_length)
        self.config.check_max_seq_length(self.max_seq_length)
        # run_squad.py's default, or half the sequence for models too short for it.
        self.max_query_length = int(extra.get("max_query_length", min(64, self.max_seq_length // 2)))
        if self.task == QUESTION_ANSWERING and self.max_seq_length <= self.max_query_length + 3:
            raise InputError(
                f"max_seq_length={self.max_seq_length} leaves no room for the context after a question of "
                f"max_query_length={self.max_query_length}; raise max_seq_length"
            )
        self._special = {t: self.tokenizer.vocab.get(t) for t in ("[CLS]", "[SEP]", MASK_TOKEN)}
        for token in ("[CLS]", "[SEP]"):
            if self._special[token] is None:
                raise InputError(f"{source}: the vocabulary has no {token} token; use the model's own vocab.txt")
        # The prompt of calls that name none (`resolve_prompt`); `bert serve --default_prompt_name` sets it.
        self.default_prompt_name = sentence_transformers.default_prompt_name if sentence_transformers else None
        self._lock = threading.Lock()
        self._cut: list[int] | None = None  # [inputs cut, inputs read] inside `counting_truncations`
        self._cut_advice = WINDOWS_ADVICE

    @property
    def backend(self) -> str:
        """The engine that runs the model, one of `bert.flags.BACKENDS` (see `from_pretrained`)."""
        return "onnx" if isinstance(self.model, onnx_backend.OnnxModel) else "torch"

    @property
    def dtype(self) -> str:
        """The number type the Transformer blocks run in (`from_pretrained`'s dtype, or int8 once quantized); an
        ONNX graph's is float32."""
        if self.backend == "onnx":
            return "float32"
        if is_quantized(self.model):
            return "int8"
        if self.encoder.encoder_dtype is None:
            return "float32"
        return str(self.encoder.encoder_dtype).removeprefix("torch.")

    @property
    def can_embed(self) -> bool:
        """Whether `embed` runs: a torch model embeds with its encoder; an ONNX graph has the outputs of the model
        it was exported from, so only an encoder's (BertModel) graph embeds."""
        return self.backend == "torch" or self.architecture == "BertModel"

    # ------------------------------------------------------------------------------------------ loading
    @classmethod
    def from_pretrained(
        cls,
        model_dir: str | os.PathLike,
        device: str | torch.device | None = None,
        *,
        max_seq_length: int | None = None,
        batch_size: int = 32,
        do_lower_case: bool | None = None,
        quantize: str = "none",
        dtype: str = "float32",
        backend: str = "torch",
    ) -> Predictor:
        """Load a model directory (or a checkpoint file or TF prefix) for inference.

        Args:
            model_dir: see the module docstring.
            device: a torch device; default CUDA when available, else CPU.
            max_seq_length: override the config's `max_seq_length` (see the module docstring).
            batch_size: sequences per forward pass when a call does not say.
            do_lower_case: override `tokenizer_config.json` (needed only for models without one, e.g. a
                cased TF checkpoint; the default then is lower-casing).
            quantize: "none", or "int8" for `bert.quantization.quantize_int8` (CPU only; the default device
                then is the CPU).
            dtype: "float32", or "bfloat16" / "float16" to run the Transformer blocks in that type
                (`BertPreTrainedModel.set_encoder_dtype`; float16 on CUDA only); outputs stay float32.
            backend: "torch", or "onnx" to run the ONNX file `bert export` wrote (`model_dir` is its
                directory or the file) with ONNX Runtime on the CPU, `bert.onnx_backend`.
        """
        check_backend(backend, device, quantize)
        check_dtype(dtype, backend, quantize)
        if backend == "onnx":
            model, ckpt = onnx_backend.load(model_dir, torch.get_num_threads())
            return cls._with_tokenizer(
                model,
                ckpt,
                model.architecture,
                torch.device("cpu"),
                model.pooler is not None,
                model.has_mlm_head,
                model_dir,
                max_seq_length=max_seq_length,
                batch_size=batch_size,
                do_lower_case=do_lower_case,
            )
        ckpt = read_model_checkpoint(model_dir, need_vocab=True)
        architecture = checkpoint_architecture(ckpt, ARCHITECTURES, "this project runs")
        model = build_model(ckpt, architecture)
        if device is None and quantize == "int8":
            device = "cpu"
        device = resolve_device(str(device) if device is not None else None)
        model = quantize_model(model, quantize, device)
        _set_dtype(model, dtype, device)
        return cls._with_tokenizer(
            model,
            ckpt,
            architecture,
            device,
            has_pooler(ckpt),
            has_mlm_head(ckpt),
            model_dir,
            max_seq_length=max_seq_length,
            batch_size=batch_size,
            do_lower_case=do_lower_case,
        )

    @classmethod
    def _with_tokenizer(
        cls,
        model: torch.nn.Module,
        ckpt: Checkpoint,
        architecture: str,
        device: torch.device,
        has_pooler: bool,
        has_mlm_head: bool,
        model_dir: str | os.PathLike,
        *,
        max_seq_length: int | None,
        batch_size: int,
        do_lower_case: bool | None,
    ) -> Predictor:
        """The Predictor of a loaded model (either backend) with the tokenizer its directory describes."""
        assert ckpt.config is not None and ckpt.vocab_file is not None  # both loaders check them
        settings = ckpt.tokenizer_settings
        if do_lower_case is None:
            do_lower_case = settings.get("do_lower_case")
            if do_lower_case is None:
                logger.warning("%s has no tokenizer_config.json: lower-casing the input (uncased model)", model_dir)
                do_lower_case = True
        vocab = load_vocab(ckpt.vocab_file)
        ckpt.config.validate_vocab(max(vocab.values()) + 1, ckpt.vocab_file)
        tokenizer = FullTokenizer(
            vocab,
            do_lower_case=bool(do_lower_case),
            tokenize_chinese_chars=settings.get("tokenize_chinese_chars", True) is not False,
            strip_accents=settings.get("strip_accents"),
        )
        st = read_sentence_transformers_config(model_dir) if Path(model_dir).is_dir() else None
        return cls(
            model,
            tokenizer,
            architecture,
            device,
            max_seq_length=max_seq_length,
            batch_size=batch_size,
            has_mlm_head=has_mlm_head,
            has_pooler=has_pooler,
            sentence_transformers=st,
            source=str(model_dir),
        )

    def _require(self, task: str) -> None:
        if self.task != task or (task == FILL_MASK and not self.has_mlm_head):
            raise InputError(
                f"{self.source} is a {self.architecture} (config.json architectures) without a {task} head; "
                f"{_HEAD_ADVICE[task]}, or use `bert embed` for its embeddings"
            )

    # --------------------------------------------------------------------------------------- batching
    def _run(
        self,
        sequences: Sequence[tuple[Sequence[int], Sequence[int]]],
        fn: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, np.ndarray], Sequence[Any]],
        batch_size: int | None,
    ) -> list[Any]:
        """`fn(input_ids, attention_mask, token_type_ids, indexes)` on batches of (ids, segment ids)
        sequences, longest first, each padded to its longest; its per-row results in input order.

        On the CPU with the torch backend, when there are more batches than intra-op threads, the
        batches run side by side, one per thread, each on one thread: a short batch's GEMMs are too small
        to split well across threads, and one-thread batches wait at no OpenMP barrier (all-MiniLM-L6-v2,
        two cores: 1.15x the throughput from 96 sentences up, bench/RESULTS.md). With as many batches
        as threads or fewer, the longest batch would set the time, so each batch uses every thread.
        `fn` must only read shared state.
        """
        batch_size = batch_size or self.batch_size
        lengths = np.array([len(ids) for ids, _ in sequences])
        order = np.argsort(-lengths, kind="stable")
        out: list[Any] = [None] * len(sequences)

        def run_batch(start: int) -> None:
            idx = order[start : start + batch_size]
            T = int(lengths[idx[0]])
            ids = pad_2d([sequences[i][0] for i in idx], T)
            types = pad_2d([sequences[i][1] for i in idx], T)
            mask = (np.arange(T)[None, :] < lengths[idx][:, None]).astype(np.int64)  # [B, T]
            tensors = [torch.from_numpy(a).to(self.device) for a in (ids, mask, types)]
            with torch.inference_mode():  # thread-local, so entered in the thread that runs the batch
                for i, row in zip(idx, fn(*tensors, idx)):
                    out[i] = row

        starts = range(0, len(order), batch_size)
        threads = torch.get_num_threads()
        if self.device.type != "cpu" or self.backend != "torch" or not 1 < threads < len(starts):
            for start in starts:
                run_batch(start)
            return out

        # Each worker sets its OpenMP team size to one as it starts; that also sets torch's process-wide
        # default, which only threads started later read, restored below.
        pool = ThreadPoolExecutor(
            threads, thread_name_prefix="bert-batch", initializer=torch.set_num_threads, initargs=(1,)
        )
        try:
            for future in [pool.submit(run_batch, start) for start in starts]:
                future.result()
        finally:
            pool.shutdown(cancel_futures=True)
            torch.set_num_threads(threads)
        return out

    # --------------------------------------------------------------------------------- classification
    def set_windows(
        self,
        long_document: str | None = None,
        doc_stride: int | None = None,
        window_pooling: str | None = None,
        source: str = "the caller",
    ) -> None:
        """Set how `classify` reads long documents (and `answer` its contexts' stride); None keeps a setting.

        The settings start as the model's `config.json` says (`long_document`, `doc_stride`,
        `window_pooling`, as `bert classify` saved them); a value that changes one is logged with its
        `source`. Raises `InputError` naming `source` for a value the task code does not take.
        """
        given = {"long_document": long_document, "doc_stride": doc_stride, "window_pooling": window_pooling}
        for name, value in _checked_windows(given, source).items():
            if getattr(self, name) != value:
                logger.warning("%s=%s from %s overrides the model's %s", name, value, source, getattr(self, name))
            setattr(self, name, value)

    def classify(
        self,
        inputs: Sequence[str | tuple[str, str | None]],
        top_k: int | None = 1,
        batch_size: int | None = None,
        raw_scores: bool = False,
        *,
        truncate: bool = True,
        truncation_direction: str = "right",
    ) -> list[dict[str, Any]]:
        """Classify texts or text pairs; one result per input, in order, as `bert classify --do_predict`.

        Args:
            inputs: texts, or (text, text_pair) tuples (text_pair may be None).
            top_k: also list the `top_k` best labels with their scores under "scores" (0 or None: all);
                with 1 (the default) only the best.
            raw_scores: "scores" lists the logits instead of the probabilities.
            truncate, truncation_direction: with `long_document` "truncate", see `_pair_sequences` ("left"
                cuts a text's start).

        Long inputs are read as the model was fine-tuned to read them (`long_document`, `doc_stride`,
        `window_pooling`; see `set_windows`), by classification's own code: "truncate" cuts a pair to
        `max_seq_length` as run_classifier.py does (`bert.tasks.glue.convert_examples_to_features`);
        "windows" reads the whole first text in windows, the second cut to what the windows leave it
        (`bert.tasks.windows.window_spans`), and pools the windows' logits (`bert.tasks.windows.pool_windows`).

        Returns dicts, by `problem_type`: single-label {"label", "score"} (softmax probability);
        multi-label {"labels": [{"label", "score"}, ...]} for every label whose sigmoid reaches its
        threshold, best first; regression {"score"} (the model's output). With `top_k` != 1, also
        "scores": [{"label", "score"}, ...], best first.
        """
        pooled = self.classification_logits(
            inputs, batch_size, truncate=truncate, truncation_direction=truncation_direction
        )
        return [self._classification_result(row, top_k, raw_scores) for row in pooled]

    def classification_logits(
        self,
        inputs: Sequence[str | tuple[str, str | None]],
        batch_size: int | None = None,
        *,
        truncate: bool = True,
        truncation_direction: str = "right",
    ) -> np.ndarray:
        """The float32 logits [N, L] (label-list order) `classify` turns into its results, long inputs read as
        `classify` reads them (a teacher's soft labels, `bert.distillation`, are these)."""
        self._require(CLASSIFICATION)
        pairs = self._checked_pairs(inputs)
        if not pairs:
            return np.zeros((0, self.model.num_labels), dtype=np.float32)
        with self._lock, _quiet_task_logs():
            if self.long_document == "truncate":
                sequences = self._pair_sequences(pairs, truncate, truncation_direction)
            else:
                features = convert_examples_to_windows(
                    self._examples(pairs), self._label_list, self.max_seq_length, self.tokenizer, self.doc_stride, False
                )
                sequences = [(f.input_ids, f.segment_ids) for f in features]

            def head(ids, mask, types, idx):
                return list(self.model(ids, mask, types).logits.float().cpu().numpy())

            logits = self._run(sequences, head, batch_size)
        if self.long_document == "truncate":
            return np.stack(logits).astype(np.float32)  # [N, L]
        return pool_windows(logits, features, len(pairs), self.window_pooling).astype(np.float32)  # [N, L]

    @staticmethod
    def _checked_pairs(inputs: Sequence[str | tuple[str, str | None]]) -> list[tuple[str, str | None]]:
        pairs = []
        for i, item in enumerate(inputs):
            a, b = (item, None) if isinstance(item, str) else tuple(item)
            if not isinstance(a, str) or not a.strip():
                raise InputItemError(i, "the text must be a non-empty string")
            if b is not None and not isinstance(b, str):
                raise InputItemError(i, f"text_pair must be a string, got {type(b).__name__}")
            pairs.append((a, b or None))
        return pairs

    def _pair_sequences(
        self, pairs: list[tuple[str, str | None]], truncate: bool, truncation_direction: str
    ) -> list[tuple[list[int], list[int]]]:
        """`[CLS] a [SEP] (b [SEP])` per pair with segment ids. Too long for `max_seq_length`: with `truncate`,
        cut as `bert classify` cuts (run_classifier.py `_truncate_seq_pair`: a token at a time from the
        longer text, at its end for "right", at its start for "left"); else an `InputItemError`."""
        if truncation_direction not in TRUNCATION_DIRECTIONS:
            raise InputError(
                f"truncation_direction={truncation_direction!r} must be one of {', '.join(TRUNCATION_DIRECTIONS)}"
            )
        if truncate and truncation_direction == "right":
            return self._truncated_features(pairs)
        cls_id, sep_id = self._special["[CLS]"], self._special["[SEP]"]
        sequences = []
        for i, (a, b) in enumerate(pairs):
            ids_a, ids_b = self.tokenizer.encode(a), self.tokenizer.encode(b) if b else []
            room = self.max_seq_length - (3 if b else 2)
            if len(ids_a) + len(ids_b) > room:
                if not truncate:
                    raise InputItemError(
                        i,
                        f"{len(ids_a) + len(ids_b) + self.max_seq_length - room} tokens with [CLS] and [SEP], more "
                        f"than max_seq_length={self.max_seq_length}; shorten it or let it be truncated",
                    )
                # The end-popping rule on reversed pieces pops from the start.
                ids_a, ids_b = ids_a[::-1], ids_b[::-1]
                truncate_seq_pair(ids_a, ids_b, room)
                ids_a, ids_b = ids_a[::-1], ids_b[::-1]
            ids = [cls_id, *ids_a, sep_id]
            types = [0] * len(ids)
            if b:
                ids += [*ids_b, sep_id]
                types += [1] * (len(ids_b) + 1)
            sequences.append((ids, types))
        return sequences

    def _examples(self, pairs: list[tuple[str, str | None]]) -> list[InputExample]:
        """The pairs as classification examples, each with the placeholder label of a test example."""
        placeholder = 0.0 if self.problem_type == "regression" else self.labels[0]
        return [InputExample(str(i), a, b, placeholder) for i, (a, b) in enumerate(pairs)]

    @property
    def _label_list(self) -> list[Any]:
        return [None] if self.problem_type == "regression" else list(self.labels or ())

    def _truncated_features(self, pairs: list[tuple[str, str | None]]) -> list[tuple[list[int], list[int]]]:
        features = convert_examples_to_features(
            self._examples(pairs), self._label_list, self.max_seq_length, self.tokenizer, pad=False
        )
        full = sum(len(f.input_ids) == self.max_seq_length for f in features)
        if self._cut is not None:
            self._cut[0] += full
            self._cut[1] += len(features)
        elif full:
            self._warn_cut(full, len(features))
        return [(f.input_ids, f.segment_ids) for f in features]

    def _warn_cut(self, cut: int, total: int) -> None:
        logger.warning(
            "%d of %d inputs fill max_seq_length=%d and may have been cut; %s",
            cut,
            total,
            self.max_seq_length,
            self._cut_advice,
        )

    @contextlib.contextmanager
    def counting_truncations(self, advice: str = "") -> Iterator[None]:
        """Inside it, the inputs cut to `max_seq_length` are counted and warned of once, as it ends, instead
        of once per call: a command calls the model once per line or chunk of its input. `advice` ends the
        warning: what the caller offers for long inputs (default: classification's windows)."""
        self._cut, self._cut_advice = [0, 0], advice or WINDOWS_ADVICE
        try:
            yield
        finally:
            (cut, total), self._cut = self._cut, None
            if cut:
                self._warn_cut(cut, total)
            self._cut_advice = WINDOWS_ADVICE

    def _classification_result(self, logits: np.ndarray, top_k: int | None, raw_scores: bool) -> dict[str, Any]:
        if self.problem_type == "regression":
            return {"score": float(logits[0])}
        # The task's own probabilities, so that scores are test_results.tsv's float32 values.
        if self.problem_type == "multi_label_classification":
            scores = sigmoid(logits)
            ranked = _top(scores, self.labels, None)
            result: dict[str, Any] = {"labels": [r for r in ranked if r["score"] >= self.label_thresholds[r["label"]]]}
        else:
            scores = softmax(logits)
            result = _top(scores, self.labels, 1)[0]
        if top_k != 1:
            result["scores"] = _top(logits if raw_scores else scores, self.labels, top_k)
        return result

    # -------------------------------------------------------------------------------------------- NER
    def tag_words(self, texts: Sequence[str], batch_size: int | None = None) -> list[list[dict[str, Any]]]:
        """A tag per word: for each text, [{"word", "start", "end", "label", "score"}, ...].

        Words are the original BasicTokenizer's tokens (whitespace-separated, each punctuation
        character apart), each with its span in the text. A word's tag is its first WordPiece's
        prediction and its score that prediction's softmax probability, as `bert ner` reads them; texts
        longer than `max_seq_length` are tagged in consecutive windows at word boundaries.
        """
        self._require(NER)
        _require_texts(texts)
        basic = self.tokenizer.basic_tokenizer
        spans = [[(s, e) for _, s, e in basic.tokenize_with_offsets(t)] for t in texts]
        examples = [
            NerExample(str(i), [t[s:e] for s, e in sp], [self.labels[0]] * len(sp))
            for i, (t, sp) in enumerate(zip(texts, spans))
        ]
        with self._lock, _quiet_task_logs():
            features = convert_ner_examples_to_features(
                examples, self.labels, self.max_seq_length, self.tokenizer, pad=False
            )

            def head(ids, mask, types, idx):
                logits = self.model(ids, mask, types).logits.float()  # [B, T, L]
                return [row[: len(features[i].input_ids)] for row, i in zip(logits.cpu().numpy(), idx)]

            logits = self._run([(f.input_ids, f.segment_ids) for f in features], head, batch_size)
        if features:
            tags = word_predictions(examples, features, _pad_3d(logits), self.labels)
        else:
            tags = [[] for _ in examples]
        scores = [[0.0] * len(ex.words) for ex in examples]
        for f, row in zip(features, logits):
            probs = torch.softmax(torch.from_numpy(row), dim=-1).max(-1).values.tolist()  # [T]
            for position, w in enumerate(f.word_index):
                if w >= 0:
                    scores[f.example_index][w] = probs[position]
        out = []
        for ex, sp, labels, sc in zip(examples, spans, tags, scores):
            out.append(
                [
                    {"word": w, "start": s, "end": e, "label": label, "score": score}
                    for w, (s, e), label, score in zip(ex.words, sp, labels, sc)
                ]
            )
        return out

    def ner(self, texts: Sequence[str], batch_size: int | None = None) -> list[list[dict[str, Any]]]:
        """Entity spans: for each text, [{"entity", "start", "end", "text", "score"}, ...] in text order.

        The words' tags (`tag_words`) are grouped into entities as conlleval reads them (a B- tag or a
        change of type starts one, so IOB1 and IOB2 tags both work); an entity covers its words'
        characters, `text[start:end]`, with what lies between them, and its score is the mean of its
        words' scores.
        """
        out = []
        for text, words in zip(texts, self.tag_words(texts, batch_size)):
            entities = []
            for kind, first, last in iob_chunks([w["label"] for w in words]):
                start, end = words[first]["start"], words[last - 1]["end"]
                score = float(np.mean([w["score"] for w in words[first:last]]))
                entities.append({"entity": kind, "start": start, "end": end, "text": text[start:end], "score": score})
            out.append(entities)
        return out

    # ---------------------------------------------------------------------------- question answering
    def answer(
        self, questions: Sequence[str], contexts: Sequence[str], batch_size: int | None = None
    ) -> list[dict[str, Any]]:
        """The answer span of each question in its context: {"answer", "start", "end", "score"}.

        As `bert squad --do_predict`: the context is cut into windows of `max_seq_length` tokens,
        `doc_stride` apart, after the question (cut to `max_query_length` tokens); the answer is the
        best span over all windows by run_squad.py's n-best rules, its text projected back onto the
        context's words, and its score its n-best softmax probability. `start` and `end` locate it in the
        context; `context[start:end]` is the answer, except that whitespace between its words is the
        context's own (the answer text joins words by one space, as predictions.json does). For a SQuAD
        2.0 model (`version_2_with_negative`) a question the model deems unanswerable gets
        {"answer": None, "start": None, "end": None, "score": <the no-answer probability>}.
        """
        self._require(QUESTION_ANSWERING)
        if len(questions) != len(contexts):
            raise InputError(f"{len(questions)} questions for {len(contexts)} contexts; give one context per question")
        _require_texts(questions, "question")
        _require_texts(contexts, "context")
        data = {
            "data": [
                {"paragraphs": [{"context": c, "qas": [{"id": str(i), "question": q}]}]}
                for i, (q, c) in enumerate(zip(questions, contexts))
            ]
        }
        examples = squad_examples_from_json(data, is_training=False, source="input")
        with self._lock, _quiet_task_logs():
            features = squad_features(
                examples,
                self.tokenizer,
                self.max_seq_length,
                self.doc_stride,
                self.max_query_length,
                is_training=False,
                pad_to_max_length=False,
            )

            def head(ids, mask, types, idx):
                logits = self.model(ids, mask, types).logits.float().cpu().numpy()  # [B, T, 2]
                return [row[: len(features[i].input_ids)] for row, i in zip(logits, idx)]

            logits = self._run([(f.input_ids, f.segment_ids) for f in features], head, batch_size)
        # bert squad ranks the real positions of each window only.
        results = [RawResult(f.unique_id, row[:, 0].tolist(), row[:, 1].tolist()) for f, row in zip(features, logits)]
        predictions = compute_predictions(
            examples,
            features,
            results,
            self.n_best_size,
            self.max_answer_length,
            self.tokenizer.basic_tokenizer.do_lower_case,
            self.version_2_with_negative,
            self.null_score_diff_threshold,
        )
        by_example: dict[int, list] = {}
        for f in features:
            by_example.setdefault(f.example_index, []).append(f)
        by_id = {r.unique_id: r for r in results}
        out = []
        for i, (example, context) in enumerate(zip(examples, contexts)):
            text = predictions.predictions[example.qas_id]
            nbest = predictions.nbest[example.qas_id]
            entry = next(e for e in nbest if e["text"] == text)
            span = None
            if text:
                span = _answer_span(example, context, by_example.get(i, []), by_id, entry, self.max_answer_length)
            if span is None:  # no answer (SQuAD 2.0), or no valid span at all (run_squad.py's "empty")
                out.append({"answer": None, "start": None, "end": None, "score": entry["probability"]})
            else:
                out.append({"answer": text, "start": span[0], "end": span[1], "score": entry["probability"]})
        return out

    # ------------------------------------------------------------------------------- multiple choice
    def choose(
        self, contexts: Sequence[str], endings: Sequence[Sequence[str]], batch_size: int | None = None
    ) -> list[dict[str, Any]]:
        """The best ending of each context: {"choice": index, "ending", "score", "scores": [per ending]}.

        Each (context, ending) pair is `[CLS] context [SEP] ending [SEP]`, truncated to `max_seq_length`
        as `bert swag` does; the scores are the softmax over the context's endings.
        """
        self._require(MULTIPLE_CHOICE)
        if len(contexts) != len(endings):
            raise InputError(f"{len(contexts)} contexts for {len(endings)} lists of endings; give one list per context")
        _require_texts(contexts, "context")
        for i, ends in enumerate(endings):
            if isinstance(ends, str) or len(ends) < 2:
                raise InputItemError(i, "give at least two endings to choose from, as a list")
            try:
                _require_texts(ends, "ending")
            except InputItemError as e:
                raise InputItemError(i, f"ending {e.reason}") from None
        examples = [SwagExample(str(i), c, "", list(e)) for i, (c, e) in enumerate(zip(contexts, endings))]
        with self._lock, _quiet_task_logs():
            features = convert_swag_examples_to_features(examples, self.max_seq_length, self.tokenizer, pad=False)
            # Every choice is its own sequence (one choice per row), so choices sort by length like the rest.
            sequences = [(ids, seg) for f in features for ids, seg in zip(f.input_ids, f.segment_ids)]

            def head(ids, mask, types, idx):
                logits = self.model(ids[:, None], mask[:, None], types[:, None]).logits  # [B, 1]
                return logits[:, 0].float().cpu().tolist()

            flat = iter(self._run(sequences, head, batch_size))
        out = []
        for ends in endings:
            logits = torch.tensor([next(flat) for _ in ends])
            scores = torch.softmax(logits, dim=-1).tolist()
            best = int(np.argmax(scores))
            out.append({"choice": best, "ending": ends[best], "score": scores[best], "scores": scores})
        return out

    # ------------------------------------------------------------------------------------ embeddings
    @property
    def default_pooling(self) -> str:
        """The sentence-transformers model's pooling, else mean pooling (see `embed`)."""
        st = self.sentence_transformers
        if st is not None and st.pooling is None:
            raise InputError(
                f"{self.source}: the sentence-transformers configuration asks for {st.unsupported}, which this "
                f"project does not implement; choose a pooling ({', '.join(POOLINGS)}) explicitly"
            )
        return st.pooling if st is not None else "mean"

    @property
    def default_normalize(self) -> bool:
        return self.sentence_transformers.normalize if self.sentence_transformers is not None else False

    def resolve_prompt(self, prompt_name: str | None = None, prompt: str | None = None) -> str | None:
        """The prompt text a call prepends, as sentence-transformers' `encode` picks it: `prompt` itself,
        else the named one of `config_sentence_transformers.json`'s `prompts`, else the default prompt
        (`default_prompt_name`), else none."""
        if prompt is not None:
            if prompt_name is not None:
                raise InputError("give a prompt or a prompt_name, not both")
            return prompt
        prompts = self.sentence_transformers.prompts if self.sentence_transformers is not None else {}
        name = prompt_name if prompt_name is not None else self.default_prompt_name
        if name is None:
            return None
        if name not in prompts:
            raise InputError(
                f"prompt_name {name!r} is not one of the model's prompts ({', '.join(prompts) or 'none'}; "
                "config_sentence_transformers.json)"
            )
        return prompts[name]

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
        if truncation_direction not in TRUNCATION_DIRECTIONS:
            raise InputError(
                f"truncation_direction={truncation_direction!r} must be one of {', '.join(TRUNCATION_DIRECTIONS)}"
            )
        if isinstance(texts, str):
            raise TypeError("expected a list of texts, got one string")
        cls_id, sep_id = self._special["[CLS]"], self._special["[SEP]"]
        vocab_size = self.config.vocab_size
        prompt_ids = self.tokenizer.encode(prompt) if prompt else []
        strings = {i: (prompt or "") + t for i, t in enumerate(texts) if isinstance(t, str)}
        encoded = dict(zip(strings, self.tokenizer.encode_batch(list(strings.values()))))
        sequences, prompt_lengths = [], []
        for i, text in enumerate(texts):
            if isinstance(text, str):
                if not text.strip():
                    raise InputItemError(i, "empty text; give some text or leave the item out")
                head, body, tail = [cls_id], encoded[i], [sep_id]
                prompt_length = 1 + len(prompt_ids) if prompt else 0
            elif isinstance(text, Sequence) and all(type(t) is int for t in text):
                if not text:
                    raise InputItemError(i, "an empty list of token ids; give at least one")
                bad = next((t for t in text if not 0 <= t < vocab_size), None)
                if bad is not None:
                    raise InputItemError(i, f"token id {bad} is outside the vocabulary (0 to {vocab_size - 1})")
                if prompt:
                    # As TEI, which decodes the ids without their special tokens and encodes the prompt and
                    # that text: [CLS] prompt ids [SEP].
                    special = {self.tokenizer.vocab.get(t) for t in SPECIAL_TOKENS}
                    head, body, tail = [cls_id, *prompt_ids], [t for t in text if t not in special], [sep_id]
                else:
                    head, body, tail = [], list(text), []
                prompt_length = len(head)
            else:
                raise InputItemError(i, f"expected a text or a list of token ids, got {type(text).__name__}")
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
            prompt_lengths.append(min(prompt_length, len(ids) - 1))
        return sequences, prompt_lengths

    def _encode(
        self,
        texts: Sequence[str | Sequence[int]],
        fn: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, Any], list[Any]],
        batch_size: int | None,
        truncate: bool,
        truncation_direction: str,
        prompt_name: str | None,
        prompt: str | None,
        doc_stride: int | None = None,
    ) -> tuple[list[Any], list[InputFeatures] | None]:
        """`fn(last layer [B, T, H], pooling mask [B, T], attention mask [B, T], encoder output)` over the
        embedding sequences of `texts`; the pooling mask is the attention mask without the prompt when the
        model's Pooling says `include_prompt: false`. With `doc_stride`, the sequences are the windows of
        each text as classification cuts them (`bert.tasks.windows.convert_examples_to_windows`), returned
        with the rows as their features (else None), which say the text each window is of."""
        prompt = self.resolve_prompt(prompt_name, prompt)
        st = self.sentence_transformers
        exclude_prompt = st is not None and not st.include_prompt
        windows = None
        with self._lock:
            if doc_stride is None:
                sequences, prompt_lengths = self.embedding_sequences(
                    texts, truncate=truncate, truncation_direction=truncation_direction, prompt=prompt
                )
            else:
                if prompt:
                    raise InputError("a prompt and windows do not go together: the prompt would be in one window only")
                _require_texts(texts)  # strings only: token-id inputs have no text to cut into windows
                examples = [InputExample(str(i), text, None, 0.0) for i, text in enumerate(cast(list[str], texts))]
                with _quiet_task_logs():
                    windows = convert_examples_to_windows(
                        examples, [None], self.max_seq_length, self.tokenizer, doc_stride, pad=False
                    )
                sequences = [(f.input_ids, f.segment_ids) for f in windows]
                prompt_lengths = [0] * len(sequences)
            skip = torch.tensor(prompt_lengths if exclude_prompt else [0] * len(sequences))

            def run(ids, mask, types, idx):
                out = self.encoder(ids, mask, types)
                hidden = out.sequence_output.float()  # [B, T, H]
                positions = torch.arange(ids.shape[1], device=ids.device)[None, :]  # [1, T]
                pool_mask = mask * (positions >= skip[idx].to(ids.device)[:, None])  # [B, T]
                return fn(hidden, pool_mask, mask, out)

            return self._run(sequences, run, batch_size), windows

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
        if long_document not in LONG_DOCUMENT:
            raise InputError(f"long_document={long_document!r} must be one of {', '.join(LONG_DOCUMENT)}")
        if long_document == "windows":
            doc_stride = _checked_windows({"doc_stride": doc_stride}, "embed").get("doc_stride", self.doc_stride)
        else:
            doc_stride = None
        pooling = pooling or self.default_pooling
        normalize = self.default_normalize if normalize is None else normalize
        if pooling not in POOLINGS:
            raise InputError(f"pooling={pooling!r} must be one of {', '.join(POOLINGS)}")
        if pooling == "pooler" and not self.has_pooler:
            raise InputError(f"{self.source} has no pooler weights; use pooling cls, mean or max")
        hidden_size = self.config.hidden_size
        if dimensions is not None and not 1 <= dimensions <= hidden_size:
            raise InputError(f"dimensions={dimensions} must be between 1 and the model's {hidden_size}")

        def pool(hidden, mask, attention_mask, out):
            # mask: the tokens pooled (without the prompt's when the model's pooling excludes it)
            vectors = out.pooled_output.float() if pooling == "pooler" else pool_tokens(hidden, mask, pooling)
            vectors = vectors[:, :dimensions]
            if normalize:
                vectors = F.normalize(vectors, p=2, dim=1)
            return list(vectors.cpu().numpy())

        vectors, windows = self._encode(
            texts, pool, batch_size, truncate, truncation_direction, prompt_name, prompt, doc_stride
        )
        if not vectors:
            return np.zeros((0, dimensions or hidden_size), dtype=np.float32)
        out = np.stack(vectors).astype(np.float32, copy=False)  # [N or windows, D]
        if windows is not None:
            out = pool_windows(list(out), windows, len(texts), "mean")  # [N, D]
            if normalize:
                out = F.normalize(torch.from_numpy(out), p=2, dim=1).numpy()
        return out

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

        def rows(hidden, pool_mask, attention_mask, out):
            return [h[: int(n)].cpu().numpy() for h, n in zip(hidden, attention_mask.sum(1))]

        return self._encode(texts, rows, batch_size, truncate, truncation_direction, prompt_name, prompt)[0]

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
        vectors = self.embed(
            [source, *sentences],
            batch_size=batch_size,
            pooling=pooling,
            normalize=True,
            truncate=truncate,
            truncation_direction=truncation_direction,
            prompt_name=prompt_name,
        )
        return [float(s) for s in vectors[1:] @ vectors[0]]

    def tokenize(
        self, texts: Sequence[str], *, add_special_tokens: bool = True, prompt_name: str | None = None
    ) -> list[list[dict[str, Any]]]:
        """The tokens of each text as the model reads them (TEI's /tokenize): [{"id", "text", "special",
        "start", "stop"}, ...], where `start`/`stop` are character offsets into the text (with the prompt,
        when one applies, prepended: into prompt+text) and "text" is that span; with `add_special_tokens`,
        [CLS] first and [SEP] last (special, without offsets). Not truncated."""
        _require_texts(texts)
        prompt = self.resolve_prompt(prompt_name) or ""

        def special(token: str) -> dict[str, Any]:
            return {"id": self._special[token], "text": token, "special": True, "start": None, "stop": None}

        out = []
        for text in texts:
            full = prompt + text
            tokens = [
                {"id": token_id, "text": full[start:end], "special": False, "start": start, "stop": end}
                for _, token_id, start, end in self.tokenizer.tokenize_with_offsets(full)
            ]
            out.append([special("[CLS]"), *tokens, special("[SEP]")] if add_special_tokens else tokens)
        return out

    def decode(self, ids: Sequence[Sequence[int]], *, skip_special_tokens: bool = True) -> list[str]:
        """The text of each list of token ids (`FullTokenizer.decode`; TEI's /decode)."""
        out = []
        for i, row in enumerate(ids):
            try:
                out.append(self.tokenizer.decode(row, skip_special_tokens=skip_special_tokens))
            except KeyError as e:
                raise InputItemError(i, f"token id {e.args[0]} is not in the vocabulary") from None
        return out

    @property
    def is_cross_encoder(self) -> bool:
        """A sequence-classification model with one output, which scores a (query, document) pair."""
        return self.task == CLASSIFICATION and len(self.labels or ()) == 1

    def rank(
        self,
        query: str,
        documents: Sequence[str],
        top_k: int | None = None,
        *,
        raw_scores: bool = False,
        truncate: bool = True,
        truncation_direction: str = "right",
        batch_size: int | None = None,
        pooling: str | None = None,
    ) -> list[dict[str, Any]]:
        """The documents by relevance to `query`: [{"index", "score"}, ...], best first, `top_k` of them
        (None: all).

        A cross-encoder (`is_cross_encoder`) reads each `[CLS] query [SEP] document [SEP]` (the pair cut to
        `max_seq_length` as `classify` cuts it) and its score is the sigmoid of the logit (the logit
        itself with `raw_scores`), as TEI's /rerank and sentence-transformers' CrossEncoder; any other
        model except a classifier scores the cosine similarity of the embeddings (`embed`'s, with
        `pooling`; `raw_scores` changes nothing then).
        """
        if isinstance(documents, str):
            raise TypeError("expected a list of documents, got one string")
        if top_k is not None and top_k < 1:
            raise InputError(f"top_k={top_k} must be at least 1")
        if self.is_cross_encoder:
            pairs = self._checked_pairs([(query, d) for d in documents])
            with self._lock, _quiet_task_logs():
                sequences = self._pair_sequences(pairs, truncate, truncation_direction)

                def head(ids, mask, types, idx):
                    return self.model(ids, mask, types).logits[:, 0].float().cpu().tolist()

                logits = torch.tensor(self._run(sequences, head, batch_size), dtype=torch.float32)
            scores = (logits if raw_scores else torch.sigmoid(logits)).tolist()
        elif self.task == CLASSIFICATION:
            raise InputError(
                f"{self.source} is a classifier with {len(self.labels or ())} labels, not a cross-encoder (one "
                "output); rank with a cross-encoder or an embedding model"
            )
        else:
            _require_texts([query], "query")
            scores = self.similarity(
                query,
                documents,
                truncate=truncate,
                truncation_direction=truncation_direction,
                pooling=pooling,
                batch_size=batch_size,
            )
        order = sorted(range(len(scores)), key=lambda i: -scores[i])[:top_k]
        return [{"index": i, "score": scores[i]} for i in order]

    # ------------------------------------------------------------------------------------- fill-mask
    def fill_mask(self, texts: Sequence[str], top_k: int = 5, batch_size: int | None = None) -> list[dict[str, Any]]:
        """The `top_k` likeliest tokens at each `[MASK]` of each text, by the pre-training MLM head.

        Each `[MASK]` in the text (written exactly so) is one masked position; the rest is tokenized as
        usual. Returns, per text, {"sequence", "masks": [{"start", "end", "predictions": [{"token",
        "token_id", "score", "word"}, ...]}, ...]}: the probabilities (softmax over the vocabulary) in
        descending order; `start`/`end` locate the `[MASK]` in the text. Whole words: a prediction that
        continues a word (a `##` piece) reads as part of the word before the mask, so its "word" is that
        word with the piece's text appended (`"play[MASK]"` with `##ing` -> "playing"), and otherwise
        "word" is the token itself. "sequence" is the text with every mask replaced by its top
        prediction, a `##` piece joined to the word before it (the whitespace before the mask dropped).
        """
        self._require(FILL_MASK)
        if top_k < 1:
            raise InputError(f"top_k={top_k} must be at least 1")
        _require_texts(texts)
        mask_id = self._special[MASK_TOKEN]
        if mask_id is None:
            raise InputError(f"{self.source}: the vocabulary has no {MASK_TOKEN} token")
        cls_id, sep_id = self._special["[CLS]"], self._special["[SEP]"]
        sequences, positions = [], []
        with self._lock:
            for i, text in enumerate(texts):
                parts = text.split(MASK_TOKEN)
                if len(parts) == 1:
                    raise InputItemError(
                        i, f"no {MASK_TOKEN} in the text; write {MASK_TOKEN} where a word is to be guessed"
                    )
                ids, where = [cls_id], []
                for j, part in enumerate(parts):
                    ids += self.tokenizer.encode(part)
                    if j < len(parts) - 1:
                        where.append(len(ids))
                        ids.append(mask_id)
                ids.append(sep_id)
                if len(ids) > self.max_seq_length:
                    raise InputItemError(
                        i,
                        f"{len(ids)} tokens with [CLS] and [SEP], more than max_seq_length={self.max_seq_length}; "
                        "shorten the text around its masks",
                    )
                sequences.append((ids, [0] * len(ids)))
                positions.append(where)

            def predict(ids, mask, types, idx):
                rows = [b for b, i in enumerate(idx) for _ in positions[i]]
                cols = [p for i in idx for p in positions[i]]
                if self.backend == "onnx":  # the exported graph's head runs at every position
                    logits = self.model(ids, mask, types).mlm_logits[rows, cols]  # [B, T, V] -> [M, V]
                else:  # the head at the masks only
                    hidden = self.encoder(ids, mask, types).sequence_output  # [B, T, H]
                    logits = self.model.cls.predictions(hidden[rows, cols])  # [M, H] -> [M, V]
                probs = torch.softmax(logits.float(), dim=-1)  # [M, V]
                values, tokens = probs.topk(min(top_k, probs.shape[-1]), dim=-1)  # [M, k]
                values, tokens = values.cpu().tolist(), tokens.cpu().tolist()
                out, m = [], 0
                for i in idx:
                    n = len(positions[i])
                    out.append(list(zip(tokens[m : m + n], values[m : m + n])))
                    m += n
                return out

            found = self._run(sequences, predict, batch_size)
        return [self._fill_result(text, per_mask) for text, per_mask in zip(texts, found)]

    def _fill_result(self, text: str, per_mask: list[tuple[list[int], list[float]]]) -> dict[str, Any]:
        inv = self.tokenizer.inv_vocab
        masks = []
        sequence = ""
        pos = 0
        for token_ids, scores in per_mask:
            start = text.index(MASK_TOKEN, pos)
            sequence += text[pos:start]
            before = re.search(r"\S*$", sequence.rstrip()).group(0)
            predictions = []
            for token_id, score in zip(token_ids, scores):
                token = inv.get(token_id, f"[{token_id}]")
                word = before + token[2:] if token.startswith("##") else token
                predictions.append({"token": token, "token_id": token_id, "score": score, "word": word})
            top = predictions[0]["token"]
            sequence = sequence.rstrip() + top[2:] if top.startswith("##") else sequence + top
            pos = start + len(MASK_TOKEN)
            masks.append({"start": start, "end": pos, "predictions": predictions})
        return {"sequence": sequence + text[pos:], "masks": masks}


def _pad_3d(rows: list[np.ndarray]) -> np.ndarray:
    """[n_i, L] arrays as one zero-padded [len(rows), max n_i, L] array."""
    out = np.zeros((len(rows), max(len(r) for r in rows), rows[0].shape[-1]), dtype=np.float32)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out


def _answer_span(
    example, context: str, features: list, results: dict[int, RawResult], entry: dict, max_answer_length: int
) -> tuple[int, int] | None:
    """Where in `context` the n-best `entry` lies: (start, end) character offsets, or None.

    `compute_predictions` reports the answer's text and its start and end logits, not its position; the
    window positions with those logits that form a valid span give its words, and the text's place in
    them (found as `get_final_text` finds it) gives its characters.
    """
    answer = entry["text"]
    word_starts, pos = [], 0
    for word in example.doc_tokens:
        pos = context.index(word, pos)
        word_starts.append(pos)
        pos += len(word)
    for f in features:
        r = results[f.unique_id]
        for s, first in f.token_to_orig_map.items():
            if r.start_logits[s] != entry["start_logit"] or not f.token_is_max_context.get(s, False):
                continue
            for e, last in f.token_to_orig_map.items():
                if not s <= e < s + max_answer_length or r.end_logits[e] != entry["end_logit"]:
                    continue
                words = example.doc_tokens[first : last + 1]
                k = " ".join(words).find(answer)
                if k < 0:
                    continue
                start = _joined_to_context(words, word_starts[first:], k)
                end = _joined_to_context(words, word_starts[first:], k + len(answer) - 1) + 1
                return start, end
    return None


def _joined_to_context(words: list[str], starts: list[int], k: int) -> int:
    """The context offset of character `k` of `" ".join(words)` (a joining space maps after its word)."""
    for word, start in zip(words, starts):
        if k <= len(word):
            return start + k
        k -= len(word) + 1
    raise ValueError("offset past the words")


def cosine_similarity(vectors: np.ndarray) -> np.ndarray:
    """The [N, N] cosine similarity matrix of N vectors."""
    v = torch.from_numpy(np.asarray(vectors, dtype=np.float32))
    v = F.normalize(v, p=2, dim=1)
    return (v @ v.T).numpy()


__all__ = [
    "TASKS",
    "POOLINGS",
    "TRUNCATION_DIRECTIONS",
    "Predictor",
    "cosine_similarity",
    "read_sentence_transformers_config",
]
