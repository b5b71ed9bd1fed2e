"""The package's OpenMP default: threads spin briefly at barriers, then sleep (see `bert/__init__.py`)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

PROBE = "import bert, os; print(os.environ.get('OMP_WAIT_POLICY'), os.environ.get('GOMP_SPINCOUNT'))"


def _probe(**env: str) -> str:
    base = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    return subprocess.run(
        [sys.executable, "-c", PROBE], env={**base, **env}, capture_output=True, text=True, check=True
    ).stdout.strip()


def test_importing_bert_bounds_the_openmp_spin():
    assert _probe() == "None 1000"


@pytest.mark.parametrize("name,value", [("OMP_WAIT_POLICY", "ACTIVE"), ("GOMP_SPINCOUNT", "300000")])
def test_a_users_own_openmp_setting_is_kept(name, value):
    expected = "ACTIVE None" if name == "OMP_WAIT_POLICY" else "None 300000"
    assert _probe(**{name: value}) == expected
