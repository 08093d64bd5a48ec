"""vitdense's interpreter start-up hook, run by ``vitdense-startup.pth`` in site-packages.

Two host-stack fixes must be in place before a host library is imported, not only after
``import vitdense``: mmdet's and mmseg's own ``tools/train.py`` and ``mim train`` import
``mmcv.ops`` and resolve ``mmdet::`` config bases before a config's ``custom_imports`` can
import vitdense.  This module installs one meta-path finder that acts on two imports only
and imports nothing itself (no torch, no mmengine) at start-up:

- ``mmengine.utils.package_utils``: right after it loads, its package look-ups are replaced
  by ones on ``importlib.metadata`` (mmengine 0.10 imports ``pkg_resources``, which
  setuptools >= 82 no longer ships: every ``mmdet::`` / ``mmseg::`` base failed with
  ``No module named 'pkg_resources'``).
- ``mmcv._ext``: when no compiled extension is installed (``mmcv-lite``), it is served by
  ``vitdense/compat/mmcv_ext.py``, the torch-native ops our models call.  A compiled
  extension, when present, is always used.

Each fix checks the versions it was written for and raises :class:`HostVersionError` on
others.  ``import vitdense`` installs the same finder, for environments where the ``.pth``
file did not run (vitdense on ``PYTHONPATH``).  The full list of fixes is in
``vitdense/compat/__init__.py``.
"""
from __future__ import annotations

import importlib.abc
import importlib.util
import os.path as osp
import sys
from importlib import metadata
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Callable, Sequence

__all__ = ['MissingCompiledOpError', 'HostVersionError', 'require', 'install', 'is_installed',
           'package2module', 'get_installed_path', 'PACKAGE_LOOKUPS_WRITTEN_FOR',
           'MMCV_EXT_WRITTEN_FOR']

PACKAGE_LOOKUPS_WRITTEN_FOR = '>=0.10.3,<0.11'   # mmengine
MMCV_EXT_WRITTEN_FOR = '>=2.0.0,<2.2.0'          # mmcv (op signatures of 2.1.0)


class MissingCompiledOpError(NotImplementedError):
    """An mmcv op that needs mmcv's compiled extension, which is not installed."""

    BACKEND = 'vitdense torch-native mmcv ops (torchvision kernels)'

    def __init__(self, op: str, detail: str = '') -> None:
        self.op = op
        super().__init__(
            f"mmcv op '{op}'{detail} needs mmcv's compiled extension, which is not installed: "
            f'this environment runs mmcv-lite with the {self.BACKEND}, which cover nms and '
            'RoIAlign (avg mode) only. Install the compiled mmcv with '
            '`bash tools/install.sh --full-mmcv` (builds mmcv 2.1.0 from source: a C++ '
            'compiler, and nvcc for CUDA ops, are needed).')


class HostVersionError(ImportError):
    """A host library's version is outside what one of vitdense's fixes was written for."""


def require(fix: str, package: str, version: str, written_for: str) -> None:
    """Raise :class:`HostVersionError` unless ``version`` of ``package`` is in ``written_for``."""
    from packaging.specifiers import SpecifierSet
    if not SpecifierSet(written_for).contains(version, prereleases=True):
        raise HostVersionError(
            f'vitdense fix "{fix}" was written for {package}{written_for}, but {package} '
            f'{version} is installed. Install the versions in requirements/constraints.txt '
            '(bash tools/install.sh), or a vitdense release made for this one.')


# --- package look-ups without pkg_resources (mmengine.utils.package_utils) ---------------

def _distribution(package: str) -> metadata.Distribution | None:
    try:
        return metadata.distribution(package)
    except metadata.PackageNotFoundError:
        return None


def is_installed(package: str) -> bool:
    """True if ``package`` is an installed distribution or an importable module."""
    if _distribution(package) is not None:
        return True
    spec = importlib.util.find_spec(package)
    return spec is not None and spec.origin is not None


def package2module(package: str) -> str:
    """Top-level module of an installed distribution ('mmsegmentation' -> 'mmseg')."""
    dist = _distribution(package)
    if dist is None:
        raise metadata.PackageNotFoundError(package)
    top_level = (dist.read_text('top_level.txt') or '').split()
    if top_level:
        return top_level[0]
    packages = sorted({f.parts[0] for f in dist.files or ()
                       if len(f.parts) == 2 and f.name == '__init__.py'})
    if not packages:
        raise ValueError(f'can not infer the module name of {package}')
    return packages[0]


def get_installed_path(package: str) -> str:
    """Directory of ``package`` (distribution name, e.g. 'mmdet' or 'mmsegmentation')."""
    dist = _distribution(package)
    if dist is None:
        spec = importlib.util.find_spec(package)
        if spec is None:
            raise metadata.PackageNotFoundError(package)
        if spec.origin is None:
            raise RuntimeError(f'{package} is a namespace package, which is invalid for '
                               '`get_installed_path`')
        return osp.dirname(spec.origin)
    location = str(dist.locate_file(''))
    possible_path = osp.join(location, package)
    if osp.exists(possible_path):
        return possible_path
    return osp.join(location, package2module(package))


_LOOKUPS = {'is_installed': is_installed, 'package2module': package2module,
            'get_installed_path': get_installed_path}
# Modules that bound the look-ups by name, should they have been imported before the finder.
_LOOKUP_USERS = ('mmengine.utils', 'mmengine.config.config', 'mmengine.hub.hub')


def _patch_package_lookups(package_utils: ModuleType) -> None:
    require('package look-ups without pkg_resources', 'mmengine', metadata.version('mmengine'),
            PACKAGE_LOOKUPS_WRITTEN_FOR)
    vars(package_utils).update(_LOOKUPS)


# --- the finder ---------------------------------------------------------------------------

def _mmcv_ext_spec(real: ModuleSpec | None) -> ModuleSpec | None:
    """``vitdense/compat/mmcv_ext.py`` as ``mmcv._ext`` when mmcv has no compiled one."""
    if real is not None:
        return None
    mmcv = sys.modules['mmcv']
    require('torch-native mmcv ops', 'mmcv', mmcv.__version__, MMCV_EXT_WRITTEN_FOR)
    vitdense = importlib.util.find_spec('vitdense')
    if vitdense is None or not vitdense.submodule_search_locations:
        return None
    path = osp.join(vitdense.submodule_search_locations[0], 'compat', 'mmcv_ext.py')
    return importlib.util.spec_from_file_location('mmcv._ext', path)


class _PatchAfterExec(importlib.abc.Loader):
    """Runs the real loader, then ``patch`` on the new module."""

    def __init__(self, loader: importlib.abc.Loader, patch: Callable[[ModuleType], None]):
        self._loader = loader
        self._patch = patch

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        self._patch(module)

    def __getattr__(self, name: str):  # get_source, get_filename, ... of the real loader
        if name == '_loader':
            raise AttributeError(name)
        return getattr(self._loader, name)


class HostFixFinder(importlib.abc.MetaPathFinder):
    """Meta-path finder applying the two start-up fixes; every other import passes by."""

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> ModuleSpec | None:
        if fullname not in ('mmcv._ext', 'mmengine.utils.package_utils'):
            return None
        real = self._real_spec(fullname, path, target)
        if fullname == 'mmcv._ext':
            return _mmcv_ext_spec(real)
        if real is None or real.loader is None:
            return real
        real.loader = _PatchAfterExec(real.loader, _patch_package_lookups)
        return real

    def _real_spec(self, fullname: str, path: Sequence[str] | None,
                   target: ModuleType | None) -> ModuleSpec | None:
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, 'find_spec'):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                return spec
        return None


def install() -> None:
    """Put the finder first on ``sys.meta_path`` and fix what is already imported (idempotent)."""
    if not any(isinstance(finder, HostFixFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, HostFixFinder())
    package_utils = sys.modules.get('mmengine.utils.package_utils')
    if package_utils is not None:
        _patch_package_lookups(package_utils)
        for name in _LOOKUP_USERS:
            module = sys.modules.get(name)
            for attr, func in _LOOKUPS.items():
                if module is not None and hasattr(module, attr):
                    setattr(module, attr, func)


install()
