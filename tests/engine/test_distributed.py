"""``norm_cfg=dict(type='SyncBN')`` models train in a CPU process group when wrapped by
``vitdense.CPUDistributedDataParallel`` (what vitdense/engine/launch.py picks without CUDA), and
torch's own SyncBatchNorm and DDP are left as they are."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from mmengine.registry import MODEL_WRAPPERS, DefaultScope
from mmengine.structures import PixelData
from mmseg.registry import MODELS as MMSEG_MODELS
from mmseg.structures import SegDataSample
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
