"""The README's quickstart figures are what `bert quickstart` prints on the README's machine class.

The run is deterministic for a seed on one machine: the README states the CPU class, the torch build and
the date of its figures, and this test runs the default quickstart and its shortened form (minutes each,
hence `slow`) and compares the printed accuracies with the README's to the digit. On another CPU class the
kernels sum in another order, which can move the third digit; the test then fails and says so, and the
README says what varies.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"
ROW = re.compile(r"^  eval_accuracy +(\d\.\d{3}) +(\d\.\d{3})$", flags=re.M)
GAP = re.compile(r"^Pre-training changed dev accuracy by ([+-]\d\.\d{3})\.$", flags=re.M)
SHORTENED = ["--pretrain_steps=200", "--num_train_epochs=1"]


def promised(readme: str, flags: list[str]) -> tuple[tuple[str, str], str]:
    """The README's figures for a quickstart run with `flags`: the table at the top of the page for the
    default run; for the shortened form, the sentence after it that says what it printed."""
    if not flags:
        row, gap = ROW.search(readme), GAP.search(readme)
        assert row and gap, "the README's quickstart table is not where the test reads it"
        return (row.group(1), row.group(2)), gap.group(1)
    text = " ".join(readme.split())
    found = re.search(
        rf"`bert quickstart {' '.join(flags)}`.*? printed (\d\.\d{{3}}) against (\d\.\d{{3}}) \(([+-]\d\.\d{{3}})\)",
        text,
    )
    assert found, f"the README does not state what `bert quickstart {' '.join(flags)}` printed"
    return (found.group(1), found.group(2)), found.group(3)


@pytest.mark.slow
@pytest.mark.parametrize("flags", [[], SHORTENED], ids=["default", "shortened"])
def test_quickstart_prints_the_readme_figures(tmp_path, flags):
    row, gap = promised(README.read_text(encoding="utf-8"), flags)
    run = subprocess.run(
        [sys.executable, "-m", "bert", "quickstart", f"--output_dir={tmp_path / 'out'}", *flags],
        capture_output=True,
        text=True,
        check=True,
    )
    printed_row, printed_gap = ROW.search(run.stdout), GAP.search(run.stdout)
    assert printed_row and printed_gap, run.stdout
    assert printed_row.groups() == row, (
        f"quickstart {flags} printed {printed_row.groups()}, the README promises {row} "
        "(another CPU class or torch build than the README's can move the third digit)"
    )
    assert printed_gap.group(1) == gap
    if not flags:  # the default run shows pre-training's effect (the shortened one is a smoke run: the README)
        assert float(gap) > 0
