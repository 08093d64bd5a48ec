"""``norm_cfg=dict(type='SyncBN')`` heads train in a CPU process, with or without a process
group."""
from __future__ import annotations

import warnings

import pytest
import torch
import torch.distributed as dist
from mmdet.registry import MODELS as MMDET_MODELS
from mmengine.registry import DefaultScope
from mmengine.structures import PixelData
from mmseg.registry import MODELS as MMSEG_MODELS
from mmseg.structures import SegDataSample

from vitdense.compat import syncbn


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


def _same_as_batchnorm() -> None:
    torch.manual_seed(0)
    sync = _fcn_head('SyncBN').train()
    plain = _fcn_head('BN').train()
    plain.load_state_dict(sync.state_dict())
    assert isinstance(sync.convs[0].bn, torch.nn.SyncBatchNorm)
    feats = torch.randn(2, 8, 8, 8)
    torch.testing.assert_close(_seg_step(sync, feats), _seg_step(plain, feats))
    torch.testing.assert_close(sync.convs[0].bn.running_mean, plain.convs[0].bn.running_mean)
    torch.testing.assert_close(sync.conv_seg.weight, plain.conv_seg.weight)


def test_mmseg_head_with_syncbn_trains_in_cpu_process_group(gloo_group):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        _same_as_batchnorm()
    assert not [w for w in caught if 'synchronise' in str(w.message)]  # one process: no warning


def test_mmseg_head_with_syncbn_trains_without_process_group():
    assert not dist.is_initialized()
    _same_as_batchnorm()


def test_mmdet_fpn_with_syncbn_trains_in_cpu_process_group(gloo_group):
    with DefaultScope.overwrite_default_scope('mmdet'):
        fpn = MMDET_MODELS.build(dict(type='FPN', in_channels=[4, 8], out_channels=8, num_outs=2,
                                      norm_cfg=dict(type='SyncBN', requires_grad=True))).train()
    outs = fpn([torch.randn(2, 4, 8, 8), torch.randn(2, 8, 4, 4)])
    sum(o.square().mean() for o in outs).backward()
    assert fpn.fpn_convs[0].bn.num_batches_tracked.item() == 1
    assert fpn.lateral_convs[0].conv.weight.grad is not None


def test_multi_process_cpu_group_warns_once(gloo_group, monkeypatch):
    monkeypatch.setattr(syncbn, '_warned', False)
    monkeypatch.setattr(dist, 'get_world_size', lambda group=None: 2)
    bn = torch.nn.SyncBatchNorm(4).train()
    x = torch.randn(3, 4, 2, 2)
    with pytest.warns(UserWarning, match='cannot synchronise'):
        y = bn(x)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        bn(x)
    assert not caught
    reference = torch.nn.BatchNorm2d(4).train()
    torch.testing.assert_close(y, reference(x))


def test_eval_mode_uses_running_statistics(gloo_group):
    bn = torch.nn.SyncBatchNorm(2).eval()
    bn.running_mean.fill_(1.0)
    x = torch.ones(2, 2, 3, 3)
    torch.testing.assert_close(bn(x), torch.zeros_like(x), atol=1e-6, rtol=0)


def test_ddp_wraps_and_trains_a_cpu_model_with_syncbn(gloo_group):
    """What ``tools/dist_train.sh`` on a CPU machine builds: DDP around SyncBN layers, no
    config rewritten; a step matches plain BatchNorm."""
    torch.manual_seed(0)
    sync = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 1), torch.nn.SyncBatchNorm(4))
    plain = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 1), torch.nn.BatchNorm2d(4))
    plain.load_state_dict(sync.state_dict())
    wrapped = torch.nn.parallel.DistributedDataParallel(sync)
    x = torch.randn(2, 3, 4, 4)
    wrapped(x).square().mean().backward()
    plain(x).square().mean().backward()
    torch.testing.assert_close(sync[0].weight.grad, plain[0].weight.grad)
    torch.testing.assert_close(sync[1].running_var, plain[1].running_var)
