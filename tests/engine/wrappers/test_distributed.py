"""``norm_cfg=dict(type='SyncBN')`` models train in a CPU process group when wrapped by
``vitdense.CPUDistributedDataParallel`` (what vitdense/engine/launch.py picks without CUDA), and
torch's own SyncBatchNorm and DDP are left as they are. The wrapper's gradient buckets keep one
layout from the first iteration on, last layers first; with three and four processes its
gradient is the mean of the processes' gradients and a run resumed mid-way ends with the
uninterrupted run's weights bit for bit, where torch's DDP differs in the last bits."""
from __future__ import annotations

import copy
from functools import partial
from pathlib import Path
from typing import Callable

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from mmengine.registry import MODEL_WRAPPERS, DefaultScope
from mmengine.structures import PixelData
from mmseg.registry import MODELS as MMSEG_MODELS
from mmseg.structures import SegDataSample
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from vitdense.engine import CPUDistributedDataParallel

from common import bucket_layouts


@pytest.fixture
def gloo_group(tmp_path):
    """A one-process gloo group: what ``launcher='pytorch'`` sets up on a CPU machine."""
    dist.init_process_group('gloo', init_method=f'file://{tmp_path}/pg', rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _fcn_head(norm: str):
    with DefaultScope.overwrite_default_scope('mmseg'):  # other tests may leave another scope
        return MMSEG_MODELS.build(dict(
            type='FCNHead', in_channels=8, channels=8, num_convs=1, num_classes=3,
            dropout_ratio=0.0, norm_cfg=dict(type=norm, requires_grad=True), align_corners=False,
            loss_decode=dict(type='CrossEntropyLoss', loss_weight=1.0)))


def _seg_step(head, feats: torch.Tensor) -> torch.Tensor:
    """One SGD step of the head on a 2-image batch; returns the loss."""
    samples = []
    for i in range(feats.shape[0]):
        sample = SegDataSample(metainfo=dict(img_shape=(16, 16), pad_shape=(16, 16)))
        sample.gt_sem_seg = PixelData(data=torch.full((1, 16, 16), i % 3, dtype=torch.long))
        samples.append(sample)
    optim = torch.optim.SGD(head.parameters(), lr=0.1)
    loss = head.loss((feats,), samples, train_cfg={})['loss_ce']
    loss.backward()
    optim.step()
    return loss.detach()


def test_torch_refuses_syncbn_on_cpu_without_the_wrapper(gloo_group):
    # The premise: torch synchronises batch statistics only on accelerators.
    with pytest.raises(ValueError, match='SyncBatchNorm layers only work with GPU modules'):
        DistributedDataParallel(_fcn_head('SyncBN'))


def test_wrapped_syncbn_head_trains_as_batchnorm(gloo_group):
    torch.manual_seed(0)
    sync = _fcn_head('SyncBN').train()
    plain = _fcn_head('BN').train()
    plain.load_state_dict(sync.state_dict())
    assert isinstance(sync.convs[0].bn, torch.nn.SyncBatchNorm)
    wrapped = MODEL_WRAPPERS.build(dict(type='vitdense.CPUDistributedDataParallel',
                                        device_ids=[0]), default_args=dict(module=sync))
    assert isinstance(wrapped, CPUDistributedDataParallel)
    head = wrapped.module
    assert not any(isinstance(m, torch.nn.SyncBatchNorm) for m in head.modules())
    assert head.state_dict().keys() == plain.state_dict().keys()
    feats = torch.randn(2, 8, 8, 8)
    torch.testing.assert_close(_seg_step(head, feats), _seg_step(plain, feats))
    torch.testing.assert_close(head.convs[0].bn.running_mean, plain.convs[0].bn.running_mean)
    torch.testing.assert_close(head.conv_seg.weight, plain.conv_seg.weight)
    assert wrapped.device_ids is None


ITERATIONS, RESUME_AFTER = 4, 2


class OutputFirst(nn.Module):
    """Some thousand weights, so that a sum of several processes' gradients in another order
    changes last bits. The output layer is defined before the layers it follows, so the order
    backward makes gradients ready in is not the reverse of the module order."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.output = nn.Linear(64, 1)
        self.hidden = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU())

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.output(self.hidden(inputs))


def _loss(model: nn.Module, rank: int, iteration: int) -> torch.Tensor:
    inputs = torch.randn(8, 16, generator=torch.Generator().manual_seed(100 * iteration + rank))
    return model(inputs).square().mean()


def _train(wrapper: Callable[[nn.Module], nn.Module], rank: int, first: int,
           state: dict | None = None) -> dict:
    """Iterations ``first`` to the last of SGD with momentum, from ``state`` (weights and
    optimizer) or from the seed; returns the final flat weights, the reduced gradients of
    iterations 0 and ``RESUME_AFTER`` and the state after iteration ``RESUME_AFTER - 1``."""
    model = OutputFirst()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    if state is not None:
        model.load_state_dict(state['model'])
        optimizer.load_state_dict(state['optimizer'])
    wrapped, result = wrapper(model), {}
    for iteration in range(first, ITERATIONS):
        optimizer.zero_grad()
        _loss(wrapped, rank, iteration).backward()
        if iteration in (0, RESUME_AFTER):
            result[iteration] = torch.cat([p.grad.flatten() for p in model.parameters()])
        optimizer.step()
        if iteration == RESUME_AFTER - 1:
            result['state'] = dict(model={k: v.clone() for k, v in model.state_dict().items()},
                                   optimizer=copy.deepcopy(optimizer.state_dict()))
    result['weights'] = torch.cat([p.detach().flatten() for p in model.parameters()])
    return result


WRAPPERS = {'ours': CPUDistributedDataParallel,
            'ours_find_unused': partial(CPUDistributedDataParallel, find_unused_parameters=True),
            'torch': DistributedDataParallel}


def _rank_of_group(rank: int, world_size: int, init_method: str, out: str) -> None:
    """One process of the group (forked): each wrapper run through and resumed after
    ``RESUME_AFTER`` iterations, and this process's own gradient of iteration 0."""
    torch.set_num_threads(1)
    dist.init_process_group('gloo', init_method=init_method, rank=rank, world_size=world_size)
    model = OutputFirst()
    _loss(model, rank, 0).backward()
    results = dict(own_gradient=torch.cat([p.grad.flatten() for p in model.parameters()]))
    for name, wrapper in WRAPPERS.items():
        full = _train(wrapper, rank, 0)
        resumed = _train(wrapper, rank, RESUME_AFTER, full.pop('state'))
        results[name] = dict(full=full, resumed=resumed)
    torch.save(results, Path(out) / f'rank{rank}.pth')
    dist.destroy_process_group()


@pytest.mark.parametrize('world_size', [3, 4])
def test_mean_gradient_and_exact_resume(tmp_path, world_size):
    mp.start_processes(_rank_of_group, args=(world_size, f'file://{tmp_path}/pg', str(tmp_path)),
                       nprocs=world_size, start_method='fork')
    ranks = [torch.load(tmp_path / f'rank{r}.pth', weights_only=True) for r in range(world_size)]
    mean = torch.stack([r['own_gradient'].double() for r in ranks]).mean(0)
    for name in ('ours', 'ours_find_unused'):
        for rank in ranks:
            full, resumed = rank[name]['full'], rank[name]['resumed']
            torch.testing.assert_close(full[0].double(), mean, rtol=1e-6, atol=1e-9)
            assert torch.equal(full['weights'], ranks[0][name]['full']['weights'])
            assert torch.equal(resumed[RESUME_AFTER], full[RESUME_AFTER]), name
            assert torch.equal(resumed['weights'], full['weights']), name
    # The premise: torch's DDP regroups its buckets after its first iteration, so its first
    # iteration after a resume adds the gradients up in another order.
    full, resumed = ranks[0]['torch']['full'], ranks[0]['torch']['resumed']
    assert not torch.equal(resumed[RESUME_AFTER], full[RESUME_AFTER])


class Layers(nn.Module):
    """Eight 256 x 256 layers (2 MiB of gradients: several buckets of 0.5 MiB)."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.Sequential(*[nn.Linear(256, 256) for _ in range(8)])

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.layers(inputs)


@pytest.mark.parametrize('options', [{}, dict(find_unused_parameters=True)])
def test_buckets_keep_one_layout_last_layers_first(gloo_group, options):
    model = Layers()
    names = {p: name for name, p in model.named_parameters()}
    wrapped = CPUDistributedDataParallel(model, bucket_cap_mb=0.5, **options)
    layouts = bucket_layouts(wrapped, torch.randn(2, 256), iterations=3)
    assert layouts[0] == layouts[1] == layouts[2]
    assert len(layouts[0]) > 1 and sorted(sum(layouts[0], [])) == sorted(names.values())
    assert 'layers.7.bias' in layouts[0][0]  # ready first in backward
    assert 'layers.0.weight' in layouts[0][-1]
    # The premise: torch's DDP starts with one bucket and regroups after the first iteration.
    model = Layers()
    names = {p: name for name, p in model.named_parameters()}
    torch_layouts = bucket_layouts(DistributedDataParallel(model, bucket_cap_mb=0.5),
                                   torch.randn(2, 256), iterations=2)
    assert len(torch_layouts[0]) == 1 and torch_layouts[1] != torch_layouts[0]
