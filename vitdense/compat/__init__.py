"""Fixes vitdense makes to host libraries: installed or applied on request, never on import.

``import vitdense`` and ``import vitdense.models`` register vitdense's modules and change
nothing in torch, mmengine, mmcv or the OpenMMLab libraries. What the shipped configs need
from a Runner (safe checkpoint loading, atomic saves, SyncBN in CPU process groups) goes
through the hosts' own extension points: ``vitdense.SafeCheckpointHook`` named in the configs
and ``vitdense.CPUDistributedDataParallel`` chosen by ``vitdense/engine/launch.py``. What is
left has to change a host library and is listed here:

=========================  =====================  ======================================
fix                        written for            applied by
=========================  =====================  ======================================
torch-native mmcv ops:     mmcv-lite >=2.0.0,     the start-up file ``vitdense-mmcv-ext.pth``
``compat/mmcv_ext.py``     <2.2.0 without a       of the ``vitdense-mmcv-ext`` distribution
serves ``mmcv._ext``       compiled ``mmcv._ext`` (``packaging/vitdense-mmcv-ext``; pip
under ``mmcv-lite``                               installs it with ``vitdense[openmmlab]``
(nms, RoIAlign, focal                             and removes it with ``pip uninstall``):
losses, deformable                                every interpreter of the environment;
attention and convs,                              :func:`apply_host_fixes` (every vitdense
...: ``docs/mmcv_ops.md``)                        tool, before it imports a host);
                                                  ``python -m vitdense.compat SCRIPT ARGS``
=========================  =====================  ======================================

All three register the one finder of ``mmcv_finder.py``, which answers nothing but the import
of ``mmcv._ext``. With another mmcv version the fix is off, with a warning naming it, and
mmcv's own import error follows; a compiled ``mmcv._ext`` is always used when installed.
mmengine 0.10 finds the packages behind ``mmdet::`` / ``mmseg::`` config bases with
``pkg_resources``: that is no patch but a constraint, ``setuptools<81`` (``setup.py``).
"""
from __future__ import annotations

from .mmcv_finder import MMCV_EXT_WRITTEN_FOR, MissingCompiledOpError, register

__all__ = ['MissingCompiledOpError', 'MMCV_EXT_WRITTEN_FOR', 'apply_host_fixes']


def apply_host_fixes() -> None:
    """Apply every fix of the table above (idempotent); call it before importing mmcv.ops.

    Where ``vitdense-mmcv-ext`` is installed its start-up file has registered the mmcv finder
    already."""
    register()
