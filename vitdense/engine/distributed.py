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

The wrapper also makes the gradient average independent of how DDP groups gradients into
buckets (:func:`sum_in_rank_order`), so that a resumed run repeats the uninterrupted one bit
for bit with any number of processes.
"""
# No ``from __future__ import annotations``: DDP checks a communication hook's annotations
# against ``dist.GradBucket`` and ``torch.futures.Future[torch.Tensor]`` as objects.
from typing import Any

import torch
import torch.distributed as dist
from mmengine.model import MMDistributedDataParallel, revert_sync_batchnorm
from torch import nn

from vitdense.registry import MODEL_WRAPPERS


def sum_in_rank_order(group: dist.ProcessGroup | None,
                      bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: the processes' mean gradient, added up in rank order.

    DDP reduces gradients in flat buckets. Its first iteration puts every parameter in one
    bucket in parameter order; after it, DDP regroups them by the order their gradients
    became ready. A gloo all-reduce splits a bucket into chunks that each start their sum at
    another process, so with three or more processes an element's sum order, and its last
    bit, depends on where the element lies in its bucket: the first iteration after a
    resume (initial layout) then differs from the same iteration of the uninterrupted run
    (regrouped layout). Gathering every process's bucket and adding the parts in rank order
    gives ``(g_0 + g_1 + ... + g_{n-1})`` for every element whatever the layout, bucket size
    or collective algorithm. Each part is divided by the number of processes first, as DDP's
    own reduction does, so with two processes the result equals DDP's. Cost: each process
    receives n buckets where a ring all-reduce moves about two. (``find_unused_parameters=
    True`` also keeps the first layout, but walks the autograd graph every iteration and
    hides parameters that get no gradient.)
    """
    world_size = dist.get_world_size(group)
    buffer = bucket.buffer().div_(world_size)
    parts = [torch.empty_like(buffer) for _ in range(world_size)]
    gathered = dist.all_gather(parts, buffer, group=group, async_op=True).get_future()

    def add_in_rank_order(_: torch.futures.Future) -> torch.Tensor:
        buffer.copy_(parts[0])
        for part in parts[1:]:
            buffer.add_(part)
        return buffer
    return gathered.then(add_in_rank_order)


@MODEL_WRAPPERS.register_module()
class CPUDistributedDataParallel(MMDistributedDataParallel):
    """``MMDistributedDataParallel`` for CPU process groups, with SyncBN as plain BN and
    gradients averaged in rank order (:func:`sum_in_rank_order`).

    ``device_ids`` is dropped: the Runner passes its local rank as one, which names a GPU.
    """

    def __init__(self, module: nn.Module, **kwargs: Any) -> None:
        kwargs.pop('device_ids', None)
        super().__init__(module=revert_sync_batchnorm(module), device_ids=None, **kwargs)
        self.register_comm_hook(self.process_group, sum_in_rank_order)
