"""Shared by all tests: the command-line tools under ``tools/`` are importable as modules
(``import benchmark as tool``, ``import benchmark_lib``), with ``tools/`` on the module path
as when a tool runs. It is appended, so a tool's name never shadows an installed module."""
import sys
from pathlib import Path

TOOLS = Path(__file__).resolve().parents[1] / 'tools'
if str(TOOLS) not in sys.path:
    sys.path.append(str(TOOLS))
