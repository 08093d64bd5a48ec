"""The package's shape as docs/architecture.md states it: no module over 500 lines, no
model function over 60, and imports pointing one way, from the edges to the core."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / 'vitdense'
#: the layers, core last: a module imports nothing of a layer before its own
LAYERS = (
    ('vitdense.engine', 'vitdense.cls', 'vitdense.det', 'vitdense.seg', 'vitdense.analysis',
     'vitdense.deploy', 'vitdense.demo_data'),
    ('vitdense.models', 'vitdense.models.backbones', 'vitdense.models.eomt',
     'vitdense.models.necks'),
    ('vitdense.models.layers',),
)
#: what no module of the package imports: the command lines and measuring around it
EDGES = ('tools', 'benchmarks', 'configs', 'tests')


def _modules() -> dict[str, tuple[ast.Module, list[str]]]:
    """Each module's name -> its tree and the package its relative imports start from (the
    folder it sits in, for an ``__init__`` as for any other module)."""
    trees = {}
    for path in sorted(PACKAGE.rglob('*.py')):
        parts = path.relative_to(PACKAGE.parent).with_suffix('').parts
        name = '.'.join(parts[:-1] if parts[-1] == '__init__' else parts)
        trees[name] = ast.parse(path.read_text(), str(path)), list(parts[:-1])
    return trees


def _imported(tree: ast.Module, package: list[str]) -> set[str]:
    """The absolute names a module of ``package`` imports (relative imports resolved)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            module = '.'.join(base + ([node.module] if node.module else []))
            names.add(module)
            names.update(f'{module}.{alias.name}' for alias in node.names)
    return names


def _layer(name: str) -> int | None:
    """The layer of module ``name``: that of its longest prefix in ``LAYERS``."""
    prefixes = [(len(prefix), index) for index, layer in enumerate(LAYERS) for prefix in layer
                if name == prefix or name.startswith(prefix + '.')]
    return max(prefixes)[1] if prefixes else None


def test_no_module_of_the_package_is_over_500_lines():
    long = {str(p.relative_to(PACKAGE.parent)): n for p in PACKAGE.rglob('*.py')
            if (n := len(p.read_text().splitlines())) > 500}
    assert not long, long


def test_no_function_of_the_models_is_over_60_lines():
    long = []
    for path in (PACKAGE / 'models').rglob('*.py'):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
                    node.end_lineno - node.lineno + 1 > 60:
                long.append(f'{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.name}')
    assert not long, long


def test_imports_point_from_the_edges_to_the_core():
    """A module of a layer imports nothing of a layer above it, and no module imports the
    command lines, benchmarks, configs or tests."""
    upward = []
    for name, (tree, package) in _modules().items():
        own = _layer(name)
        for imported in _imported(tree, package):
            target = _layer(imported)
            if imported.split('.')[0] in EDGES or \
                    own is not None and target is not None and target < own:
                upward.append(f'{name} imports {imported}')
    assert not upward, upward


@pytest.mark.parametrize('name, imported, upward', [
    ('vitdense.models.layers.attention', 'vitdense.models.backbones.base', True),
    ('vitdense.models.backbones.base', 'vitdense.models.layers.attention', False),
    ('vitdense.models.backbones.base', 'vitdense.engine.hooks', True),
    ('vitdense.models.layers.attention', 'vitdense.models', True),
    ('vitdense.models', 'vitdense.models.layers.attention', False),
])
def test_the_layer_order_tells_an_upward_import(name, imported, upward):
    assert (_layer(imported) < _layer(name)) is upward
