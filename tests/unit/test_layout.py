"""The package's layout rules, checked by parsing every module's imports (docs/architecture.md says why):

- commands live in `bert.commands`, one module per subcommand of `cli.COMMANDS`; only `bert.cli` and
  commands (a command may run others, as `bert quickstart` does) import `bert.commands`;
- `bert.tasks`, the torch-free layers and every command module never import torch, not even through another
  module (a command imports the library it drives inside its run function);
- `bert.formats` imports nothing of the package above `bert.errors` and `bert.utils`;
- `bert.modeling` imports no command, task, loop or format code (`bert.checkpoint` loads and saves it);
- running a model (`bert.inference`, `bert.serving`) never imports the training loop (`bert.training`) nor the
  other modules of a training run (`TRAINING_MODULES`), which import one another downwards only;
- no import cycle anywhere in `bert`;
- `bert.serving` is imported only by `bert serve`, and its modules import one another downwards only
  (`SERVING_LAYERS`: the route table below the handlers, the handlers below the app);
- no module over 800 lines nor function over 60, but the original's ports and modeling.py (`LONG_MODULES`,
  `LONG_FUNCTIONS`);
- imports sit at the top of a module; an import inside a function is an optional dependency (inside a
  `try` that catches ImportError) or carries a comment saying why it is there.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

from bert import cli
from conftest import REPO

SRC = REPO / "src"
PACKAGE = SRC / "bert"


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


@functools.cache
def _imports(path: Path) -> list[tuple[str, int, bool]]:
    """(imported module, line, inside a function) for every import of a file; `from a import b` yields
    `a.b` when that is a module of the package, else `a`."""
    out = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and isinstance(child.test, ast.Name) and child.test.id == "TYPE_CHECKING":
                continue  # names for annotations only, never imported when the program runs
            inside = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            if isinstance(child, ast.Import):
                out.extend((alias.name, child.lineno, in_function) for alias in child.names)
            elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
                for alias in child.names:
                    full = f"{child.module}.{alias.name}"
                    out.append((full if full in MODULES else child.module, child.lineno, in_function))
            visit(child, inside)

    visit(ast.parse(path.read_text(encoding="utf-8")), False)
    return out


GRAPH = {name: {m for m, _, _ in _imports(path) if m in MODULES and m != name} for name, path in MODULES.items()}
# What importing a module loads: its imports outside functions only.
LOADS = {
    name: {m for m, _, inside in _imports(path) if m in MODULES and m != name and not inside}
    for name, path in MODULES.items()
}


def _reachable(name: str, graph: dict[str, set[str]] = GRAPH) -> set[str]:
    seen, todo = set(), [name]
    while todo:
        for m in graph[todo.pop()]:
            if m not in seen:
                seen.add(m)
                todo.append(m)
    return seen


def _external(name: str) -> set[str]:
    """Top-level names of the packages outside `bert` that loading `name` imports (its module-level imports
    and those of the package modules they load)."""
    out = set()
    for m in {name} | _reachable(name, LOADS):
        out |= {
            imp.split(".")[0] for imp, _, inside in _imports(MODULES[m]) if not imp.startswith("bert") and not inside
        }
    return out


def test_every_command_module_is_in_the_table_and_only_there():
    table = {entry[0] for entry in cli.COMMANDS.values()}
    commands = {m for m in MODULES if m.startswith("bert.commands.")}
    assert table == commands
    for name, (module, args_name, run_name, _) in cli.COMMANDS.items():
        assert module == f"bert.commands.{name.replace('-', '_')}", name


def test_only_the_cli_and_commands_import_commands():
    for name in MODULES:
        if name == "bert.cli" or name.startswith("bert.commands"):
            continue
        assert not {m for m in GRAPH[name] if m.startswith("bert.commands")}, name


def test_no_library_module_defines_a_command():
    # A command is an Args dataclass plus a run function; shared groups of flags are library.
    shared_flag_groups = {
        "FinetuneArgs",
        "PerformanceArgs",
        "TpuCompatArgs",
        "GuardArgs",
        "TrainingArgs",
        "OptimizerArgs",
    }
    shared_flag_groups |= {"ModelArgs", "MaskingArgs", "CorpusArgs", "InferenceArgs", "ShardArgs"}
    shared_flag_groups |= {"TeacherArgs", "DistillArgs"}
    for name, path in MODULES.items():
        if name.startswith("bert.commands"):
            continue
        classes = {n.name for n in ast.parse(path.read_text()).body if isinstance(n, ast.ClassDef)}
        assert not {c for c in classes if c.endswith("Args")} - shared_flag_groups, name


TORCH_FREE = ["bert.tasks", "bert.pretraining.instances", "bert.pretraining.streaming", "bert.pretraining.corpus"]
TORCH_FREE += ["bert.tokenization", "bert.config", "bert.metrics", "bert.utils", "bert.outputs", "bert.formats"]
TORCH_FREE += ["bert.cli"]
TORCH_FREE += ["bert.commands.tokenize", "bert.commands.prepare_corpus", "bert.commands.evaluate_squad"]
TORCH_FREE += ["bert.vocab", "bert.commands.build_vocab"]
TORCH_FREE += ["bert.plotting", "bert.flags", "bert.hub", "bert.input_lines"]
TORCH_FREE += ["bert.batching"]  # which records each step reads: NumPy only
# The rules of a request's options, read by the commands' flags and the server's schemas without a model.
TORCH_FREE += ["bert.request_rules"]
# The --loss choices and their help: the table the runners compute the losses from.
TORCH_FREE += ["bert.sentence.data", "bert.sentence.loss_table"]
# Every command module: bert.cli imports one to parse its flags, so a flag error costs no torch; a command
# imports the library it drives inside its run function.
TORCH_FREE += ["bert.commands"]


@pytest.mark.parametrize("prefix", TORCH_FREE)
def test_torch_free_layers_never_import_torch(prefix):
    for name in MODULES:
        if name == prefix or name.startswith(prefix + "."):
            assert "torch" not in _external(name), name


def test_formats_import_nothing_above_them():
    allowed = {"bert", "bert.errors", "bert.utils"}
    for name in MODULES:
        if name.startswith("bert.formats"):
            above = {m for m in GRAPH[name] if not m.startswith("bert.formats")} - allowed
            assert not above, (name, above)


def test_modeling_imports_no_command_task_loop_or_format():
    assert GRAPH["bert.modeling"] <= {"bert.checkpoint", "bert.config", "bert.cpu_kernels", "bert.errors"}
    # torch and the compiled kernels alone (and the error type): kernels know nothing of the model
    assert GRAPH["bert.cpu_kernels"] == {"bert.csrc"} and GRAPH["bert.csrc"] == {"bert.errors"}


# bert.inference's modules, bottom up: each imports only modules of the package in the layers below it.
INFERENCE_LAYERS = [
    {"bert.inference.common", "bert.inference.st_config"},  # head advice, input checks, task-only settings
    {"bert.inference.core"},  # loading, batching, the tokenizer's calls
    {  # one task each, mixins on the core
        "bert.inference.classification",
        "bert.inference.spans",
        "bert.inference.embeddings",
        "bert.inference.fill_mask",
    },
    {"bert.inference.predictor"},  # Predictor: the core with every task
    {"bert.inference"},
]


def test_inference_modules_import_downwards_and_stay_small():
    layered = set().union(*INFERENCE_LAYERS)
    assert layered == {m for m in MODULES if m == "bert.inference" or m.startswith("bert.inference.")}
    below: set[str] = set()
    for layer in INFERENCE_LAYERS:
        for name in layer:
            assert {m for m in GRAPH[name] if m in layered} <= below, name
        below |= layer
    # Outside the package, only its public face is imported: `from bert.inference import Predictor`.
    importers = {name for name in MODULES if GRAPH[name] & (layered - {"bert.inference"})} - layered
    assert importers == set()
    for name in layered:
        lines = MODULES[name].read_text(encoding="utf-8").count("\n")
        assert lines <= 800, (name, lines)
        for node in ast.walk(ast.parse(MODULES[name].read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef):
                assert node.end_lineno - node.lineno < 60, (
                    f"{name}.{node.name}: {node.end_lineno - node.lineno + 1} lines"
                )


def test_running_a_model_never_loads_the_training_loop():
    """Inference and the server reach the device helpers (`bert.distributed`), not the training loop."""
    for name in ("bert.inference", "bert.serving.app"):
        assert "bert.training" not in _reachable(name), name
        assert not _reachable(name) & set(TRAINING_MODULES), name


# The training run's modules, one job each, and what each may import of the others: the checkpoints and RNG
# states below the loop (`Trainer`) and the run directory, evaluations during training above the loop.
TRAINING_MODULES = {
    "bert.checkpointing": set(),
    "bert.run_dir": {"bert.checkpointing"},
    "bert.training": {"bert.checkpointing"},
    "bert.evaluations": {"bert.checkpointing", "bert.training"},
}


def test_training_modules_import_one_another_downwards():
    for name, allowed in TRAINING_MODULES.items():
        assert GRAPH[name] & set(TRAINING_MODULES) <= allowed, name


# bert.serving's modules, bottom up: each imports only modules of the package in the layers below it.
SERVING_LAYERS = [
    {"bert.serving.settings", "bert.serving.responses", "bert.serving.metrics"},
    {"bert.serving.errors"},
    {"bert.serving.schemas"},  # the route table: fields, answers, the models each route serves
    {"bert.serving.openapi", "bert.serving.checks", "bert.serving.batcher"},
    {"bert.serving.routes"},  # one handler per route
    {"bert.serving.app"},  # create_app: the checks every request goes through
    {"bert.serving"},
]


def test_serving_modules_import_downwards_and_only_bert_serve_imports_them():
    layered = set().union(*SERVING_LAYERS)
    assert layered == {m for m in MODULES if m == "bert.serving" or m.startswith("bert.serving.")}
    below: set[str] = set()
    for layer in SERVING_LAYERS:
        for name in layer:
            assert {m for m in GRAPH[name] if m in layered} <= below, name
        below |= layer
    importers = {name for name in MODULES if GRAPH[name] & layered} - layered
    assert importers == {"bert.commands.serve"}


def test_no_import_cycle():
    for name in MODULES:
        assert name not in _reachable(name), name


def test_imports_inside_functions_are_optional_or_explained():
    for name, path in MODULES.items():
        lines = path.read_text(encoding="utf-8").splitlines()
        tree = ast.parse("\n".join(lines))
        optional = set()  # lines of imports inside `try: ... except ImportError`
        for node in ast.walk(tree):
            if isinstance(node, ast.Try) and any(
                isinstance(h.type, ast.Name) and h.type.id in ("ImportError", "ModuleNotFoundError")
                for h in node.handlers
            ):
                optional |= {n.lineno for n in ast.walk(node) if isinstance(n, (ast.Import, ast.ImportFrom))}
        for module, line, in_function in _imports(path):
            if in_function and line not in optional:
                # The comment may head a run of such imports.
                above = line - 2
                while not lines[above].strip() or lines[above].strip().startswith(("from ", "import ")):
                    above -= 1
                explained = "#" in lines[line - 1] or lines[above].strip().startswith("#")
                assert explained, f"{path.relative_to(REPO)}:{line}: import {module} inside a function, unexplained"


def test_saved_models_are_built_by_the_one_loader():
    """`bert.loading` is in the model layer (it builds `bert.modeling` classes from `bert.checkpoint`'s
    weights), and inference, export and the training runs' starting model build through it; a model built
    uninitialised and filled from weights is `bert.checkpoint`'s alone (`from_pretrained`'s too)."""
    assert GRAPH["bert.loading"] <= {"bert.checkpoint", "bert.config", "bert.errors", "bert.modeling"}
    for name in ("bert.inference", "bert.export", "bert.starting_model"):
        assert "bert.loading" in _reachable(name), name
    builders = {name for name, path in MODULES.items() if "_without_init(" in path.read_text(encoding="utf-8")}
    assert builders == {"bert.checkpoint"}  # a model built uninitialised and filled from weights: here only


# Modules over 800 lines and functions over 60: the original's ports only, which keep its functions' shape
# (run_squad.py's, tokenization.py's, create_pretraining_data.py's and the NER feature conversion after
# run_classifier.py's), and modeling.py, the model alone.
LONG_MODULES = {"bert.tasks.squad", "bert.tokenization", "bert.modeling"}
LONG_FUNCTIONS = {
    "bert.tasks.squad": {
        "_paragraph_examples",
        "_training_answer",
        "iter_features",
        "get_final_text",
        "compute_predictions",
    },
    "bert.tasks.ner": {"convert_ner_examples_to_features"},
    "bert.pretraining.instances": {"create_instances_from_document"},
}


def test_modules_and_functions_stay_small_but_the_ports():
    big, long = [], []
    for name, path in MODULES.items():
        text = path.read_text(encoding="utf-8")
        if text.count("\n") > 800 and name not in LONG_MODULES:
            big.append(f"{name}: {text.count(chr(10))} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > 60 and node.name not in LONG_FUNCTIONS.get(name, set()):
                    long.append(f"{name}.{node.name}: {lines} lines")
    assert not big, big
    assert not long, long
