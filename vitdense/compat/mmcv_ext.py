"""Torch-native stand-in for mmcv's compiled ``mmcv._ext``, for the ops our models call.

Symptom: mmcv 2.1.0 has no wheel for torch 2.14 and its source build needs a C++ compiler
(and nvcc on a GPU machine); ``mmcv-lite`` is the same Python code without ``mmcv._ext``,
and mmdet 3.3 / mmseg 1.2 import ``mmcv.ops``, which loads ``mmcv._ext`` and checks that
every function each op module names exists, so neither imports.

Fix: this module is loaded *as* ``mmcv._ext`` (after :func:`vitdense.compat.apply_host_fixes`)
when no compiled extension is installed.  Of mmcv's compiled functions, the shipped configs
reach only ``nms`` (RPN proposals, ``batched_nms``, ``multiclass_nms``; mmcv's own Python
wrappers run unchanged on top of it) and ``roi_align_forward`` / ``roi_align_backward``
(box and mask RoI extractors, mask targets), as recorded over every shipped dense config's
training and test step by ``tests/configs/test_dense.py``.  They run on torchvision's CPU
and CUDA kernels, which implement the same formulas; ``benchmarks/benchmark_mmcv_ops.py``
measures them against a compiled mmcv.
Every other name resolves to a function that raises :class:`MissingCompiledOpError`
(defined in ``vitdense.compat``, so that it is one class however this file was loaded).
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator, NoReturn

import torch
import torchvision  # noqa: F401  (registers torch.ops.torchvision)
from torch import Tensor

# loaded as mmcv._ext: the finder module is in sys.modules, vitdense itself need not be
from vitdense.compat.mmcv_finder import MissingCompiledOpError

__all__ = ['MissingCompiledOpError', 'IMPLEMENTED', 'nms', 'roi_align_forward',
           'roi_align_backward', 'get_compiler_version', 'get_compiling_cuda_version']

BACKEND = MissingCompiledOpError.BACKEND

# mmcv's pool_mode codes (``RoIAlignFunction``): 0 is max, 1 is avg.
_POOL_AVG = 1


def nms(boxes: Tensor, scores: Tensor, iou_threshold: float, offset: int) -> Tensor:
    """Indices of the boxes kept by greedy NMS, in descending score order (mmcv ``nms``).

    Boxes are visited by descending score, as in mmcv's kernels, and boxes of equal score by
    ascending index (a stable sort: mmcv's kernels sort unstably, which leaves the order of
    ties, and so which of two overlapping equal-score boxes survives, unspecified);
    torchvision's kernel is handed that order as strictly decreasing ranks, so that it
    keeps this order and the kept positions come back ascending.  ``offset=1`` (the legacy pixel
    convention, width ``x2 - x1 + 1``) is the same as moving every box's far corner by one
    pixel.
    """
    if boxes.numel() == 0:
        return boxes.new_empty(0, dtype=torch.long)
    order = scores.sort(stable=True, dim=0, descending=True)[1]
    ordered = boxes.index_select(0, order)
    if offset:
        ordered = torch.cat([ordered[:, :2], ordered[:, 2:4] + offset], dim=1)
    ranks = torch.arange(len(order), 0, -1, device=boxes.device, dtype=ordered.dtype)
    kept = torch.ops.torchvision.nms(ordered, ranks, float(iou_threshold))
    return order[kept]


def _check_avg(op: str, pool_mode: int) -> None:
    if pool_mode != _POOL_AVG:
        raise MissingCompiledOpError(op, " with pool_mode='max'")


def roi_align_forward(input: Tensor, rois: Tensor, output: Tensor, argmax_y: Tensor,
                      argmax_x: Tensor, aligned_height: int, aligned_width: int,
                      spatial_scale: float, sampling_ratio: int, pool_mode: int,
                      aligned: bool) -> None:
    """Average RoIAlign of ``rois`` (K, 5: batch index, x1, y1, x2, y2) into ``output``."""
    _check_avg('roi_align_forward', pool_mode)
    pooled = torch.ops.torchvision.roi_align(
        input, rois.to(input.dtype), float(spatial_scale), int(aligned_height),
        int(aligned_width), int(sampling_ratio), bool(aligned))
    output.copy_(pooled)


@contextlib.contextmanager
def _atomic_adds_allowed(device: torch.device) -> Iterator[None]:
    """Under ``torch.use_deterministic_algorithms(True)``, warn instead of failing on CUDA.

    Both RoIAlign backward kernels, mmcv's and torchvision's, scatter with atomic adds on
    CUDA; mmcv's runs regardless, torchvision's raises in deterministic mode.  Here it runs
    like mmcv's, and torch warns that the result is not deterministic.
    """
    relax = (device.type == 'cuda' and torch.are_deterministic_algorithms_enabled()
             and not torch.is_deterministic_algorithms_warn_only_enabled())
    if relax:
        torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        yield
    finally:
        if relax:
            torch.use_deterministic_algorithms(True)


def roi_align_backward(grad_output: Tensor, rois: Tensor, argmax_y: Tensor, argmax_x: Tensor,
                       grad_input: Tensor, aligned_height: int, aligned_width: int,
                       spatial_scale: float, sampling_ratio: int, pool_mode: int,
                       aligned: bool) -> None:
    """Adds the gradient of average RoIAlign with respect to its input to ``grad_input``."""
    _check_avg('roi_align_backward', pool_mode)
    batch, channels, height, width = grad_input.shape
    with _atomic_adds_allowed(grad_output.device):
        grad = torch.ops.torchvision._roi_align_backward(
            grad_output, rois.to(grad_output.dtype), float(spatial_scale), int(aligned_height),
            int(aligned_width), batch, channels, height, width, int(sampling_ratio),
            bool(aligned))
    grad_input.add_(grad)


def get_compiler_version() -> str:
    """What mmcv reports as the compiler of its ops: here, none."""
    return f'none ({BACKEND})'


def get_compiling_cuda_version() -> str:
    """What mmcv reports as the CUDA its ops were built with: torch's, which runs them."""
    return f'none ({BACKEND}; torch CUDA {torch.version.cuda or "not available"})'


IMPLEMENTED = frozenset(__all__) - {'MissingCompiledOpError', 'IMPLEMENTED'}


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
