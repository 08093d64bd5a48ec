"""tools/run_tests.sh, CI's entry point: it fails when a test fails and when no test ran."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from common import REPO_ROOT


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """The script in a repository of one passing and one failing test, its install a no-op
    and its environment this interpreter's."""
    (tmp_path / 'tools').mkdir()
    shutil.copy(REPO_ROOT / 'tools/run_tests.sh', tmp_path / 'tools')
    (tmp_path / 'tools/install.sh').write_text('exit 0\n')
    (tmp_path / 'tests').mkdir()
    (tmp_path / 'tests/test_sample.py').write_text(
        'def test_passes():\n    pass\n\n\ndef test_fails():\n    assert False\n')
    (tmp_path / 'venv/bin').mkdir(parents=True)
    # a script, not a link: a link's interpreter would not find its environment (pytest-xdist)
    (tmp_path / 'venv/bin/python').write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    (tmp_path / 'venv/bin/python').chmod(0o755)
    return tmp_path


def run_tests(checkout: Path, *pytest_args: str) -> int:
    env = {**os.environ, 'VITDENSE_VENV': str(checkout / 'venv')}
    return subprocess.run(['bash', str(checkout / 'tools/run_tests.sh'), *pytest_args],
                          env=env, capture_output=True, timeout=120).returncode


@pytest.mark.parametrize('selection, status', [
    ('test_passes', 0),
    ('test_fails', 1),
    ('no_test_has_this_name', 5),
])
def test_status_is_pytest_s_and_no_test_run_fails(checkout, selection, status):
    assert run_tests(checkout, '-k', selection) == status
