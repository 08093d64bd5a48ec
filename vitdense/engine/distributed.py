"""Data-parallel training in a CPU process group (gloo), e.g. ``tools/dist_train.sh`` on a
machine without GPUs.

torch synchronises ``SyncBatchNorm`` statistics only on accelerators: on CPU,
``DistributedDataParallel`` refuses a model holding SyncBatchNorm layers (``SyncBatchNorm
layers only work with GPU modules``) and their forward raises in training mode. The papers'
recipes (and mmdet / mmseg heads built from them) say ``norm_cfg=dict(type='SyncBN')``, so
this wrapper turns those layers back into plain batch norm (mmengine's
``revert_sync_batchnorm``: same parameters, buffers and state-dict keys), i.e. each process
normalises with its own batch statistics, and wraps the model without device ids. The config
is not rewritten: the same config builds SyncBatchNorm on GPU machines.
"""
from __future__ import annotations

from typing import Any

from mmengine.model import MMDistributedDataParallel, revert_sync_batchnorm
from torch import nn

from vitdense.registry import MODEL_WRAPPERS


@MODEL_WRAPPERS.register_module()
class CPUDistributedDataParallel(MMDistributedDataParallel):
    """``MMDistributedDataParallel`` for CPU process groups, with SyncBN as plain BN.

    ``device_ids`` is dropped: the Runner passes its local rank as one, which names a GPU.
    """

    def __init__(self, module: nn.Module, **kwargs: Any) -> None:
        kwargs.pop('device_ids', None)
        super().__init__(module=revert_sync_batchnorm(module), device_ids=None, **kwargs)
