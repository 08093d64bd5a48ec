"""The import finder that serves ``compat/mmcv_ext.py`` as ``mmcv._ext`` under mmcv-lite, and
the loader of the ops it serves.

This module imports nothing but the standard library, so that the start-up file of the
``vitdense-mmcv-ext`` distribution (``packaging/vitdense-mmcv-ext``, installed by pip beside
mmcv-lite) can load it in every interpreter without importing torch or the ``vitdense``
package. The finder answers one import, ``mmcv._ext``, and only when mmcv-lite is the
installed mmcv, no other finder has a compiled ``mmcv._ext`` and mmcv's version is one the ops
were written for; until something imports ``mmcv.ops`` it does nothing.
"""
from __future__ import annotations

import importlib.util
import os.path as osp
import sys
import warnings
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType

MMCV_EXT_WRITTEN_FOR = '>=2.0.0,<2.2.0'   # op signatures of mmcv 2.1.0


class MissingCompiledOpError(NotImplementedError):
    """An mmcv op that needs mmcv's compiled extension, which is not installed."""

    BACKEND = 'vitdense torch-native mmcv ops (torch and torchvision kernels)'

    def __init__(self, op: str, detail: str = '') -> None:
        self.op = op
        super().__init__(
            f"mmcv op '{op}'{detail} needs mmcv's compiled extension, which is not installed: "
            f'this environment runs mmcv-lite with the {self.BACKEND}, which cover nms, '
            'soft-NMS, nms_match, RoIAlign, the focal losses, multi-scale deformable '
            "attention, (modulated) deformable and masked convolution and PSANet's masks only "
            '(docs/mmcv_ops.md). Install the compiled mmcv with `bash tools/install.sh '
            '--full-mmcv` (builds mmcv 2.1.0 from source: a C++ compiler, and nvcc for CUDA '
            'ops, are needed).')


def written_for(fix: str, package: str, installed: str, versions: str) -> bool:
    """Whether ``installed`` (a version of ``package``) is in ``versions``; warn naming
    ``fix`` if not."""
    from packaging.specifiers import SpecifierSet
    if SpecifierSet(versions).contains(installed, prereleases=True):
        return True
    warnings.warn(f'vitdense host fix "{fix}" is off: it was written for {package}'
                  f'{versions} and {package} {installed} is installed', stacklevel=3)
    return False


def _mmcv_lite_installed() -> bool:
    """Whether the installed mmcv distribution is mmcv-lite (mmcv without compiled ops)."""
    from importlib.metadata import PackageNotFoundError, distribution
    try:
        distribution('mmcv-lite')
    except PackageNotFoundError:
        return False
    return True


class _MmcvExtFinder:
    """Serves ``compat/mmcv_ext.py`` as ``mmcv._ext`` where mmcv-lite has no compiled one."""

    def __init__(self) -> None:
        self._asking_others = False  # other finders that ask the whole meta path ask us too

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> ModuleSpec | None:
        if fullname != 'mmcv._ext' or self._asking_others or not _mmcv_lite_installed():
            return None
        self._asking_others = True
        try:
            compiled = any(finder.find_spec(fullname, path, target) is not None
                           for finder in sys.meta_path
                           if finder is not self and hasattr(finder, 'find_spec'))
        finally:
            self._asking_others = False
        if compiled or not written_for('torch-native mmcv ops', 'mmcv',
                                       sys.modules['mmcv'].__version__, MMCV_EXT_WRITTEN_FOR):
            return None
        return importlib.util.spec_from_file_location(
            'mmcv._ext', osp.join(osp.dirname(__file__), 'mmcv_ext.py'))


def load_module(name: str) -> ModuleType:
    """The vitdense module ``name`` (``vitdense.compat.ops.nms``), imported from its file
    without importing the ``vitdense`` package (``mmcv._ext`` loads its ops so), unless it
    is imported already.  Its own imports of vitdense modules must be loaded before it."""
    if name not in sys.modules:
        root = osp.dirname(osp.dirname(osp.abspath(__file__)))
        spec = importlib.util.spec_from_file_location(
            name, osp.join(root, *name.split('.')[1:]) + '.py')
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[name]
            raise
    return sys.modules[name]


def register() -> None:
    """Put the finder first on ``sys.meta_path`` unless it is there (idempotent)."""
    if not any(isinstance(finder, _MmcvExtFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _MmcvExtFinder())

