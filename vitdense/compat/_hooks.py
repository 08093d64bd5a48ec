"""Run a fix right after a host module is imported, without importing it ourselves.

``import vitdense`` must stay light (the backbones need only torch, timm and mmengine), yet
fixes for mmcv / mmdet / mmseg / mmpretrain must be in place before those modules are
used.  :func:`when_imported` patches a module now if it is already imported, otherwise the
moment its import finishes, whatever the import order.
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import threading
from types import ModuleType
from typing import Callable, Sequence

Patch = Callable[[ModuleType], None]

_pending: dict[str, list[Patch]] = {}
_lock = threading.RLock()


class _PatchingLoader(importlib.abc.Loader):
    """Delegates to the real loader, then applies the patches waiting for the module."""

    def __init__(self, wrapped: importlib.abc.Loader) -> None:
        self._wrapped = wrapped

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._wrapped.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._wrapped.exec_module(module)
        with _lock:
            patches = _pending.pop(module.__name__, [])
        for patch in patches:
            patch(module)

    def __getattr__(self, name: str):  # get_resource_reader, is_package, ... of the real one
        return getattr(self._wrapped, name)


class _PatchingFinder(importlib.abc.MetaPathFinder):
    """Finds specs through the other finders and wraps the loader of watched modules."""

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in _pending:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, 'find_spec'):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, 'exec_module'):
                    spec.loader = _PatchingLoader(spec.loader)
                return spec
        return None


_FINDER = _PatchingFinder()


def when_imported(module_name: str, patch: Patch) -> None:
    """Call ``patch(module)`` once ``module_name`` is imported (now, if it already is)."""
    with _lock:
        module = sys.modules.get(module_name)
        if module is None:
            _pending.setdefault(module_name, []).append(patch)
            if _FINDER not in sys.meta_path:
                sys.meta_path.insert(0, _FINDER)
            return
    patch(module)
