"""Torch-native stand-in for mmcv's compiled ``mmcv._ext``, for the ops the hosts' heads call.

Symptom: mmcv 2.1.0 has no wheel for torch 2.14 and its source build needs a C++ compiler
(and nvcc on a GPU machine); ``mmcv-lite`` is the same Python code without ``mmcv._ext``,
and mmdet 3.3 / mmseg 1.2 import ``mmcv.ops``, which loads ``mmcv._ext`` and checks that
every function each op module names exists, so neither imports.

Fix: this module is loaded *as* ``mmcv._ext`` (after :func:`vitdense.compat.apply_host_fixes`)
when no compiled extension is installed.  It serves, on any device, the compiled functions
that mmdet's and mmseg's shipped configs reach and that torch or torchvision compute exactly
(``docs/mmcv_ops.md`` has the inventory): ``nms``, soft-NMS, ``nms_match``,
RoIAlign (average and max pooling), the sigmoid and softmax focal losses, multi-scale
deformable attention, deformable and modulated deformable convolution, masked
convolution and PSANet's attention masks.  Each function
takes the arguments mmcv's Python wrappers pass to the compiled one and writes the output and
gradient buffers it is handed in place, as the CUDA kernels do; it computes in the dtypes it is
given, outside autocast and autograd, as a compiled kernel does.

This module is the table: it loads ``vitdense/compat/ops/<kind>.py`` (one module per op
kind, each naming the functions it serves in ``__all__``) from their files, without
importing the ``vitdense`` package, and serves their functions under mmcv's names.
Every other name resolves to a function that raises :class:`MissingCompiledOpError`
(defined in ``vitdense.compat``, so that it is one class however this file was loaded).
"""
from __future__ import annotations

from typing import Any, Callable, NoReturn

import torch

# loaded as mmcv._ext: the finder module is in sys.modules, vitdense itself need not be
from vitdense.compat.mmcv_finder import MissingCompiledOpError, load_module

BACKEND = MissingCompiledOpError.BACKEND

#: what the op modules import of vitdense, loaded before them
_SHARED = ('vitdense.compat.ops.kernel', 'vitdense.models.layers.deformable_sampling')
#: the op kinds served, one module of ``vitdense/compat/ops`` each
KINDS = ('nms', 'roi_align', 'focal_loss', 'ms_deform_attn', 'deform_conv', 'masked_conv',
         'psamask')


def get_compiler_version() -> str:
    """What mmcv reports as the compiler of its ops: here, none."""
    return f'none ({BACKEND})'


def get_compiling_cuda_version() -> str:
    """What mmcv reports as the CUDA its ops were built with: torch's, which runs them."""
    return f'none ({BACKEND}; torch CUDA {torch.version.cuda or "not available"})'


def _served() -> dict[str, Callable[..., Any]]:
    """mmcv's name -> the function serving it, of every op kind and the version queries."""
    for name in _SHARED:
        load_module(name)
    served: dict[str, Callable[..., Any]] = dict(
        get_compiler_version=get_compiler_version,
        get_compiling_cuda_version=get_compiling_cuda_version)
    for kind in KINDS:
        module = load_module(f'vitdense.compat.ops.{kind}')
        served.update((name, getattr(module, name)) for name in module.__all__)
    return served


SERVED = _served()
IMPLEMENTED = frozenset(SERVED)
globals().update(SERVED)
__all__ = ['MissingCompiledOpError', 'IMPLEMENTED', 'SERVED', *sorted(SERVED)]


def _missing(name: str) -> Callable[..., NoReturn]:
    def missing_op(*args: Any, **kwargs: Any) -> NoReturn:
        raise MissingCompiledOpError(name)
    missing_op.__name__ = missing_op.__qualname__ = name
    return missing_op


def __getattr__(name: str) -> Callable[..., NoReturn]:
    """Any other op name exists (``mmcv.ops`` checks them at import) and raises when called.

    Dunder names are not ops: answering them would make this module look like something it
    is not to ``pickle``, ``inspect`` and import machinery.
    """
    if name.startswith('__') and name.endswith('__'):
        raise AttributeError(name)
    return _missing(name)
