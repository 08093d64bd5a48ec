"""Fixes vitdense makes to host libraries: applied only on request, never on import.

``import vitdense`` and ``import vitdense.models`` register vitdense's modules and change
nothing in torch, mmengine, mmcv or the OpenMMLab libraries. What the shipped configs need
from a Runner (safe checkpoint loading, atomic saves, SyncBN in CPU process groups) goes
through the hosts' own extension points: ``vitdense.SafeCheckpointHook`` named in the configs
and ``vitdense.CPUDistributedDataParallel`` chosen by ``vitdense/engine/launch.py``. What is left
has to change a host library and is listed here:

=========================  =====================  ======================================
fix                        written for            applied by
=========================  =====================  ======================================
torch-native mmcv ops:     mmcv >=2.0.0,<2.2.0    :func:`apply_host_fixes`, which every
``compat/mmcv_ext.py``     without a compiled     vitdense tool calls before it imports
serves ``mmcv._ext``       ``mmcv._ext``          mmdet / mmseg / mmpretrain; for other
(nms, RoIAlign) under                             scripts (mmdet's or mmseg's own
``mmcv-lite``                                     ``tools/train.py``):
                                                  ``python -m vitdense.compat SCRIPT ARGS``
=========================  =====================  ======================================

With another mmcv version the fix is off, with a warning naming it, and mmcv's own import
error follows; a compiled ``mmcv._ext`` is always used when installed. mmengine 0.10 finds
the packages behind ``mmdet::`` / ``mmseg::`` config bases with ``pkg_resources``: that is no
patch but a constraint, ``setuptools<81`` (``setup.py``).
"""
from __future__ import annotations

import importlib.abc
import importlib.util
import os.path as osp
import sys
import warnings
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Sequence

__all__ = ['MissingCompiledOpError', 'MMCV_EXT_WRITTEN_FOR', 'apply_host_fixes']

MMCV_EXT_WRITTEN_FOR = '>=2.0.0,<2.2.0'   # op signatures of mmcv 2.1.0


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


def _written_for(fix: str, package: str, installed: str, written_for: str) -> bool:
    """Whether ``installed`` (a version of ``package``) is in ``written_for``; warn naming
    ``fix`` if not."""
    from packaging.specifiers import SpecifierSet
    if SpecifierSet(written_for).contains(installed, prereleases=True):
        return True
    warnings.warn(f'vitdense host fix "{fix}" is off: it was written for {package}'
                  f'{written_for} and {package} {installed} is installed', stacklevel=3)
    return False


class _MmcvExtFinder(importlib.abc.MetaPathFinder):
    """Serves ``compat/mmcv_ext.py`` as ``mmcv._ext`` when mmcv has no compiled one."""

    def __init__(self) -> None:
        self._asking_others = False  # other finders that ask the whole meta path ask us too

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> ModuleSpec | None:
        if fullname != 'mmcv._ext' or self._asking_others:
            return None
        self._asking_others = True
        try:
            compiled = any(finder.find_spec(fullname, path, target) is not None
                           for finder in sys.meta_path
                           if finder is not self and hasattr(finder, 'find_spec'))
        finally:
            self._asking_others = False
        if compiled or not _written_for('torch-native mmcv ops', 'mmcv',
                                        sys.modules['mmcv'].__version__, MMCV_EXT_WRITTEN_FOR):
            return None
        return importlib.util.spec_from_file_location(
            'mmcv._ext', osp.join(osp.dirname(__file__), 'mmcv_ext.py'))


def apply_host_fixes() -> None:
    """Apply every fix of the table above (idempotent); call it before importing mmcv.ops."""
    if not any(isinstance(finder, _MmcvExtFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _MmcvExtFinder())
