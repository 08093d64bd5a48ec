"""Every repository path the docs (README.md, docs/*.md) and the docstrings name is there:
a file or folder under vitdense/, tools/, benchmarks/, configs/, docs/ or tests/. Patterns
(``configs/*/metafile.yml``, ``<name>``) and what git ignores (the benchmarks' results) are
not paths of the repository."""
from __future__ import annotations

import ast
import re
import subprocess

from common import REPO_ROOT

PATH = re.compile(r'(?<![\w./-])((?:vitdense|tools|benchmarks|configs|docs|tests)/'
                  r'[\w.*<>{}/-]*[\w/*>}])')
PATTERN = re.compile(r'[*<>{}]')


def _tracked(suffix: str) -> list[str]:
    return subprocess.run(['git', 'ls-files', f'*{suffix}'], cwd=REPO_ROOT, check=True,
                          capture_output=True, text=True).stdout.split()


def _docstrings(source: str) -> list[str]:
    nodes = ast.walk(ast.parse(source))
    kinds = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    return [ast.get_docstring(node, clean=False) or '' for node in nodes
            if isinstance(node, kinds)]


def named_paths(file: str, text: str) -> list[str]:
    """The repository paths written in ``text`` (of ``file``: a .md, or a .py's docstrings)."""
    texts = [text] if file.endswith('.md') else _docstrings(text)
    return [match.group(1).rstrip('.') for part in texts for match in PATH.finditer(part)
            if not PATTERN.search(match.group(1))]


def _ignored(paths: set[str]) -> set[str]:
    result = subprocess.run(['git', 'check-ignore', '--no-index', '--stdin'], cwd=REPO_ROOT,
                            input='\n'.join(sorted(paths)), capture_output=True, text=True)
    return set(result.stdout.split())


def test_paths_are_found_in_prose_and_docstrings_only():
    source = '"""See `tools/train.py` and tools/demo.py."""\nPATH = "tools/absent.py"\n'
    assert named_paths('x.py', source) == ['tools/train.py', 'tools/demo.py']
    assert named_paths('x.md', 'run `configs/*/metafile.yml`, then docs/memory.md.') == [
        'docs/memory.md']


def test_every_path_in_docs_and_docstrings_exists():
    files = [f for f in _tracked('.md') if f == 'README.md' or f.startswith('docs/')]
    files += _tracked('.py')
    named = {(path, file) for file in files
             for path in named_paths(file, (REPO_ROOT / file).read_text())}
    missing = {(path, file) for path, file in named if not (REPO_ROOT / path).exists()}
    ignored = _ignored({path for path, _ in missing})
    stale = sorted((path, file) for path, file in missing if path not in ignored)
    assert not stale, '\n'.join(f'{file} names {path}, which is not there'
                                for path, file in stale)
