"""README.md is tested: every command recipe in it runs, and the "From Python" snippet runs as written.

The recipes are the lines of README.md's ```bash blocks (continuation lines joined). They run in README
order in one working directory, as a reader would run them, so a recipe may use what an earlier one wrote
(`bert pretrain` reads the `tf_examples.tfrecord` of `bert create-pretraining-data`, `bert evaluate-squad`
the predictions of `bert squad`, `bert plot` the quickstart's runs). The variables are the original
README's, on small substitutes:

- `$BERT_BASE_DIR` (`uncased_L-12_H-768_A-12/`) and `$BERT_CASED_DIR` are the tiny checkpoint the
  original TensorFlow code wrote (`bert/data/demo`: 2 layers, hidden 32, 64 positions, 99 tokens);
- `$GLUE_DIR/MRPC`, `$GLUE_DIR/STS-B`, `retrieval/squad-dev` (BEIR, a few documents a split), `$SQUAD_DIR`
  (train and dev files, cut from SQuAD 2.0 dev), `conll2003/`, `swagaf/data/`, `corpus/`,
  `sample_text.txt`, `input.txt`: a few rows of the real data (SWAG: the hand-written fixtures).

Work is cut by appending flags (the last value of a flag wins): `CUTS`, to every command that has the
flag, and `COMMAND_CUTS`. So the recipe of a new command runs here with no change to this file, and a
README change that breaks a recipe fails this test. A recipe that needs another input gets it in
`workdir` below. `pip install` and `python -m pytest` steps are not recipes. Each recipe must end with
exit code 0, no error line, and at most 40 lines on the terminal (progress bars, results, warnings).
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import bert
from bert import cli
from conftest import FIXTURES, REPO, shared_path

README = REPO / "README.md"
DEMO = Path(bert.__file__).parent / "data" / "demo"

# flag -> value appended to every recipe whose command has the flag.
CUTS = {
    "max_seq_length": "64",  # the tiny checkpoint has 64 positions
    "max_query_length": "16",  # SQuAD windows within 64 tokens
    "doc_stride": "32",
    "dupe_factor": "1",
    "num_train_steps": "2",
    "num_warmup_steps": "1",
    "max_eval_steps": "2",
    "num_train_epochs": "1",
    "train_batch_size": "4",  # the 4 SWAG fixture examples make one step
    "layers": "-1,-2",  # the tiny checkpoint has 2 layers
}
# A grid flag's comma list keeps its first values: still a grid of cells, fewer of them (tests/e2e/test_grid.py
# runs the grid itself).
GRID_CELLS = 2
# command -> {flag: value}, where a command's own scale needs its own cut.
COMMAND_CUTS = {"quickstart": {"pretrain_steps": "4", "num_train_epochs": "0.1"}}
MAX_TERMINAL_LINES = 40


def _blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", README.read_text(encoding="utf-8"), flags=re.M | re.S)


def recipes() -> list[str]:
    """The command lines of the README's bash blocks: continuation lines joined, `&&` chains split,
    install and test steps dropped."""
    out = []
    for block in _blocks("bash"):
        for line in block.replace("\\\n", " ").splitlines():
            for step in line.split("&&"):
                step = step.strip()
                if step and not step.startswith(("pip install", "python -m pytest")):
                    out.append(step)
    return out


ASSIGNMENT = re.compile(r"^([A-Z_]+)=\$\((.*)\)$")  # NAME=$(command): a variable later recipes use
SHELL_VARS: dict[str, str] = {}  # the values the assignment recipes gave, for the recipes after them


def _command(recipe: str) -> str:
    """The subcommand a recipe runs (in a pipeline, the last step's); "=" for an assignment."""
    if ASSIGNMENT.match(recipe):
        return "="
    return shlex.split(recipe.split("|")[-1], comments=True)[1]


RECIPES = recipes()


def cost_rows() -> list[list[str]]:
    """The cells of each row of the README's cost table (the section "What each recipe costs")."""
    section = README.read_text(encoding="utf-8").split("### What each recipe costs", 1)[1].splitlines()
    start = next(i for i, line in enumerate(section) if line.startswith("|"))
    end = next((i for i in range(start, len(section)) if not section[i].startswith("|")), len(section))
    return [[c.strip() for c in line.strip("|").split("|")] for line in section[start + 2 : end]]


def shortened() -> list[tuple[str, str]]:
    """(recipe, its shortened form) for each row of the cost table that gives one: the row names the recipe
    by what it writes (`(`mrpc_output/`)`), and its flags are appended to it (the last value of a flag wins)."""
    out = []
    for cells in cost_rows():
        written, flags = re.search(r"\(`([^`]+)`\)", cells[0]), re.fullmatch(r"`(--.*)`", cells[3])
        if written and flags:
            recipe = next(r for r in RECIPES if re.search(rf"[= ]{re.escape(written.group(1))}( |$)", r))
            out.append((recipe, f"{recipe.split(' #')[0]} {flags.group(1)}"))
    return out


SHORTENED = shortened()


def test_the_readme_has_recipes_for_every_command():
    commands = {_command(r) for r in RECIPES} - {"="}
    assert commands == set(cli.COMMANDS), "every command has a recipe in README.md, and only commands do"


def _lines_of(path: Path, n: int) -> str:
    return "".join(path.read_text(encoding="utf-8").splitlines(keepends=True)[:n])


def _squad_slice(dev: dict, first: int, count: int) -> dict:
    """`count` paragraphs of SQuAD 2.0 dev from the `first`, with their questions."""
    paragraphs = [p for article in dev["data"] for p in article["paragraphs"]][first : first + count]
    return {"version": dev["version"], "data": [{"title": "slice", "paragraphs": paragraphs}]}


def _classification_data(work: Path, sentences: int) -> None:
    """`reviews/` (long texts, one label) and `topics/` (several labels a row) in the generic layout: the first
    `sentences` of SST-2 dev joined in fours so that they need several windows (half the rows train, a quarter
    dev, a quarter test), and keyword topics."""
    lines = _lines_of(shared_path("data", "glue", "SST-2", "dev.tsv"), sentences + 1).splitlines()
    sst = [line.split("\t") for line in lines]
    rows = [(" ".join(s for s, _ in sst[1 + i : 5 + i]), sst[1 + i][1]) for i in range(0, sentences, 4)]
    topics = {"film": "movie", "music": "song", "sport": "game"}
    half, quarter = len(rows) // 2, len(rows) // 4
    for name, start, count in (("train", 0, half), ("dev", half, quarter), ("test", half + quarter, quarter)):
        part = rows[start : start + count]
        (work / "reviews").mkdir(exist_ok=True)
        lines = ["text\tlabel", *(f"{text}\t{label}" for text, label in part)]
        (work / "reviews" / f"{name}.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
        (work / "topics").mkdir(exist_ok=True)
        tagged = []
        for i, (text, _) in enumerate(part):
            labels = [t for j, t in enumerate(topics) if (i + j) % 2 == 0]
            words = " ".join(topics[t] for t in labels)
            tagged.append(f"{words} {text[:80]}\t{','.join(labels)}")
        (work / "topics" / f"{name}.tsv").write_text("\n".join(tagged) + "\n", encoding="utf-8")


def _sentence_data(work: Path) -> None:
    """`$GLUE_DIR/STS-B` (a few rows) and `retrieval/squad-dev` cut to two queries of each of six documents
    per split (mining 4 negatives needs 5 other documents)."""
    sts = work / "glue" / "STS-B"
    sts.mkdir(parents=True)
    for name, rows in (("train", 16), ("dev", 8)):
        (sts / f"{name}.tsv").write_text(_lines_of(shared_path("data", "glue", "STS-B", f"{name}.tsv"), rows + 1))
    src, dst = shared_path("data", "retrieval", "squad-dev"), work / "retrieval" / "squad-dev"
    (dst / "qrels").mkdir(parents=True)
    kept_queries, kept_docs = set(), set()
    for split in ("train", "dev", "test"):
        header, *rows = (src / "qrels" / f"{split}.tsv").read_text(encoding="utf-8").splitlines()
        per_doc: dict[str, list[str]] = {}
        for row in rows:
            query, doc, _ = row.split("\t")
            if len(per_doc) < 6 or doc in per_doc:
                per_doc.setdefault(doc, []).append(row)
        kept = [r for doc_rows in per_doc.values() for r in doc_rows[:2]]
        kept_queries |= {r.split("\t")[0] for r in kept}
        kept_docs |= set(per_doc)
        (dst / "qrels" / f"{split}.tsv").write_text("\n".join([header, *kept]) + "\n", encoding="utf-8")
    for name, ids in (("queries.jsonl", kept_queries), ("corpus.jsonl", kept_docs)):
        lines = (src / name).read_text(encoding="utf-8").splitlines()
        (dst / name).write_text("".join(x + "\n" for x in lines if json.loads(x)["_id"] in ids), encoding="utf-8")


def recipe_inputs(work: Path, review_sentences: int = 64) -> None:
    """The small inputs the README leaves to its reader (`input.txt`, `sentences.txt`, `questions.jsonl`,
    `reviews/`, `topics/` of `review_sentences` SST-2 sentences, the SWAG fixtures); bench/recipe_costs.py
    writes them beside the real data too."""
    shutil.copy(DEMO / "input.txt", work / "input.txt")
    shutil.copytree(FIXTURES / "tasks" / "swag", work / "swagaf" / "data")
    _classification_data(work, review_sentences)
    (work / "sentences.txt").write_text("A man is playing a guitar.\nSomeone plays an instrument.\n")
    with (work / "questions.jsonl").open("w", encoding="utf-8") as f:
        for p in _squad_slice(_squad_dev(), 100, 2)["data"][0]["paragraphs"]:
            f.write(json.dumps({"question": p["qas"][0]["question"], "context": p["context"]}) + "\n")


def _squad_dev() -> dict:
    with gzip.open(shared_path("data", "squad", "dev-v2.0.json.gz"), "rt", encoding="utf-8") as f:
        return json.load(f)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    """The working directory of the recipes, with the substitutes the module docstring lists."""
    work = tmp_path_factory.mktemp("readme")
    for name in ("uncased_L-12_H-768_A-12", "cased_L-12_H-768_A-12"):
        shutil.copytree(DEMO, work / name, ignore=shutil.ignore_patterns("input.txt", "README.md"))
    shutil.copy(shared_path("data", "sample_text.txt"), work / "sample_text.txt")
    mrpc = work / "glue" / "MRPC"
    mrpc.mkdir(parents=True)
    for name, rows in (("train", 16), ("dev", 8), ("test", 8)):
        (mrpc / f"{name}.tsv").write_text(_lines_of(shared_path("data", "glue", "MRPC", f"{name}.tsv"), rows + 1))
    squad = work / "squad"
    squad.mkdir()
    dev = _squad_dev()
    for name, first in (("train-v2.0.json", 0), ("dev-v2.0.json", 100)):
        data = _squad_slice(dev, first, 2)
        for p in data["data"][0]["paragraphs"]:
            for qa in p["qas"]:
                qa["answers"] = qa["answers"][:1] if name.startswith("train") else qa["answers"]
        (squad / name).write_text(json.dumps(data), encoding="utf-8")
    conll = work / "conll2003"
    conll.mkdir()
    for name in ("train.txt", "valid.txt", "test.txt"):
        text = shared_path("data", "conll2003", name).read_text(encoding="utf-8")
        (conll / name).write_text("\n\n".join(text.split("\n\n")[:12]) + "\n", encoding="utf-8")
    for collection, name in (
        ("british-novels", "Austen_Emma.txt.gz"),
        ("nltk_gutenberg", None),
        ("haggard", "She_3155.txt.gz"),
    ):
        books = sorted(shared_path("data", "corpus", collection).glob("*.txt.gz"))
        book = next(b for b in books if name in (None, b.name))
        (work / "corpus" / collection).mkdir(parents=True)
        with gzip.open(book, "rt", encoding="utf-8") as src:
            lines = [line for _, line in zip(range(400), src)]
        with gzip.open(work / "corpus" / collection / book.name, "wt", encoding="utf-8") as dst:
            dst.writelines(lines)
    _sentence_data(work)
    recipe_inputs(work)
    # `bert` for the recipes that go through the shell (pipes): this interpreter, this checkout.
    bin_dir = work / ".bin"
    bin_dir.mkdir()
    shim = bin_dir / "bert"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m bert "$@"\n')
    shim.chmod(0o755)
    return work


@pytest.fixture
def in_workdir(workdir, monkeypatch):
    monkeypatch.chdir(workdir)
    monkeypatch.setenv("BERT_BASE_DIR", str(workdir / "uncased_L-12_H-768_A-12"))
    monkeypatch.setenv("BERT_CASED_DIR", str(workdir / "cased_L-12_H-768_A-12"))
    monkeypatch.setenv("GLUE_DIR", str(workdir / "glue"))
    monkeypatch.setenv("SQUAD_DIR", str(workdir / "squad"))
    monkeypatch.setenv("CORPUS_DIR", str(workdir / "corpus"))
    src = str(Path(bert.__file__).resolve().parents[1])
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH")) if p))
    monkeypatch.setenv("PATH", f"{workdir / '.bin'}{os.pathsep}{os.environ['PATH']}")
    for name, value in SHELL_VARS.items():
        monkeypatch.setenv(name, value)
    return workdir


def _cuts(command: str, argv: list[str] | None = None) -> list[str]:
    args_cls, _ = cli._resolve(command)
    fields = [f for f in dataclasses.fields(args_cls) if f.metadata.get("cli") is not False]  # offered flags
    cuts = {k: v for k, v in CUTS.items() if k in {f.name for f in fields}} | COMMAND_CUTS.get(command, {})
    for f in fields:
        given = [a.split("=", 1)[1] for a in argv or [] if a.startswith(f"--{f.name}=") and "," in a]
        if f.metadata.get("grid") and given and f.name not in cuts:
            cuts[f.name] = ",".join(given[-1].split(",")[:GRID_CELLS])
    return [f"--{k}={v}" for k, v in cuts.items()]


def _run(recipe: str, capsys) -> tuple[int, str, str]:
    """Run one recipe line: `bert ...` in this process (with the cuts appended), pipelines in the shell."""
    if match := ASSIGNMENT.match(recipe):
        done = subprocess.run(["bash", "-c", match.group(2)], capture_output=True, text=True, timeout=60)
        SHELL_VARS[match.group(1)] = done.stdout.strip()  # in_workdir sets it for the recipes after this one
        return done.returncode, "", done.stderr
    if "|" in recipe:
        line = f"{recipe} {' '.join(_cuts(_command(recipe)))}"
        done = subprocess.run(["bash", "-c", line], capture_output=True, text=True, timeout=600)
        return done.returncode, done.stdout, done.stderr
    argv = [os.path.expandvars(a) for a in shlex.split(recipe, comments=True)]
    assert argv[0] == "bert", f"README recipe {recipe!r}: not a `bert` command (install steps go with pip)"
    code = cli.main([*argv[1:], *_cuts(argv[1], argv)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize("recipe", RECIPES, ids=[f"{i:02d}-{_command(r)}" for i, r in enumerate(RECIPES)])
def test_readme_recipe(recipe, in_workdir, capsys):
    code, out, err = _run(recipe, capsys)
    assert code == 0, f"README recipe failed: {recipe}\n{err[-3000:]}"
    assert not [line for line in err.splitlines() if ": error:" in line or line.startswith("ERROR")], err[-3000:]
    terminal = out.count("\n") + err.count("\n")
    assert terminal <= MAX_TERMINAL_LINES, f"{terminal} lines on the terminal:\n{out}{err}"
    command = _command(recipe)
    if not out.strip() and command not in ("=", "serve"):
        # Nothing on stdout (the results went to files): the command still ends with its result block.
        assert f"bert {command}: done\n" in err, f"no result block on the terminal:\n{err[-3000:]}"
    if _command(recipe) in AFTER:
        AFTER[_command(recipe)](in_workdir, out, err)


@pytest.mark.parametrize("short", [s for _, s in SHORTENED], ids=[f"short-{_command(r)}" for r, _ in SHORTENED])
def test_readme_shortened_recipe(short, in_workdir, capsys):
    """The shortened forms of the cost table run as the recipes do (after them: they read the same inputs)."""
    code, _, err = _run(short, capsys)
    assert code == 0, f"README shortened recipe failed: {short}\n{err[-3000:]}"


def test_every_long_recipe_has_a_shortened_form():
    """A recipe the cost table times in hours or over 5 minutes names its shortened form."""
    assert SHORTENED, "the README's cost table gives shortened forms"
    for cells in cost_rows():
        minutes = re.fullmatch(r"[≥~]?\s*([\d.]+) (min|h)", cells[1])
        if minutes and (minutes.group(2) == "h" or float(minutes.group(1)) > 5):
            assert cells[3].startswith("`--"), f"the cost table's row {cells[0]} takes {cells[1]}: give its short form"


# The Python blocks, in README order; those that call a running server (`bert serve`) are not run here
# (tests/e2e/test_serve.py talks to one).
SNIPPETS = [block for block in _blocks("python") if "http://" not in block]


@pytest.mark.parametrize("snippet", SNIPPETS, ids=[f"python-{i}" for i in range(len(SNIPPETS))])
def test_readme_python_snippet(snippet, in_workdir):
    namespace: dict = {}
    exec(compile(snippet, f"{README}: Python block", "exec"), namespace)
    if "logits" in namespace:  # the model's logits: one example, two labels
        assert tuple(namespace["logits"].shape) == (1, 2)


def _quickstart(work: Path, printed: str, err: str) -> None:
    """The first command of the README: the table, the stages, the logs, the curves."""
    out = work / "quickstart_output"
    assert re.search(r"^ +pre-trained +random init$", printed, flags=re.M), printed
    row = re.search(r"^  eval_accuracy +(\d\.\d{3}) +(\d\.\d{3})$", printed, flags=re.M)
    runs = ("classify", "classify_random_init")
    results = {run: json.loads((out / run / "eval_results.json").read_text()) for run in runs}
    assert row and float(row.group(1)) == round(results["classify"]["eval_accuracy"], 3)
    assert float(row.group(2)) == round(results["classify_random_init"]["eval_accuracy"], 3)
    for stage in ("create-pretraining-data: ", "pretrain: 4 steps", "classify: pre-trained", "classify: random init"):
        assert re.search(rf"^  {re.escape(stage)}.* +\d+ s$", printed, flags=re.M), stage
    for line in ("bert create-pretraining-data --input_file=", "bert pretrain --", "bert classify --"):
        assert line in printed
    # It says at its start what it will do and how long that takes here, measured.
    assert err.startswith("bert quickstart: pre-trains a BERT-Tiny for 4 steps"), err[:500]
    assert re.search(r"^About \d+ (s|min) on this machine now \(\d+\.\d\d s per training step", err, flags=re.M)
    # The terminal: no INFO lines (no "*** Example ***" dumps); the only warning is the random-init twin's.
    assert "INFO" not in err and "*** Example ***" not in err
    assert [line for line in err.splitlines() if line.startswith("WARNING")] == [
        "WARNING: no --init_checkpoint: the model starts from random weights"
    ]
    # The files: the whole log (the example dumps of every step), each step's log, results and curves.
    log = (out / "log.txt").read_text()
    assert log.count("*** Example ***") >= 15 and "Wrote 14168 total instances" in log
    assert "*** Example ***" in (out / "pretraining_data.log.txt").read_text()
    assert "***** Running training *****" in (out / "classify" / "log.txt").read_text()
    assert json.loads((out / "pretraining_data" / "manifest.json").read_text())["max_seq_length"] == 64
    assert (out / "pretrain" / "model" / "model.safetensors").is_file()
    assert "global_step = 4" in (out / "pretrain" / "eval_results.txt").read_text()
    for run in runs:
        assert results[run]["global_step"] == 6  # int(2000 / 32 * 0.1)
        assert (out / run / "curves.png").is_file()
    drawn = json.loads((out / "curves.json").read_text())
    assert [r["label"] for r in drawn["runs"]] == ["pre-trained", "random init"]
    assert json.loads((out / "classify" / "args.json").read_text())["args"]["init_checkpoint"].endswith("model")


def _section(command: str) -> str:
    """README.md's section of `bert COMMAND`, up to the next heading."""
    text = README.read_text(encoding="utf-8")
    start = text.index(f"### `bert {command}`")
    return text[start : text.find("\n#", start + 1)]


def _tokenize(work: Path, printed: str, err: str) -> None:
    """The tokens the README promises for BERT-Base's uncased vocabulary are the ones it gives (the recipe
    ran on the tiny demo vocabulary; here it runs again on the real one)."""
    assert set(json.loads(printed)) == {"text", "tokens", "ids"}
    promised = re.search(r"uncased vocabulary the tokens are `(\[.*?\])`", _section("tokenize"), flags=re.S)
    assert promised, "the tokenize section promises tokens"
    base = work / "bert_base_uncased_vocab"
    base.mkdir(exist_ok=True)
    shutil.copy(shared_path("data", "vocab", "uncased.txt"), base / "vocab.txt")
    recipe = next(r for r in RECIPES if _command(r) == "tokenize")
    done = subprocess.run(
        ["bash", "-c", recipe],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "BERT_BASE_DIR": str(base)},
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["tokens"] == json.loads(promised.group(1))


def _shape(line: str) -> str:
    return re.sub(r"\d+(\.\d+)?", "N", line.rstrip())


def _build_vocab(work: Path, printed: str, err: str) -> None:
    """The result block the README shows (on the whole corpus) is the one printed here, numbers aside."""
    promised = re.search(r"```text\n(bert build-vocab: done\n.*?)```", _section("build-vocab"), flags=re.S)
    assert promised, "the build-vocab section shows its result block"
    lines = promised.group(1).splitlines()
    start = err.splitlines().index(lines[0])
    assert [_shape(line) for line in err.splitlines()[start : start + len(lines)]] == [_shape(line) for line in lines]
    assert (work / "books_vocab" / "vocab.txt").is_file()


AFTER = {"quickstart": _quickstart, "tokenize": _tokenize, "build-vocab": _build_vocab}
