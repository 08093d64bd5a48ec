"""``norm_cfg=dict(type='SyncBN')`` models train in a CPU process group when wrapped by
``vitdense.CPUDistributedDataParallel`` (what vitdense/engine/launch.py picks without CUDA), and
torch's own SyncBatchNorm and DDP are left as they are. With four processes the wrapper's
gradient is the mean of the processes' gradients and a run resumed mid-way ends with the
uninterrupted run's weights bit for bit, where torch's DDP differs in the last bits."""
from __future__ import annotations

import copy
from pathlib import Path

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


WORLD_SIZE, ITERATIONS, RESUME_AFTER = 4, 4, 2


def _mlp() -> nn.Module:
    """Some thousand weights, so that a sum of four processes' gradients in another order
    changes last bits."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                         nn.Linear(64, 1))


def _loss(model: nn.Module, rank: int, iteration: int) -> torch.Tensor:
    inputs = torch.randn(8, 16, generator=torch.Generator().manual_seed(100 * iteration + rank))
    return model(inputs).square().mean()


def _train(wrapper: type, rank: int, first: int, state: dict | None = None) -> dict:
    """Iterations ``first`` to the last of SGD with momentum, from ``state`` (weights and
    optimizer) or from the seed; returns the final flat weights, the reduced gradient of
    iteration 0 and the state after iteration ``RESUME_AFTER - 1``."""
    model = _mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    if state is not None:
        model.load_state_dict(state['model'])
        optimizer.load_state_dict(state['optimizer'])
    wrapped, result = wrapper(model), {}
    for iteration in range(first, ITERATIONS):
        optimizer.zero_grad()
        _loss(wrapped, rank, iteration).backward()
        if iteration == 0:
            result['gradient'] = torch.cat([p.grad.flatten() for p in model.parameters()])
        optimizer.step()
        if iteration == RESUME_AFTER - 1:
            result['state'] = dict(model={k: v.clone() for k, v in model.state_dict().items()},
                                   optimizer=copy.deepcopy(optimizer.state_dict()))
    result['weights'] = torch.cat([p.detach().flatten() for p in model.parameters()])
    return result


def _rank_of_four(rank: int, init_method: str, out: str) -> None:
    """One process of four (forked): our wrapper and torch's DDP, each run through and
    resumed after ``RESUME_AFTER`` iterations, and this process's own gradient of iteration 0."""
    torch.set_num_threads(1)
    dist.init_process_group('gloo', init_method=init_method, rank=rank, world_size=WORLD_SIZE)
    model = _mlp()
    _loss(model, rank, 0).backward()
    results = dict(own_gradient=torch.cat([p.grad.flatten() for p in model.parameters()]))
    for name, wrapper in (('ours', CPUDistributedDataParallel),
                          ('torch', DistributedDataParallel)):
        full = _train(wrapper, rank, 0)
        resumed = _train(wrapper, rank, RESUME_AFTER, full.pop('state'))
        results[name] = dict(full=full, resumed=resumed['weights'])
    torch.save(results, Path(out) / f'rank{rank}.pth')
    dist.destroy_process_group()


def test_four_processes_mean_gradient_and_exact_resume(tmp_path):
    mp.start_processes(_rank_of_four, args=(f'file://{tmp_path}/pg', str(tmp_path)),
                       nprocs=WORLD_SIZE, start_method='fork')
    ranks = [torch.load(tmp_path / f'rank{r}.pth', weights_only=True) for r in range(WORLD_SIZE)]
    mean = torch.stack([r['own_gradient'].double() for r in ranks]).mean(0)
    for rank in ranks:
        torch.testing.assert_close(rank['ours']['full']['gradient'].double(), mean,
                                   rtol=1e-6, atol=1e-9)
        assert torch.equal(rank['ours']['full']['weights'], ranks[0]['ours']['full']['weights'])
        assert torch.equal(rank['ours']['resumed'], rank['ours']['full']['weights'])
    # The premise: torch's DDP regroups its buckets after its first iteration, so its first
    # iteration after a resume adds the four gradients up in another order.
    assert not torch.equal(ranks[0]['torch']['resumed'], ranks[0]['torch']['full']['weights'])
