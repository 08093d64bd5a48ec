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

The wrapper also gives DDP's gradient buckets one layout from a run's first iteration on, so
that a resumed run repeats the uninterrupted one bit for bit with any number of processes
(:class:`CPUDistributedDataParallel`).
"""
from __future__ import annotations

from typing import Any

import torch
from mmengine.model import MMDistributedDataParallel, revert_sync_batchnorm
from torch import nn

from vitdense.internals import bucket_in_parameter_order, reducer_parameters
from vitdense.registry import MODEL_WRAPPERS


@MODEL_WRAPPERS.register_module()
class CPUDistributedDataParallel(MMDistributedDataParallel):
    """``MMDistributedDataParallel`` for CPU process groups: SyncBN as plain BN, and gradient
    buckets laid out the same in every iteration of every run.

    DDP all-reduces gradients in flat buckets. Its first iteration keeps every parameter in
    one bucket; after it, DDP regroups them by the order their gradients became ready. A gloo
    all-reduce splits a bucket into chunks that each start their sum at another process, so
    with three or more processes an element's sum order, and its last bit, depends on where
    the element lies in its bucket: the first iteration after a resume (one bucket) would
    differ from the same iteration of the uninterrupted run (regrouped). This wrapper has DDP
    regroup before its first forward instead, in reverse module order (last-defined
    parameters first, as backward produces their gradients): the layout depends on the model
    only, so a run adds up each iteration's gradients in the same order whichever iteration
    it started at, with DDP's own all-reduce, and the bucket of the last layers is reduced
    while backward computes the others, from the first iteration on.

    ``device_ids`` is dropped: the Runner passes its local rank as one, which names a GPU.
    """

    def __init__(self, module: nn.Module, **kwargs: Any) -> None:
        kwargs.pop('device_ids', None)
        super().__init__(module=revert_sync_batchnorm(module), device_ids=None, **kwargs)
        bucket_in_parameter_order(self)

    def _build_params_for_reducer(self) -> tuple[list[torch.nn.Parameter], list[bool]]:
        """The reducer's parameters, last defined first: buckets are filled in this order and
        reduced one after another, so the first bucket, ready first in backward, holds the
        last layers. With ``find_unused_parameters=True`` DDP orders its first layout so
        itself and, without ``static_graph``, never regroups: the module order is kept."""
        parameters, expects_sparse_gradient = reducer_parameters(self)
        if self.find_unused_parameters:
            return parameters, expects_sparse_gradient
        return parameters[::-1], expects_sparse_gradient[::-1]
