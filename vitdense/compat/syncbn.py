"""``SyncBN`` norm configs in CPU processes, the one place vitdense handles them.

Symptom: the papers' recipes (and mmdet / mmseg heads built from them) say
``norm_cfg=dict(type='SyncBN')``, i.e. ``torch.nn.SyncBatchNorm`` (the backbone's own
``norm_cfg=dict(type='SyncBN')`` converts its BatchNorms to it too). Without a process group
torch 2.14 already falls back to plain batch norm, but once one is initialised
(``tools/dist_train.sh`` / ``launcher='pytorch'`` with the gloo backend on a CPU machine,
even with a single process) two things fail: ``DistributedDataParallel`` refuses the model
(``ValueError: SyncBatchNorm layers only work with GPU modules``) and
``SyncBatchNorm.forward`` raises ``ValueError: SyncBatchNorm expected input tensor to be on
GPU ...`` in training mode: torch can only synchronise statistics on accelerators.

Fix: for CPU inputs in training mode with an initialised process group, compute ordinary
(per-process) batch norm with the same running-stat updates, and warn once when the group
has more than one process, since the statistics are then not synchronised; and let DDP wrap
CPU modules holding SyncBatchNorm layers (its check stays for accelerator modules). Configs
are never rewritten: the same config builds the same modules on GPU and CPU machines.
"""
from __future__ import annotations

import warnings

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.parallel import DistributedDataParallel

__all__ = ['apply']

_warned = False


def _needs_local_fallback(module: nn.SyncBatchNorm, x: torch.Tensor) -> bool:
    """True where torch would try (and fail) to synchronise a CPU batch."""
    return (module.training and x.device.type == 'cpu' and dist.is_available()
            and dist.is_initialized())


def _forward(self: nn.SyncBatchNorm, input: torch.Tensor) -> torch.Tensor:
    """SyncBatchNorm.forward that degrades to local batch norm on CPU."""
    if not _needs_local_fallback(self, input):
        return _original_forward(self, input)
    global _warned
    group = self.process_group or dist.group.WORLD
    if not _warned and dist.get_world_size(group) > 1:
        _warned = True
        warnings.warn('SyncBatchNorm on CPU: torch cannot synchronise batch statistics '
                      'across processes without an accelerator; each process normalises '
                      'with its own batch statistics (plain BatchNorm).', stacklevel=2)
    return _BatchNorm.forward(self, input)


def _check_sync_batchnorm(self: DistributedDataParallel, module: nn.Module) -> None:
    """DDP's refusal of SyncBatchNorm layers, skipped for CPU modules (whose layers
    normalise locally, :func:`_forward`)."""
    if self.device_type != 'cpu':
        _original_ddp_check(self, module)


_original_forward = nn.SyncBatchNorm.forward
_original_ddp_check = DistributedDataParallel._passing_sync_batchnorm_handle


def apply() -> None:
    """Install the CPU fallback on ``torch.nn.SyncBatchNorm`` and DDP (idempotent)."""
    nn.SyncBatchNorm.forward = _forward
    DistributedDataParallel._passing_sync_batchnorm_handle = _check_sync_batchnorm
