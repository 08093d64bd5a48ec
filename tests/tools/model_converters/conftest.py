"""Shared by the converter tests: a converter's command line run in the test's own process.

Each fresh interpreter imports torch, mmengine and the hosts before a converter starts
(seconds). A test runs a converter once as a user does, ``python CONVERTER ...`` in a new
process, and its further command lines through :func:`run_command`: the same file as
``__main__`` with the same ``sys.argv``, its exit status and output as the interpreter
would give them.
"""
from __future__ import annotations

import runpy
import subprocess
import sys
import traceback
from pathlib import Path
from typing import Callable

import pytest


@pytest.fixture
def run_command(monkeypatch, capsys) -> Callable[..., subprocess.CompletedProcess]:
    """``run_command(script, *args)``: ``python script *args`` in this process, returned as
    :func:`subprocess.run` with ``capture_output=True, text=True`` returns it."""

    def run(script: Path, *args: str) -> subprocess.CompletedProcess:
        argv = [str(script), *args]
        monkeypatch.setattr(sys, 'argv', argv)
        capsys.readouterr()
        try:
            runpy.run_path(str(script), run_name='__main__')
            code = 0
        except SystemExit as exit_:  # as the interpreter ends on it: None 0, a message 1
            code = exit_.code
            if code is None:
                code = 0
            elif not isinstance(code, int):
                print(code, file=sys.stderr)
                code = 1
        except Exception:  # noqa: BLE001 (an uncaught error: its traceback and status 1)
            traceback.print_exc()
            code = 1
        out, err = capsys.readouterr()
        return subprocess.CompletedProcess(argv, code, out, err)

    return run
