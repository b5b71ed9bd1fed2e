"""CI (`.ci/run`) and pre-commit agree: lint, formatting and types on the whole package, then exactly the
README's test command."""

from __future__ import annotations

import re

import tomllib
import yaml  # transformers' dependency, in the test extra

from conftest import REPO

CHECKS = ("ruff check", "ruff format --check", "mypy")


def _readme_test_command() -> str:
    block = re.search(r"Install and run the tests:\n\n```bash\n(.+?)\n```", (REPO / "README.md").read_text(), re.S)
    assert block, "README.md lost its test command"
    return block.group(1).strip()


def test_ci_runs_the_checks_then_the_readme_test_command_verbatim():
    lines = [line.split("#")[0].strip() for line in (REPO / ".ci" / "run").read_text().splitlines()]
    lines = [line for line in lines if line]
    assert lines[-1] == _readme_test_command()
    for check in CHECKS:
        assert any(line.startswith(check) for line in lines[:-1]), check


def test_pre_commit_mirrors_the_ci_checks():
    config = yaml.safe_load((REPO / ".pre-commit-config.yaml").read_text())
    entries = [hook["entry"] for repo in config["repos"] for hook in repo["hooks"]]
    assert [next(c for c in reversed(CHECKS) if e.startswith(c)) for e in entries] == list(CHECKS)


def test_mypy_checks_the_whole_package_with_pinned_tools():
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert pyproject["tool"]["mypy"]["files"] == ["src/bert"]  # no allow-list: every module, new ones too
    dev = pyproject["project"]["optional-dependencies"]["dev"]
    assert {d.split("==")[0] for d in dev if "==" in d} == {"ruff", "mypy"}  # pinned: every run agrees
