"""Every repository path the docs (README.md, docs/*.md) and the docstrings name is there:
a file or folder under vitdense/, tools/, benchmarks/, configs/, docs/ or tests/. Patterns
(``configs/*/metafile.yml``, ``<name>``) and what git ignores (the benchmarks' results) are
not paths of the repository."""
from __future__ import annotations

import argparse
import ast
import functools
import re
import runpy
import shlex
import subprocess
import sys

import pytest

from common import CHECKOUT_ENV, REPO_ROOT

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


# ----------------------------------------------------------------- the guides' commands
GUIDES = ['README.md'] + [f'docs/{name}' for name in (
    'get_started.md', 'configs_and_weights.md', 'deploy.md', 'inside.md', 'mmcv_ops.md',
    'benchmarks.md', 'add_a_family.md', 'compile.md', 'vitdet.md', 'memory.md', 'faults.md')]
BASH_BLOCK = re.compile(r'```bash\n(.*?)```', re.S)
ASSIGNMENT = re.compile(r'(\w+)="([^"]*)"')
# commands the suite runs whole, as written (from a folder with the repository's configs
# and tools, so that what they write stays out of the checkout): cheap, no data needed; the
# others are parsed (test_every_guide_command_parses), and tests/tools run the tools
RUN_WHOLE = {
    '$L position-similarity --timm xcit_nano_12_p16_224 $O '
    '--name position-similarity_xcit-nano-timm':
        'work_dirs/look/position-similarity_xcit-nano-timm.png',
}


def guide_commands(text: str) -> list[tuple[str, str]]:
    """(as written, expanded) for each ``python tools/...`` or ``python -m benchmarks...``
    command of the guide's bash blocks; ``$NAME`` expanded from the guide's own
    ``NAME="..."`` lines, continuation lines joined, comments and ``[optional]`` parts
    dropped. Commands of the hosts' own scripts (``$MMDET``) and shell set-up are not ours."""
    blocks = [block.replace('\\\n', ' ') for block in BASH_BLOCK.findall(text)]
    names = dict(ASSIGNMENT.findall('\n'.join(blocks)))
    commands = []
    for line in '\n'.join(blocks).splitlines():
        for written in line.split(' && '):
            written = re.sub(r'\s+#.*$', '', written).strip()
            expanded = re.sub(r'\$(\w+)', lambda m: names.get(m.group(1), m.group(0)), written)
            expanded = re.sub(r'\[[^\]]*\]', '', expanded)
            if re.match(r'python (tools/\S+\.py|-m benchmarks\.\w+)( |$)', expanded) \
                    and '$' not in expanded:
                commands.append((written, expanded))
    return commands


class _Parsed(Exception):
    """Raised once a tool's arguments parsed: the tool itself does not run."""


def _parse_only(command: str, monkeypatch) -> None:
    """Run the tool of ``command`` up to its argument parsing, in this process."""
    argv = shlex.split(command)[1:]
    original = argparse.ArgumentParser.parse_args

    def parse_args(parser, args=None, namespace=None):
        original(parser, args, namespace)
        raise _Parsed

    monkeypatch.setattr(argparse.ArgumentParser, 'parse_args', parse_args)
    monkeypatch.chdir(REPO_ROOT)
    if argv[0] == '-m':
        monkeypatch.setattr(sys, 'argv', [argv[1]] + argv[2:])
        run = functools.partial(runpy.run_module, argv[1], run_name='__main__', alter_sys=True)
    else:
        monkeypatch.setattr(sys, 'argv', argv)
        run = functools.partial(runpy.run_path, str(REPO_ROOT / argv[0]), run_name='__main__')
    with pytest.raises(_Parsed):
        run()


def test_guide_commands_are_found_and_expanded():
    text = ('```bash\nL="python tools/x.py"; O="--out o"\n$L a $O  # note\n'
            'python tools/train.py C [--amp] && python -m benchmarks.b \\\n  --k 1\n'
            'python $MMDET/train.py C\npip install y\n```\n')
    assert [expanded.split() for _, expanded in guide_commands(text)] == [
        ['python', 'tools/x.py', 'a', '--out', 'o'], ['python', 'tools/train.py', 'C'],
        ['python', '-m', 'benchmarks.b', '--k', '1']]


@pytest.mark.parametrize('guide', GUIDES)
def test_every_guide_command_parses(guide, monkeypatch):
    """Each command's tool takes its arguments as written (placeholders such as CONFIG
    stand for any value): a renamed option or a missing argument fails here."""
    commands = guide_commands((REPO_ROOT / guide).read_text())
    for written, expanded in commands:
        with monkeypatch.context() as patch:
            try:
                _parse_only(expanded, patch)
            except SystemExit as exit_:
                pytest.fail(f'{guide}: `{written}` does not parse (exit {exit_.code})')


def test_cheap_guide_commands_run_as_written(tmp_path):
    commands = dict(guide_commands((REPO_ROOT / 'docs/inside.md').read_text()))
    assert set(RUN_WHOLE) <= set(commands), 'docs/inside.md no longer has these commands'
    for folder in ('configs', 'tools'):
        (tmp_path / folder).symlink_to(REPO_ROOT / folder)
    for written, output in RUN_WHOLE.items():
        # `python` of the activated environment: this interpreter
        argv = [sys.executable] + shlex.split(commands[written])[1:]
        subprocess.run(argv, cwd=tmp_path, env=CHECKOUT_ENV, check=True, capture_output=True,
                       timeout=300)
        assert (tmp_path / output).stat().st_size > 0, written
