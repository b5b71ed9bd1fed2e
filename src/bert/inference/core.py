"""The `Predictor`'s core: a model loaded with its tokenizer and settings (`from_pretrained`, either
backend), the sequences run in length-sorted batches (`_run`, threaded on the CPU), the inputs cut to
`max_seq_length` counted, the tokenizer's own calls (`tokenize`, `decode`) and the inputs a task's
`prepare_*` method tokenized once for its `run_*` method (`Prepared`). The tasks' methods are mixins on it
(`bert.inference.classification`, `.spans`, `.embeddings`, `.fill_mask`)."""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch

from bert import onnx_backend
from bert.checkpoint import CONFIG_NAME, Checkpoint
from bert.checkpoint import architecture as checkpoint_architecture
from bert.config import BertConfig, check_task_settings
from bert.cpu_kernels import bf16_in_hardware
from bert.distributed import resolve_device
from bert.errors import InputError
from bert.flags import BATCH_SIZE, CPU_BATCH_SIZE, CPU_BATCH_TOKENS, check_backend, check_dtype
from bert.inference.common import (
    HEAD_ADVICE,
    MASK_TOKEN,
    WINDOW_SETTINGS,
    WINDOWS_ADVICE,
    TaskState,
    checked_windows,
    require_texts,
    task_state,
)
from bert.inference.st_config import SentenceTransformersConfig, read_sentence_transformers_config
from bert.input_lines import InputItemError
from bert.loading import ARCHITECTURES, build_model, has_mlm_head, has_pooler, read_model_checkpoint
from bert.modeling import BertModel, BertPreTrainedModel
from bert.quantization import is_quantized, quantize_model
from bert.request_rules import TASKS, has_head
from bert.tasks.classification import LONG_DOCUMENT
from bert.tasks.common import CLASSIFICATION, EMBEDDINGS, FILL_MASK, NER, QUESTION_ANSWERING, pad_2d
from bert.tasks.windows import WINDOW_POOLINGS
from bert.tokenization import FullTokenizer, load_vocab

logger = logging.getLogger(__name__)

P = TypeVar("P", bound="PredictorCore")
# A batch's function: (input_ids, attention_mask, token_type_ids [B, T], the rows' input indexes) -> a result per row.
BatchFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, np.ndarray], Sequence[Any]]
# (token ids, segment ids) of each sequence `_run` runs.
Sequences = list[tuple[list[int], list[int]]]


@dataclass
class Prepared:
    """Inputs tokenized once, cut or refused by the Predictor's length rule: what a `prepare_*` method returns
    and the matching `run_*` method runs, so that the server's queue counts the tokens of the sequences that
    will run and nothing is tokenized twice (`embed`, `classify`, `rank`... are a prepare and a run).

    Attributes:
        sequences: what `_run` runs, one or more per input.
        inputs: the inputs they are of.
        prompt_lengths: an embedding's, per sequence: [CLS] and the prompt (`embedding_sequences`).
        windows: of inputs read in windows (a classifier's, NER's, answers'), the feature of each sequence
            (its `example_index`: its input).
        lead: 1 when the first sequence is the source or query the inputs are scored against, else 0.
        examples: what the run step reads of each input besides its sequences (NER's words and their spans,
            answers' examples, fill-mask's masks), in input order.
    """

    sequences: Sequences
    inputs: int
    prompt_lengths: list[int] = field(default_factory=list)
    windows: list[Any] | None = None
    lead: int = 0
    examples: list[Any] = field(default_factory=list)

    @property
    def tokens(self) -> int:
        """The tokens that run, [CLS] and [SEP] included."""
        return sum(len(ids) for ids, _ in self.sequences)

    @staticmethod
    def join(parts: Sequence[Prepared]) -> Prepared:
        """The prepared inputs of calls with equal options as one: their sequences one after another, the lead
        sequence (equal in each: the options name it) once, windows numbered on (the ids a task's run step
        keys its features by are its own: `run_answer`). The run's results are the parts' in order."""
        first = parts[0]
        if len(parts) == 1:
            return first
        if any(p.lead != first.lead or (p.windows is None) != (first.windows is None) for p in parts):
            raise ValueError("prepared inputs of different kinds do not join")
        if first.lead and any(p.sequences[0] != first.sequences[0] for p in parts):
            raise ValueError("prepared inputs scored against different sources do not join")
        lead = first.lead
        windows: list[Any] | None = None if first.windows is None else []
        joined = Prepared(first.sequences[:lead], 0, first.prompt_lengths[:lead], windows, lead)
        for p in parts:
            joined.sequences += p.sequences[lead:]
            joined.prompt_lengths += p.prompt_lengths[lead:]
            joined.examples += p.examples
            for f in p.windows or []:
                assert windows is not None and f.example_index is not None  # parts alike; a window names its input
                windows.append(replace(f, example_index=f.example_index + joined.inputs))
            joined.inputs += p.inputs
        return joined


class PredictorCore:
    """A model with its tokenizer and settings, ready for raw text. Build it with `from_pretrained`.

    Attributes:
        model: the `bert.modeling` model, in eval mode on `device` (or a `bert.onnx_backend.OnnxModel`).
        architecture: its class name as `config.json` names it (e.g. "BertForMaskedLM").
        task: the head's task: "classification", "ner", "question-answering", "multiple-choice",
            "fill-mask" or "embeddings".
        head: the settings only the head's task reads (`bert.inference.common.TaskState`).
        tokenizer: a `FullTokenizer` with the model's settings.
        max_seq_length: the longest sequence, in WordPiece tokens with [CLS] and [SEP].
        batch_size: sequences per forward pass when a call does not say; default `CPU_BATCH_SIZE` on the CPU
            with the torch backend, else `BATCH_SIZE`.
        long_document, doc_stride, window_pooling: how long inputs are read in windows (`set_windows`).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: FullTokenizer,
        architecture: str,
        device: torch.device,
        *,
        max_seq_length: int | None = None,
        batch_size: int | None = None,
        has_mlm_head: bool = False,
        has_pooler: bool = True,
        sentence_transformers: SentenceTransformersConfig | None = None,
        source: str = "model",
    ):
        if batch_size is not None and batch_size < 1:
            raise InputError(f"batch_size={batch_size} must be at least 1")
        self.model = model.to(device).eval()
        self.tokenizer = tokenizer
        self.architecture = architecture
        self.task = TASKS[architecture]
        self.device = device
        # torch's own CPU kernels: the CPU's batch defaults and batches side by side (`_run`) are for them.
        self.cpu_torch = device.type == "cpu" and self.backend == "torch"
        # The default's token cap (CPU_BATCH_TOKENS) holds where neither the caller nor a call gives a batch size.
        self.batch_tokens = CPU_BATCH_TOKENS if batch_size is None and self.cpu_torch else None
        if batch_size is None:
            batch_size = CPU_BATCH_SIZE if self.cpu_torch else BATCH_SIZE
        self.batch_size = batch_size
        self.source = source
        self.config: BertConfig = _config_of(model)
        # A BertModel is its own encoder; an ONNX graph's is itself or an error to call (`bert.onnx_backend`).
        self.encoder: Any = model if isinstance(model, BertModel) else model.bert
        self.has_mlm_head = has_mlm_head
        self.has_pooler = has_pooler and getattr(self.encoder, "pooler", None) is not None
        self.sentence_transformers = sentence_transformers
        config_file = Path(source) / CONFIG_NAME
        # Checked when config.json was read; again for a model whose config was built in Python.
        check_task_settings(self.config.extra, f"{config_file}: config")
        # How the model was fine-tuned to read long inputs (`bert classify`'s defaults where config.json
        # says nothing, as for models trained elsewhere); `set_windows` overrides them.
        saved = checked_windows({name: self.config.extra.get(name) for name in WINDOW_SETTINGS}, str(config_file))
        self.long_document: str = saved.get("long_document", LONG_DOCUMENT[0])
        self.doc_stride: int = saved.get("doc_stride", 128)
        self.window_pooling: str = saved.get("window_pooling", WINDOW_POOLINGS[0])
        self.max_seq_length = self._max_seq_length(max_seq_length)
        self.config.check_max_seq_length(self.max_seq_length)
        num_labels = _num_labels(model) if self.task in (CLASSIFICATION, NER) else 0
        self.head: TaskState = task_state(self.task, self.config, num_labels, self.max_seq_length)
        self._special = {t: self.tokenizer.vocab.get(t) for t in ("[CLS]", "[SEP]", MASK_TOKEN)}
        for token in ("[CLS]", "[SEP]"):
            if self._special[token] is None:
                raise InputError(f"{source}: the vocabulary has no {token} token; use the model's own vocab.txt")
        # The prompt of calls that name none (`resolve_prompt`); `bert serve --default_prompt_name` sets it.
        self.default_prompt_name = sentence_transformers.default_prompt_name if sentence_transformers else None
        self._lock = threading.Lock()
        self._cut: list[int] | None = None  # [inputs cut, inputs read] inside `counting_truncations`
        self._cut_advice = WINDOWS_ADVICE

    def _max_seq_length(self, given: int | None) -> int:
        """The longest sequence: the caller's, else config.json's, else a sentence-transformers encoder's, else
        the task's default cut to the position table (`bert.inference`'s docstring lists them)."""
        limit = self.config.max_position_embeddings
        if given is None:
            given = self.config.extra.get("max_seq_length")
        st = self.sentence_transformers
        if given is None and self.task == EMBEDDINGS and st is not None:
            given = st.max_seq_length
        if given is None:
            given = min({QUESTION_ANSWERING: 384, FILL_MASK: limit, EMBEDDINGS: limit}.get(self.task, 128), limit)
        return int(given)

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
        cls: type[P],
        model_dir: str | os.PathLike,
        device: str | torch.device | None = None,
        *,
        max_seq_length: int | None = None,
        batch_size: int | None = None,
        do_lower_case: bool | None = None,
        quantize: str = "none",
        dtype: str = "float32",
        backend: str = "torch",
    ) -> P:
        """Load a model directory (or a checkpoint file or TF prefix) for inference.

        Args:
            model_dir: see the module docstring.
            device: a torch device; default CUDA when available, else CPU.
            max_seq_length: override the config's `max_seq_length` (see the module docstring).
            batch_size: sequences per forward pass when a call does not say (default: see the class).
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
            loaded = _load_onnx(model_dir)
        else:
            loaded = _load_torch(model_dir, device, quantize, dtype)
        return cls._with_tokenizer(
            loaded, model_dir, max_seq_length=max_seq_length, batch_size=batch_size, do_lower_case=do_lower_case
        )

    @classmethod
    def _with_tokenizer(
        cls: type[P],
        loaded: _Loaded,
        model_dir: str | os.PathLike,
        *,
        max_seq_length: int | None,
        batch_size: int | None,
        do_lower_case: bool | None,
    ) -> P:
        """The Predictor of a loaded model (either backend) with the tokenizer its directory describes."""
        ckpt = loaded.checkpoint
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
            loaded.model,
            tokenizer,
            loaded.architecture,
            loaded.device,
            max_seq_length=max_seq_length,
            batch_size=batch_size,
            has_mlm_head=loaded.has_mlm_head,
            has_pooler=loaded.has_pooler,
            sentence_transformers=st,
            source=str(model_dir),
        )

    def _special_ids(self) -> tuple[int, int]:
        """The ids of [CLS] and [SEP] (in the vocabulary: checked as the Predictor was built)."""
        cls_id, sep_id = self._special["[CLS]"], self._special["[SEP]"]
        assert cls_id is not None and sep_id is not None
        return cls_id, sep_id

    def has_head(self, task: str) -> bool:
        """Whether this model answers `task` (`bert.request_rules.has_head`)."""
        return has_head(self.architecture, self.has_mlm_head, task)

    def _require(self, task: str) -> None:
        if not self.has_head(task):
            raise InputError(
                f"{self.source} is a {self.architecture} (config.json architectures) without a {task} head; "
                f"{HEAD_ADVICE[task]}, or use `bert embed` for its embeddings"
            )

    # --------------------------------------------------------------------------------------- batching
    def _run(
        self,
        sequences: Sequence[tuple[Sequence[int], Sequence[int]]],
        fn: BatchFn,
        batch_size: int | None,
    ) -> list[Any]:
        """`fn(input_ids, attention_mask, token_type_ids, indexes)` on batches of (ids, segment ids)
        sequences, longest first, each padded to its longest; its per-row results in input order.

        On the CPU with the torch backend, when there are more batches than intra-op threads, the
        batches run side by side, one per thread, each on one thread: a short batch's GEMMs are too small
        to split well across threads, and one-thread batches wait at no OpenMP barrier (all-MiniLM-L6-v2,
        two cores: 1.15x the throughput from 96 sentences up, bench/RESULTS.md). With as many batches
        as threads or fewer, the longest batch would set the time, so each batch uses every thread.
        `fn` must only read shared state. With the default batch size on the CPU a batch also holds at most
        `batch_tokens` tokens by its longest sequence (`bert.flags.CPU_BATCH_TOKENS`), and batches run side by
        side are evened out (`batch_bounds`).
        """
        tokens = self.batch_tokens if batch_size is None else None
        lengths = np.array([len(ids) for ids, _ in sequences])
        order = np.argsort(-lengths, kind="stable")
        out: list[Any] = [None] * len(sequences)
        threads = torch.get_num_threads()
        side_by_side = self.cpu_torch and threads > 1
        bounds = batch_bounds(lengths[order], batch_size or self.batch_size, tokens, threads if side_by_side else 1)

        def run_batch(start: int, stop: int) -> None:
            idx = order[start:stop]
            T = int(lengths[idx[0]])
            ids = pad_2d([sequences[i][0] for i in idx], T)
            types = pad_2d([sequences[i][1] for i in idx], T)
            mask = (np.arange(T)[None, :] < lengths[idx][:, None]).astype(np.int64)  # [B, T]
            tensors = [torch.from_numpy(a).to(self.device) for a in (ids, mask, types)]
            with torch.inference_mode():  # thread-local, so entered in the thread that runs the batch
                for i, row in zip(idx, fn(tensors[0], tensors[1], tensors[2], idx)):
                    out[i] = row

        if not side_by_side or len(bounds) <= threads:
            for start, stop in bounds:
                run_batch(start, stop)
            return out

        # Each worker sets its OpenMP team size to one as it starts; that also sets torch's process-wide
        # default, which only threads started later read, restored below.
        pool = ThreadPoolExecutor(
            threads, thread_name_prefix="bert-batch", initializer=torch.set_num_threads, initargs=(1,)
        )
        try:
            for future in [pool.submit(run_batch, start, stop) for start, stop in bounds]:
                future.result()
        finally:
            pool.shutdown(cancel_futures=True)
            torch.set_num_threads(threads)
        return out

    # ------------------------------------------------------------------------------------ long inputs
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
        for name, value in checked_windows(given, source).items():
            if getattr(self, name) != value:
                logger.warning("%s=%s from %s overrides the model's %s", name, value, source, getattr(self, name))
            setattr(self, name, value)

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

    def _count_cut(self, cut: int, total: int) -> None:
        """`cut` of `total` inputs filled `max_seq_length`: counted inside `counting_truncations`, else warned of."""
        if self._cut is not None:
            self._cut[0] += cut
            self._cut[1] += total
        elif cut:
            self._warn_cut(cut, total)

    # -------------------------------------------------------------------------------------- tokenizer
    def tokenize(
        self, texts: Sequence[str], *, add_special_tokens: bool = True, prompt_name: str | None = None
    ) -> list[list[dict[str, Any]]]:
        """The tokens of each text as the model reads them (TEI's /tokenize): [{"id", "text", "special",
        "start", "stop"}, ...], where `start`/`stop` are character offsets into the text (with the prompt,
        when one applies, prepended: into prompt+text) and "text" is that span; with `add_special_tokens`,
        [CLS] first and [SEP] last (special, without offsets). Not truncated."""
        require_texts(texts)
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

    # ---------------------------------------------------------------------------------------- prompts
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


def batch_bounds(lengths: np.ndarray, batch_size: int, tokens: int | None, lanes: int = 1) -> list[tuple[int, int]]:
    """[start, stop) ranges of batches over `lengths`, sorted longest first: at most `batch_size` rows and, with
    `tokens`, at most that many tokens by each batch's longest (a longer sequence alone).

    With `tokens` and more batches than `lanes` (threads running batches side by side), the cap is lowered to
    the least that still gives no more batches than the next multiple of `lanes`: a reranking call of 16 pairs
    cut 4/5/6/1 at 1,024 tokens gave one of two threads 1,869 padded tokens and the other 1,082; cut 3/4/4/5,
    1,409 and 1,505 (all-MiniLM-L6-v2's rerankings 1.18x, bench/RESULTS.md).
    A batch size given by a caller (`tokens` None) is kept as given.
    """

    def starts(cap: int | None) -> list[int]:
        out = [0]
        while out[-1] < len(lengths):
            size = batch_size if cap is None else max(1, min(batch_size, cap // int(lengths[out[-1]])))
            out.append(min(len(lengths), out[-1] + size))
        return out

    cut = starts(tokens)
    if tokens is not None and 1 < lanes < len(cut) - 1:
        # The number of batches only falls as the cap rises, so the least cap is found by bisection.
        most = -(-(len(cut) - 1) // lanes) * lanes
        low, high = min(int(lengths[0]), tokens), tokens  # a sequence over the cap is a batch of its own
        while low < high:
            mid = (low + high) // 2
            if len(starts(mid)) - 1 <= most:
                high = mid
            else:
                low = mid + 1
        cut = starts(low)
    return list(zip(cut[:-1], cut[1:]))


@dataclass
class _Loaded:
    """A model loaded by either backend, with what the Predictor reads beside it."""

    model: torch.nn.Module
    checkpoint: Checkpoint  # its config, vocab and tokenizer settings
    architecture: str
    device: torch.device
    has_pooler: bool
    has_mlm_head: bool


def _load_onnx(model_dir: str | os.PathLike) -> _Loaded:
    graph, ckpt = onnx_backend.load(model_dir, torch.get_num_threads())
    return _Loaded(graph, ckpt, graph.architecture, torch.device("cpu"), graph.pooler is not None, graph.has_mlm_head)


def _load_torch(model_dir: str | os.PathLike, device: str | torch.device | None, quantize: str, dtype: str) -> _Loaded:
    """The model through `bert.loading`, on its device, quantized or in `dtype` (both checked)."""
    ckpt = read_model_checkpoint(model_dir, need_vocab=True)
    architecture = checkpoint_architecture(ckpt, ARCHITECTURES, "this project runs")
    model = build_model(ckpt, architecture)
    if device is None and quantize == "int8":
        device = "cpu"
    resolved = resolve_device(str(device) if device is not None else None)
    runnable = quantize_model(model, quantize, resolved)
    _set_dtype(runnable, dtype, resolved)
    return _Loaded(runnable, ckpt, architecture, resolved, has_pooler(ckpt), has_mlm_head(ckpt))


def _num_labels(model: torch.nn.Module) -> int:
    num_labels = model.num_labels
    assert isinstance(num_labels, int)  # a classifier's outputs (bert.modeling's heads, an ONNX graph's width)
    return num_labels


def _config_of(model: torch.nn.Module) -> BertConfig:
    config = model.config
    assert isinstance(config, BertConfig)  # every model this package loads (bert.modeling's, an ONNX graph) has one
    return config


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
