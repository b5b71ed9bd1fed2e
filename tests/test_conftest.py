"""The test suite's own promise: a run without (part of) the shared data folder ends by saying how many tests it
skipped for that reason, so a green run is never mistaken for one that covered the real-data tests."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from conftest import REPO


@pytest.mark.slow  # a pytest run in a subprocess: 7 s of the 10-minute default run
def test_the_run_ends_by_counting_the_tests_skipped_for_missing_shared_data(tmp_path):
    tests = tmp_path / "tests"
    tests.mkdir()
    shutil.copy(REPO / "tests" / "conftest.py", tests / "conftest.py")
    (tests / "test_data.py").write_text(
        textwrap.dedent(
            """
            import pytest
            from conftest import shared_path

            @pytest.fixture(scope="module")
            def squad():
                return shared_path("data", "squad")

            @pytest.mark.parametrize("i", range(3))
            def test_glue(i):
                assert shared_path("data", "glue").is_dir()

            def test_squad(squad):
                pass

            def test_squad_again(squad):
                pass

            def test_skipped_for_another_reason():
                pytest.skip("not this machine")
            """
        )
    )
    shared = tmp_path / "shared"
    (shared / "data" / "glue").mkdir(parents=True)  # glue is there, squad is not
    env = {**os.environ, "BERT_TEST_SHARED": str(shared)}
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(tmp_path), str(tests)]
    done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "3 passed, 3 skipped" in done.stdout
    warning = [line for line in done.stdout.splitlines() if "WARNING" in line]
    assert len(warning) == 1, done.stdout
    assert (
        f"WARNING: 2 tests skipped because {shared} (the shared data folder) is absent: these results do not "
        "cover the real-data tests" in warning[0]
    )
    assert done.stdout.rstrip().splitlines()[-1].startswith("!")  # the last thing the run prints

    # With everything there, nothing is said.
    (shared / "data" / "squad").mkdir()
    done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert "5 passed, 1 skipped" in done.stdout and "WARNING" not in done.stdout, done.stdout
