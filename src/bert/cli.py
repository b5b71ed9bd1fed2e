"""The `bert` command line: a table of subcommands, each a job-args dataclass and a run function.

Flags are generated from the dataclass fields, so a flag's help text lives once, next to its field
(`field(metadata={"help": ...})`). Flag names and defaults are the original scripts' own, so
`python run_classifier.py --task_name=MRPC ...` ports as `bert classify --task_name=MRPC ...`.
Booleans accept `--flag`, `--flag=true/false`, `--flag true` and absl's `--noflag`.

The terminal shows progress bars, results, warnings and errors; the INFO log (the original's example
dumps included) goes to the log file of the command's output (`log.txt` in an output directory), and to
the terminal too with `--verbose` (`bert --verbose COMMAND ...` or `bert COMMAND --verbose ...`).

Nothing imports this module: every command runs from Python through its run function.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import difflib
import importlib
import logging
import os
import re
import sys
import types
import typing
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from tqdm import tqdm

from bert import __version__
from bert.errors import InputError
from bert.flags import check_flag_values
from bert.grid import list_type
from bert.hub import resolve_model_flags
from bert.outputs import os_error_message
from bert.utils import LOG_FORMAT

# name -> (module, args class, run function, one-line description). Modules are imported lazily so that
# `bert tokenize` never pays for importing torch.
COMMANDS: dict[str, tuple[str, str, str, str]] = {
    "quickstart": (
        "bert.commands.quickstart",
        "QuickstartArgs",
        "run_quickstart",
        "the whole pipeline on built-in data in minutes: pre-train a tiny BERT, fine-tune, evaluate",
    ),
    "tokenize": (
        "bert.commands.tokenize",
        "TokenizeArgs",
        "run_tokenize",
        "text or JSON lines -> WordPiece tokens and ids",
    ),
    "build-vocab": (
        "bert.commands.build_vocab",
        "BuildVocabArgs",
        "run_build_vocab",
        "learn a WordPiece vocab.txt from a corpus (for pre-training on one's own domain)",
    ),
    "create-pretraining-data": (
        "bert.commands.create_pretraining_data",
        "CreatePretrainingDataArgs",
        "run_create_pretraining_data",
        "text documents -> masked-LM/next-sentence instances as TFRecord or native shards",
    ),
    "prepare-corpus": (
        "bert.commands.prepare_corpus",
        "PrepareCorpusArgs",
        "run_prepare_corpus",
        "raw books (plain or .gz) -> one sentence per line, blank line between documents",
    ),
    "pretrain": (
        "bert.commands.pretrain",
        "PretrainArgs",
        "run_pretrain",
        "masked-LM and next-sentence pre-training (run_pretraining.py)",
    ),
    "classify": (
        "bert.commands.classify",
        "ClassifyArgs",
        "run_classify",
        "sentence (pair) classification and regression: GLUE, XNLI, own files (run_classifier.py)",
    ),
    "train-embeddings": (
        "bert.commands.train_embeddings",
        "TrainEmbeddingsArgs",
        "run_train_embeddings",
        "train a sentence-embedding model (bi-encoder): MNRL, CoSENT, Matryoshka; sentence-transformers output",
    ),
    "train-reranker": (
        "bert.commands.train_reranker",
        "TrainRerankerArgs",
        "run_train_reranker",
        "train a reranker (cross-encoder) on queries with positives and (mined) negatives",
    ),
    "ner": (
        "bert.commands.ner",
        "NerArgs",
        "run_ner",
        "named-entity recognition on CoNLL-2003 files (token classification)",
    ),
    "squad": (
        "bert.commands.squad",
        "SquadArgs",
        "run_squad",
        "question answering on SQuAD v1.1/v2.0, with the official evaluation (run_squad.py)",
    ),
    "swag": (
        "bert.commands.swag",
        "SwagArgs",
        "run_swag",
        "multiple choice on SWAG files",
    ),
    "extract-features": (
        "bert.commands.extract_features",
        "ExtractFeaturesArgs",
        "run_extract_features",
        "fixed contextual features per token, as JSON lines (extract_features.py)",
    ),
    "predict": (
        "bert.commands.predict",
        "PredictArgs",
        "run_predict",
        "a fine-tuned model on raw text: labels, entities, answers or choices as JSON lines",
    ),
    "embed": (
        "bert.commands.embed",
        "EmbedArgs",
        "run_embed",
        "one vector per line (cls/mean/max/pooler pooling; sentence-transformers models), .npy or JSON lines",
    ),
    "rerank": (
        "bert.commands.rerank",
        "RerankArgs",
        "run_rerank",
        "documents sorted by relevance to a query (a cross-encoder, or an embedding model's cosine)",
    ),
    "search": (
        "bert.commands.search",
        "SearchArgs",
        "run_search",
        "the top-k documents of a corpus for each query, by embedding similarity (exact in chunks, or a FAISS index)",
    ),
    "index": (
        "bert.commands.index",
        "IndexArgs",
        "run_index",
        "a FAISS index (flat, ivf_flat, ivf_pq, hnsw) of bert embed's vectors, for bert search --index",
    ),
    "fill-mask": (
        "bert.commands.fill_mask",
        "FillMaskArgs",
        "run_fill_mask",
        "the likeliest tokens at each [MASK], from the pre-training masked-LM head",
    ),
    "serve": (
        "bert.commands.serve",
        "ServeArgs",
        "run_serve",
        "a model behind HTTP: TEI's /embed and /predict, OpenAI's /v1/embeddings, /ner, /qa, /fill-mask, batched",
    ),
    "convert": (
        "bert.commands.convert",
        "ConvertArgs",
        "run_convert",
        "convert a checkpoint between TF, HF and native formats",
    ),
    "export": (
        "bert.commands.export",
        "ExportArgs",
        "run_export",
        "a model directory -> ONNX or TorchScript (optionally int8), checked against the eager model",
    ),
    "evaluate-squad": (
        "bert.commands.evaluate_squad",
        "EvaluateSquadArgs",
        "run_evaluate_squad",
        "score SQuAD predictions with the official v1.1/v2.0 evaluation",
    ),
    "plot": (
        "bert.commands.plot",
        "PlotArgs",
        "run_plot",
        "training curves of one or more runs on the same axes (curves.png)",
    ),
    "env": (
        "bert.commands.env",
        "EnvArgs",
        "run_env",
        "versions, threads, devices and optional extras, for bug reports",
    ),
}

VERBOSE_HELP = "Also print the INFO log (what the command's log file holds) on the terminal."

_TRUE = {"true", "t", "1", "yes", "y"}
_FALSE = {"false", "f", "0", "no", "n"}


def parse_bool(value: str | bool) -> bool:
    """The original's boolean spelling: true/false in any case, also 1/0 and yes/no."""
    if isinstance(value, bool):
        return value
    v = value.strip().lower()
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {value!r}")


class _OneLineParser(argparse.ArgumentParser):
    """argparse that reports a bad command line in one line and exits 2, like every other input error."""

    def error(self, message: str) -> typing.NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def _field_type(field: dataclasses.Field, hints: dict) -> tuple[type, bool]:
    """(scalar type, optional) for a dataclass field annotated `T`, `T | None` or `list[T]` (one or more)."""
    tp = hints[field.name]
    if typing.get_origin(tp) is list:
        return typing.get_args(tp)[0], False
    optional = False
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        optional = len(args) < len(typing.get_args(tp))
        tp = args[0]
    return tp, optional


def _group(parser: argparse.ArgumentParser, groups: dict, args_cls: type, name: str) -> Any:
    """Where `--help` lists flag `name`: under the command's own flags, or under the shared group (a base
    class of `args_cls`, see `bert.flags`) that defines it, titled with the group's docstring."""
    owner = next(c for c in args_cls.__mro__ if name in c.__dict__.get("__annotations__", {}))
    if owner is args_cls:
        return parser
    if owner not in groups:
        title = (owner.__doc__ or owner.__name__).strip().split("\n")[0].rstrip(".:")
        groups[owner] = parser.add_argument_group(title)
    return groups[owner]


def _help_text(f: dataclasses.Field, has_default: bool, default: Any) -> str:
    """A flag's help: its field's, with its default and, for a model, the Hub ids it also takes."""
    help_text = f.metadata.get("help", "")
    # A None default means "unset"; where unset does something, the help text says what.
    if has_default and default is not None:
        help_text += f" (default: {default})"
    if f.metadata.get("model"):
        help_text += " Or a Hugging Face Hub id, org/name[@revision], read from the Hugging Face cache (bert.hub)."
    return help_text


def add_dataclass_flags(parser: argparse.ArgumentParser, args_cls: type) -> None:
    """Add one `--name` flag per field of `args_cls`; fields without a default are required. Flags of
    shared groups (base classes) are listed under their group's title in `--help`.

    Field metadata: "help" (the help text), "choices", "positional" for a positional argument (one or more
    values for a `list[T]` field), "flag" for an extra spelling of the flag (e.g. "--na-prob-file", an
    official script's own), "grid" for a flag that also takes a comma list (`bert.grid`), and "model" for a flag
    naming a model, which also takes a Hub id (`bert.hub`).
    """
    hints = typing.get_type_hints(args_cls)
    groups: dict[type, argparse._ArgumentGroup] = {}
    for f in dataclasses.fields(args_cls):
        if f.metadata.get("cli") is False:
            continue
        target = _group(parser, groups, args_cls, f.name)
        tp, _ = _field_type(f, hints)
        has_default = f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
        default = f.default if f.default is not dataclasses.MISSING else None
        help_text = _help_text(f, has_default, default)
        flag = f"--{f.name}"
        if f.metadata.get("positional"):
            many = typing.get_origin(hints[f.name]) is list
            target.add_argument(
                f.name,
                type=tp,
                nargs="+" if many else None if not has_default else "?",
                default=default,
                metavar=f.name.upper(),
                help=help_text,
            )
        elif tp is bool:
            target.add_argument(
                flag,
                type=parse_bool,
                nargs="?",
                const=True,
                default=default,
                metavar="true|false",
                help=help_text,
            )
            # absl's negative form, e.g. --nodo_lower_case.
            target.add_argument(f"--no{f.name}", dest=f.name, action="store_false", help=argparse.SUPPRESS)
        else:
            choices = f.metadata.get("choices")
            flags = [f.metadata["flag"], flag] if "flag" in f.metadata else [flag]
            parse: Callable[[str], Any] = tp
            if f.metadata.get("grid"):
                parse = list_type(tp)
                help_text += " A comma list runs a grid of runs, one per combination (see --grid_jobs)."
            target.add_argument(
                *flags,
                dest=f.name,
                type=parse,
                default=default,
                required=not has_default,
                choices=choices,
                help=help_text,
            )


def _usage(name: str, args_cls: type) -> str:
    """`bert NAME POSITIONAL... --required=... [--flag=value ...]`: the full list is in --help, by group."""
    parts = [f"bert {name}"]
    for f in dataclasses.fields(args_cls):
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        if f.metadata.get("cli") is False or not required:
            continue
        parts.append(f"{f.name.upper()}..." if f.metadata.get("positional") else f"--{f.name}={f.name.upper()}")
    return " ".join([*parts, "[--flag=value ...]"])


def _command_parser(name: str, args_cls: type, parser: _OneLineParser | None = None) -> _OneLineParser:
    parser = parser or _OneLineParser(prog=f"bert {name}")
    parser.usage = _usage(name, args_cls)
    add_dataclass_flags(parser, args_cls)
    parser.add_argument("--verbose", action="store_true", help=VERBOSE_HELP)
    return parser


def _did_you_mean(name: str, choices: Sequence[str]) -> str:
    """ "; did you mean X?" (or "X or Y"), for a misspelled command or flag; empty when nothing is close."""
    close = difflib.get_close_matches(name, choices, n=3, cutoff=0.75)
    return f"; did you mean {' or '.join(close)}?" if close else ""


def _check_flag_names(parser: argparse.ArgumentParser, argv: Sequence[str]) -> None:
    """Name an unknown flag, with the closest real ones, before argparse would report something else first
    (a required flag the typo was meant to be: `--task_nme=MRPC` is "unknown flag --task_nme; did you mean
    --task_name?", not "the following arguments are required: --task_name")."""
    known = [o for action in parser._actions for o in action.option_strings]
    for arg in argv:
        if arg == "--":
            break
        name = arg.split("=", 1)[0]
        if not name.startswith("--") or any(o.startswith(name) for o in known):
            continue
        listed = [o for o in known if not o.startswith("--no") or "--" + o[4:] not in known]
        parser.error(f"unknown flag {name}{_did_you_mean(name, listed)}")


def build_parser() -> argparse.ArgumentParser:
    parser = _OneLineParser(prog="bert", description="BERT in PyTorch, with the original's commands and flags.")
    parser.add_argument("--version", action="version", version=f"bert {__version__}")
    parser.add_argument("--verbose", action="store_true", help=VERBOSE_HELP)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_OneLineParser)
    for name, (module, args_name, _, description) in COMMANDS.items():
        args_cls = getattr(importlib.import_module(module), args_name)
        p = sub.add_parser(name, help=description, description=(args_cls.__doc__ or description).strip())
        _command_parser(name, args_cls, p)
    return parser


def _resolve(name: str) -> tuple[type, Callable]:
    module, args_name, run_name, _ = COMMANDS[name]
    mod = importlib.import_module(module)
    return getattr(mod, args_name), getattr(mod, run_name)


_NEGATIVE_VALUE = re.compile(r"^-\d[\d.,\s-]*$")


def _attach_negative_values(argv: list[str]) -> list[str]:
    """`--layers -1,-2` -> `--layers=-1,-2`: argparse would take "-1,-2" for an option."""
    out: list[str] = []
    for arg in argv:
        if out and _NEGATIVE_VALUE.match(arg) and out[-1].startswith("--") and "=" not in out[-1]:
            out[-1] = f"{out[-1]}={arg}"
        else:
            out.append(arg)
    return out


class _TerminalHandler(logging.StreamHandler):
    """Log records on stderr above the progress bars (tqdm.write clears a bar and redraws it below)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            tqdm.write(self.format(record), file=self.stream)
        except Exception:
            self.handleError(record)


@contextlib.contextmanager
def terminal_logging(verbose: bool) -> Iterator[None]:
    """The terminal's share of the log while a command runs: warnings and errors, everything with
    `verbose`. (The log files of the commands' outputs get the INFO messages either way.)"""
    root = logging.getLogger()
    handler = _TerminalHandler(sys.stderr)
    handler.setLevel(logging.INFO if verbose else logging.WARNING)
    handler.setFormatter(logging.Formatter(LOG_FORMAT if verbose else "%(levelname)s: %(message)s"))
    level = root.level
    root.addHandler(handler)
    if verbose:
        root.setLevel(logging.INFO)
    try:
        yield
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


def _leave_process_group_behind(code: int) -> None:
    """End a torchrun worker that joined a process group here, with its command's exit code, skipping the
    interpreter's and the C++ runtime's teardown: destroying gloo's process group at exit can abort a process
    whose work is done and saved ("terminate called without an active exception", SIGABRT, seen on the
    restarted rank of an elastic run), and torchrun then reports the whole run failed. Every file is written
    and closed by then; the log handlers and standard streams are flushed first."""
    distributed = sys.modules.get("bert.distributed")  # only a process that ran a training command has a group
    if distributed is None or not distributed.holds_process_group():
        return
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main(argv: Sequence[str] | None = None) -> int:
    code = _main(argv)
    _leave_process_group_behind(code)
    return code


def _main(argv: Sequence[str] | None = None) -> int:
    argv = _attach_negative_values(list(sys.argv[1:] if argv is None else argv))
    verbose = False
    while argv and argv[0] in ("--verbose", "--version"):
        if argv[0] == "--version":
            print(f"bert {__version__}")
            return 0
        verbose = True
        argv = argv[1:]
    if argv and not argv[0].startswith("-") and argv[0] not in COMMANDS:
        # Before any command's module is imported: a typo costs no more than starting Python.
        print(
            f"bert: error: unknown command {argv[0]!r}{_did_you_mean(argv[0], list(COMMANDS))} (see 'bert --help')",
            file=sys.stderr,
        )
        return 2
    if argv and argv[0] in COMMANDS and not any(a in ("-h", "--help") for a in argv):
        # Build only the parser of the command being run; its module imports torch only when it runs.
        args_cls, run = _resolve(argv[0])
        command_parser = _command_parser(argv[0], args_cls)
        _check_flag_names(command_parser, argv[1:])
        ns = vars(command_parser.parse_args(argv[1:]))
    else:
        parser = build_parser()
        ns = vars(parser.parse_args(argv))
        if ns["command"] is None:
            parser.print_help()
            return 2
        args_cls, run = _resolve(ns.pop("command"))
    verbose = ns.pop("verbose") or verbose
    args = args_cls(**ns)
    with terminal_logging(verbose):
        try:
            check_flag_values(args)
            args = resolve_model_flags(args)
            run(args)
        except InputError as e:
            print(f"bert {argv[0]}: error: {_one_line(str(e))}", file=sys.stderr)
            return 2
        except OSError as e:
            # A full disk, a read-only file system, a path of the wrong kind: the environment, not a bug, so
            # one line naming the path, its flag and the fix (the traceback goes to the debug log).
            logging.getLogger("bert").debug("OSError", exc_info=True)
            print(f"bert {argv[0]}: error: {_one_line(os_error_message(e, args))}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            return 130
    return 0


def _one_line(message: str) -> str:
    """An error message kept to its one line: a line break inside it (a file name may hold one) is escaped."""
    return message.replace("\r", "\\r").replace("\n", "\\n")


if __name__ == "__main__":
    sys.exit(main())
