"""Which compiled ``mmcv._ext`` functions mmdet's and mmseg's shipped configs reach on a GPU.

Read, not run: every config under the installed ``mmdet/.mim/configs`` and
``mmseg/.mim/configs`` is loaded, and every ``type`` its model names (heads, necks, losses,
RoI layers, convolution and NMS settings, train and test settings) is resolved to the class or
function the hosts build.  A module's compiled functions are those the ``mmcv.ops`` names
that its source file imports and calls (or derives from) reach (read from mmcv's op
modules: which ``ext_module.<fn>`` each class or function calls, directly or through
another), together with those of every mmdet / mmseg model module it imports a name from.  That counts a GPU branch whether or not
the CPU takes it, and an op that a file imports for a branch a config does not take: an
upper bound per config, exact per op module.

    python tools/mmcv_ops_inventory.py [--out inventory.json]

prints a markdown table (compiled functions -> config families, served or not) for
``docs/mmcv_ops.md``.
"""
from __future__ import annotations

import argparse
import ast
import importlib
import inspect
import json
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterator

from vitdense.compat import apply_host_fixes

apply_host_fixes()

import mmcv.ops  # noqa: E402  (after the host fix: mmcv.ops loads mmcv._ext)
from mmengine.config import Config  # noqa: E402

MMCV_OPS = Path(mmcv.ops.__file__).parent
HOSTS = ('mmdet', 'mmseg')


def _imports(tree: ast.Module, package: str) -> dict[str, tuple[str, str]]:
    """Name bound by a ``from X import Y`` at any depth -> (absolute module X, Y)."""
    bound = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ''
            if node.level:
                parent = package.rsplit('.', node.level - 1)[0] if node.level > 1 else package
                base = f'{parent}.{base}' if base else parent
            for alias in node.names:
                bound[alias.asname or alias.name] = (base, alias.name)
    return bound


def _called_or_subclassed(tree: ast.Module) -> set[str]:
    """Names the module calls (``X(...)``, ``X.apply(...)``) or derives a class from: an op
    imported only for ``isinstance`` (mmdet's mask head and CARAFE) does not run."""
    names = set()
    for node in ast.walk(tree):
        targets = (node.bases if isinstance(node, ast.ClassDef)
                   else [node.func] if isinstance(node, ast.Call) else [])
        for target in targets:
            while isinstance(target, ast.Attribute):
                target = target.value
            if isinstance(target, ast.Name):
                names.add(target.id)
    return names


class MmcvOps:
    """The compiled functions each top-level name of mmcv's op modules reaches."""

    def __init__(self) -> None:
        self.calls: dict[tuple[str, str], tuple[set[str], set[tuple[str, str]]]] = {}
        for path in MMCV_OPS.glob('*.py'):
            self._read(f'mmcv.ops.{path.stem}' if path.stem != '__init__' else 'mmcv.ops',
                       ast.parse(path.read_text()))
        self._memo: dict[tuple[str, str], frozenset[str]] = {}

    def _read(self, module: str, tree: ast.Module) -> None:
        imported = _imports(tree, 'mmcv.ops')
        top = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
        top |= {t.id for n in tree.body if isinstance(n, ast.Assign)
                for t in n.targets if isinstance(t, ast.Name)}
        for name, (source, original) in imported.items():
            self.calls[(module, name)] = (set(), {(source, original)})
        for node in tree.body:
            names = ([node.name] if isinstance(node, (ast.FunctionDef, ast.ClassDef))
                     else [t.id for t in getattr(node, 'targets', []) if isinstance(t, ast.Name)])
            ext, refs = set(), set()
            for sub in ast.walk(node):
                if (isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name)
                        and sub.value.id == 'ext_module'):
                    ext.add(sub.attr)
                elif isinstance(sub, ast.Name) and sub.id in top | set(imported):
                    refs.add(imported.get(sub.id, (module, sub.id)))
            for name in names:
                self.calls[(module, name)] = (ext, refs - {(module, name)})

    def reached(self, module: str, name: str) -> frozenset[str]:
        """Compiled functions that ``module.name`` calls, directly or through other names."""
        key = (module, name)
        if key not in self._memo:
            self._memo[key] = frozenset()   # cycles end here
            ext, refs = self.calls.get(key, (set(), set()))
            self._memo[key] = frozenset(ext).union(*(self.reached(*ref) for ref in refs))
        return self._memo[key]


class HostModules:
    """The compiled functions each mmdet / mmseg model module reaches (see the docstring)."""

    def __init__(self, ops: MmcvOps) -> None:
        self.ops = ops
        self._memo: dict[str, frozenset[str]] = {}

    def of_file(self, path: str) -> frozenset[str]:
        if path not in self._memo:
            self._memo[path] = frozenset()   # cycles end here
            parts = Path(path).with_suffix('').parts
            module_parts = parts[max(i for i, p in enumerate(parts) if p in HOSTS):]
            package = '.'.join(module_parts[:-1])
            tree = ast.parse(Path(path).read_text())
            used = _called_or_subclassed(tree)
            reached: set[str] = set()
            for name, (source, original) in _imports(tree, package).items():
                if source == 'mmcv.ops' or source.startswith('mmcv.ops.'):
                    if name in used:
                        reached |= self.ops.reached(source, original)
                elif source.split('.')[0] in HOSTS and '.models' in source:
                    reached |= self.of_object(source, original)
            self._memo[path] = frozenset(reached)
        return self._memo[path]

    def of_object(self, module: str, name: str) -> frozenset[str]:
        try:
            obj = getattr(importlib.import_module(module), name)
            path = inspect.getsourcefile(obj)
        except (ImportError, AttributeError, TypeError):
            return frozenset()
        if path and any(f'/{host}/models/' in path for host in HOSTS):
            return self.of_file(path)
        return frozenset()

    def of_type(self, host: str, type_name: Any) -> frozenset[str]:
        """What a config's ``type`` reaches: a registered class, or an ``mmcv.ops`` name."""
        if not isinstance(type_name, str):
            obj = type_name
        else:
            registry = importlib.import_module(f'{host}.registry')
            obj = registry.MODELS.get(type_name) or registry.TASK_UTILS.get(type_name)
            if obj is None and hasattr(mmcv.ops, type_name.split('.')[-1]):
                obj = getattr(mmcv.ops, type_name.split('.')[-1])
        if obj is None or not hasattr(obj, '__module__'):
            return frozenset()
        if obj.__module__.startswith('mmcv.ops'):
            name = getattr(obj, '__name__', type_name)
            return self.ops.reached(obj.__module__, name) | self.ops.reached('mmcv.ops', name)
        return self.of_object(obj.__module__, obj.__name__)


def _types(node: Any) -> Iterator[Any]:
    """Every ``type`` value in a config's nested dicts and lists."""
    if isinstance(node, dict):
        if 'type' in node:
            yield node['type']
        for value in node.values():
            yield from _types(value)
    elif isinstance(node, (list, tuple)):
        for value in node:
            yield from _types(value)


def inventory() -> tuple[dict[str, dict[str, set[str]]], list[str]]:
    """compiled function -> host -> config families reaching it; and the configs that did
    not load."""
    importlib.import_module('mmdet.models')
    importlib.import_module('mmseg.models')
    modules = HostModules(MmcvOps())
    table: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    failed = []
    for host in HOSTS:
        root = Path(importlib.import_module(host).__file__).parent / '.mim' / 'configs'
        for path in sorted(root.rglob('*.py')):
            if '_base_' in path.parts:
                continue
            try:
                model = Config.fromfile(str(path)).get('model', {})
            except Exception:  # noqa: BLE001  (configs of projects not installed)
                failed.append(str(path.relative_to(root.parent)))
                continue
            family = path.relative_to(root).parts[0]
            for type_name in _types(model):
                for function in modules.of_type(host, type_name):
                    table[function][host].add(family)
    return table, failed


def markdown(table: dict[str, dict[str, set[str]]], served: frozenset[str]) -> str:
    """One row per set of functions reached by the same config families (an op's forward and
    backward), served ones first."""
    rows: dict[tuple, list[str]] = defaultdict(list)
    for function in sorted(table):
        families = tuple(tuple(sorted(table[function].get(host, ()))) for host in HOSTS)
        rows[(function not in served, families)].append(function)
    lines = ['| `mmcv._ext` functions | served | mmdet config families | mmseg config families |',
             '|---|---|---|---|']
    for (unserved, families), functions in sorted(rows.items(), key=lambda r: (r[0][0], r[1])):
        cells = [', '.join(names) or '-' for names in families]
        lines.append(f"| {', '.join(f'`{f}`' for f in functions)} | "
                     f"{'no' if unserved else 'yes'} | " + ' | '.join(cells) + ' |')
    return '\n'.join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--out', type=Path, help='also write the inventory as JSON here')
    args = parser.parse_args()
    table, failed = inventory()
    from vitdense.compat.mmcv_ext import IMPLEMENTED
    print(markdown(table, IMPLEMENTED))
    print(f'\n{len(failed)} configs did not load: {", ".join(failed) or "none"}')
    if args.out:
        args.out.write_text(json.dumps(
            dict(functions={f: {h: sorted(v) for h, v in hosts.items()}
                            for f, hosts in table.items()}, not_loaded=failed), indent=1))


if __name__ == '__main__':
    main()
