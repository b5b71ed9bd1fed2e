"""The model a training run starts from, resolved and checked before anything is written.

Fine-tuning and pre-training start the same way (run_classifier.py and run_pretraining.py `main`): the
run resumes from the newest checkpoint of `--output_dir` when there is one (`--init_checkpoint` is then
ignored), else starts from `--init_checkpoint`, else from random weights. `--vocab_file` and
`--bert_config_file` left out come from beside the checkpoint the run starts from; a shape's name takes
its `vocab_size` from the vocabulary (or, for pre-training without one, from the data's manifests). The
config is checked against the vocabulary and `--max_seq_length` (`BertConfig.check_max_seq_length`, the rule
inference reads a model's length with), the casing against the checkpoint's name and saved tokenizer
settings, and a checkpoint to resume against the config. A vocabulary taken from the checkpoint being resumed
is read at the start only: the `Trainer` keeps its bytes for every later checkpoint and the export, since
`--keep_checkpoint_max` may remove that checkpoint before the run ends.

With `--init_from_teacher_layers` (`bert.flags.TeacherArgs`) the run starts instead from some of
`--teacher`'s blocks (`bert.distillation.student_from_teacher_layers`): the teacher's config with that many
layers, its vocabulary and tokenizer settings, and its weights for everything else, so every command that
starts here (fine-tuning, pre-training, the sentence runners) can begin as DistilBERT does.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from bert.checkpoint import Checkpoint, Model, build_loaded, read_checkpoint
from bert.checkpointing import CHECKPOINT_PREFIX, check_checkpoint_config, latest_checkpoint, load_training_state
from bert.config import BertConfig, resolve_config
from bert.distillation import student_from_teacher_layers
from bert.errors import InputError
from bert.flags import LAYERS_FLAG, SHAPE_NAMES, DistillArgs, TeacherArgs
from bert.loading import read_model_checkpoint
from bert.tokenization import load_vocab, validate_case_matches_checkpoint

logger = logging.getLogger(__name__)


class StartingFlags(Protocol):
    """The flags the start of a run reads: `flags.TrainingArgs`' and `flags.ModelArgs`' (`bert pretrain` declares
    the model flags one by one, hence a protocol and not a class)."""

    @property
    def output_dir(self) -> str: ...
    @property
    def do_train(self) -> bool: ...
    @property
    def ignore_checkpoint_digest(self) -> bool: ...
    @property
    def init_checkpoint(self) -> str | None: ...
    @property
    def bert_config_file(self) -> str | None: ...
    @property
    def vocab_file(self) -> str | None: ...
    @property
    def max_seq_length(self) -> int: ...


@dataclass
class StartingModel:
    config: BertConfig
    vocab_file: str | None
    vocab: dict[str, int] | None
    resume_dir: Path | None  # the newest checkpoint of --output_dir: the run resumes from it
    init: Checkpoint | None  # --init_checkpoint, read; None when resuming or when none was given

    def build(
        self, model_class: type[Model], args: StartingFlags, exported: Path, state_name: str, **kwargs: Any
    ) -> tuple[Model, int, dict[str, Any] | None]:
        """`model_class(self.config, **kwargs)` with the weights the run `args` (`--do_train`, `--init_checkpoint`,
        `--ignore_checkpoint_digest`) continues from; returns it, the step those weights come from and the
        training state to resume (None unless training resumes).

        Training resumes from the newest checkpoint, else starts from --init_checkpoint, else from random
        weights; evaluation alone uses the model a finished training exported to `exported` (its step in
        `exported/state_name`), else the newest checkpoint. Only weights none of these give are drawn at random
        (`bert.checkpoint.build_loaded`).
        """
        verify = not args.ignore_checkpoint_digest
        state = None
        global_step = 0
        ckpt = self.init
        if not args.do_train and (exported / "config.json").is_file():
            logger.info("evaluating the model in %s", exported)
            ckpt = read_checkpoint(exported, verify=verify)
            state_file = exported / state_name
            if state_file.is_file():
                global_step = int(json.loads(state_file.read_text(encoding="utf-8")).get("global_step", 0))
        elif self.resume_dir is not None:
            ignored = " (--init_checkpoint is ignored)" if args.init_checkpoint else ""
            logger.info("resuming from %s%s", self.resume_dir, ignored)
            ckpt = read_checkpoint(self.resume_dir, verify=verify)
            global_step = int(self.resume_dir.name[len(CHECKPOINT_PREFIX) :])
            if args.do_train:
                state = load_training_state(self.resume_dir, verify=verify)
        elif ckpt is None:
            logger.warning("no --init_checkpoint: the model starts from random weights")
        self.init = None  # the weights are in the model now
        model = (
            model_class(self.config, **kwargs)
            if ckpt is None
            else build_loaded(model_class, self.config, ckpt, **kwargs)
        )
        return model, global_step, state


def resolve_starting_model(
    args: StartingFlags,
    *,
    need_vocab: bool = True,
    do_lower_case: bool | None = None,
    open_data: Callable[[str | None], Iterable[int]] | None = None,
) -> StartingModel:
    """Resolve and check the model `args` (ModelArgs' flags, `--output_dir`, `--ignore_checkpoint_digest`)
    start from.

    need_vocab: a missing vocabulary is an error (pre-training on static records needs none).
    do_lower_case: the run's casing, checked against the checkpoint; None when the run does not tokenize.
    open_data: opens the run's data with the resolved vocabulary file (checking them against each other) and
        returns the `vocab_size`s the data records, for a shape's name when there is no vocabulary.
    """
    verify = not args.ignore_checkpoint_digest
    resume_dir = latest_checkpoint(args.output_dir)
    teacher_layers = _check_teacher_flags(args)
    if do_lower_case is not None:
        validate_case_matches_checkpoint(do_lower_case, args.init_checkpoint)
    init = read_checkpoint(args.init_checkpoint, verify=verify) if args.init_checkpoint and not resume_dir else None
    init_flag = f"--init_checkpoint={args.init_checkpoint}"
    if teacher_layers is not None and not resume_dir:
        init = _from_teacher_layers(*teacher_layers, verify)
        init_flag = f"--teacher={teacher_layers[0]}"
    source = init
    if resume_dir is not None and not (args.bert_config_file and args.vocab_file):
        source = read_checkpoint(resume_dir, verify=verify)

    vocab_file = args.vocab_file or (source.vocab_file if source is not None else None)
    if need_vocab and not vocab_file:
        raise InputError("no vocabulary: pass --vocab_file=PATH (or an --init_checkpoint with a vocab.txt beside it)")
    if vocab_file and not os.path.isfile(vocab_file):
        raise InputError(f"--vocab_file={vocab_file}: no such file")
    vocab = load_vocab(vocab_file) if vocab_file else None
    vocab_entries = max(vocab.values()) + 1 if vocab else None
    data_vocab_sizes = set(open_data(vocab_file)) if open_data is not None else set()

    config = _config(args.bert_config_file, source, vocab_entries, data_vocab_sizes)
    if vocab_entries is not None and vocab_file:
        config.validate_vocab(vocab_entries, vocab_file)
    config.check_max_seq_length(args.max_seq_length, "--max_seq_length")
    if do_lower_case is not None and init is not None:
        saved = init.tokenizer_settings.get("do_lower_case")
        if saved is not None and bool(saved) != do_lower_case:
            raise InputError(
                f"--do_lower_case={do_lower_case} does not match {init_flag}, "
                f"whose tokenizer_config.json says do_lower_case={bool(saved)}; pass --do_lower_case={bool(saved)}"
            )
    if resume_dir is not None:
        check_checkpoint_config(resume_dir, config)
    return StartingModel(config, vocab_file, vocab, resume_dir, init)


def _check_teacher_flags(args: StartingFlags) -> tuple[str, list[int]] | None:
    """The teacher flags of a command that takes them (`TeacherArgs`; `DistillArgs` where it distils): checked
    here, where every training command resolves its model; returns --teacher with --init_from_teacher_layers'
    indices (None without them)."""
    if not isinstance(args, TeacherArgs):
        return None
    init_checkpoint, bert_config_file = args.init_checkpoint, args.bert_config_file
    if isinstance(args, DistillArgs):
        args.check_distill_flags(init_checkpoint)
    else:
        args.check_teacher_flags(init_checkpoint)
        if args.teacher is not None and args.init_from_teacher_layers is None and not args.distils:
            raise InputError(
                f"--teacher={args.teacher}: this command takes a teacher only to start from its layers; add "
                f"{LAYERS_FLAG}=0,2,... or drop --teacher"
            )
    layers = args.teacher_layers()
    if layers is None:
        return None
    assert args.teacher is not None  # check_teacher_flags: the layers need a teacher
    if bert_config_file:
        raise InputError(
            f"{LAYERS_FLAG}: the student's config is --teacher's with {len(layers)} layers; drop "
            f"--bert_config_file={bert_config_file}"
        )
    return args.teacher, layers


def _from_teacher_layers(teacher: str, layers: list[int], verify: bool) -> Checkpoint:
    """The checkpoint of a student made of `layers` of `teacher` (see the module docstring)."""
    ckpt = read_model_checkpoint(teacher, verify=verify, name=f"--teacher={teacher}")
    assert ckpt.config is not None  # read_model_checkpoint refuses weights without one
    config, state = student_from_teacher_layers(ckpt.state_dict, ckpt.config, layers)
    logger.info("starting from layers %s of the teacher %s", ",".join(map(str, layers)), teacher)
    source = f"{teacher} ({LAYERS_FLAG}={','.join(map(str, layers))})"
    return Checkpoint(state, source, ckpt.format, config, ckpt.vocab_file, dict(ckpt.tokenizer_settings))


def _config(
    bert_config_file: str | None, source: Checkpoint | None, vocab_entries: int | None, data_vocab_sizes: set[int]
) -> BertConfig:
    """--bert_config_file (a file, or a shape's name sized by the vocabulary or else by the data), else the
    config beside the checkpoint the run starts from."""
    if bert_config_file:
        vocab_size = vocab_entries
        if vocab_size is None and not os.path.exists(bert_config_file):
            if len(data_vocab_sizes) != 1:
                raise InputError(
                    f"--bert_config_file={bert_config_file} names a shape, so its vocab_size comes from the "
                    "vocab: pass --vocab_file=PATH"
                )
            vocab_size = data_vocab_sizes.pop()
        return resolve_config(bert_config_file, vocab_size)
    if source is not None and source.config is not None:
        return source.config
    raise InputError(
        f"no model config: pass --bert_config_file=PATH or a shape ({SHAPE_NAMES}), or an --init_checkpoint "
        "with a config beside it"
    )
