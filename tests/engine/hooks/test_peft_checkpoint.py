"""PeftCheckpointHook: a LoRA run's checkpoints leave the frozen base out (a tenth of the
size here) and name it by path and checksum; resuming from them repeats the uninterrupted
run bit for bit; a base other than the one trained on is refused."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import pytest
import torch
from mmengine.model import BaseModule
from mmengine.runner import Runner
from torch import nn
from torch.utils.data import Dataset

from benchmarks.peft_checkpoint_size import checkpoint_bytes
from vitdense.checkpoint_io import safe_load
from vitdense.engine.hooks.peft_checkpoint import META_KEY, file_sha256
from vitdense.registry import MODELS

from common import TINY_BACKBONES, RegressToOne, perturb_

TRUNK = dict(TINY_BACKBONES['vit'], arch=dict(embed_dims=64, num_layers=4, num_heads=2),
             img_size=32, patch_size=8, pyramid=False, out_indices=(-1,))


class Images(Dataset):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> dict:
        return dict(inputs=torch.randn(3, 32, 32, generator=torch.Generator().manual_seed(i)))


class Dense(BaseModule):
    """A backbone and a head; a BaseModule, so that the Runner's init_weights loads the base."""

    def __init__(self, base: Path, peft: dict | None) -> None:
        super().__init__()
        self.backbone = MODELS.build(dict(
            TRUNK, peft=peft, init_cfg=dict(type='Pretrained', checkpoint=str(base))))
        self.head = nn.Conv2d(64, 1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(x)[0]).mean((1, 2, 3))


def runner(work_dir: Path, base: Path, max_iters: int,
           peft: dict | None = dict(type='LoRA', r=2, alpha=4), **kwargs) -> Runner:
    return Runner(
        model=RegressToOne(Dense(base, peft)), work_dir=str(work_dir),
        train_dataloader=dict(dataset=Images(), batch_size=2,
                              collate_fn=dict(type='default_collate'),
                              sampler=dict(type='DefaultSampler', shuffle=False)),
        optim_wrapper=dict(optimizer=dict(type='AdamW', lr=1e-2, weight_decay=0.05)),
        train_cfg=dict(by_epoch=False, max_iters=max_iters),
        default_hooks=dict(checkpoint=dict(type='vitdense.SafeCheckpointHook', interval=2,
                                           by_epoch=False)),
        custom_hooks=[dict(type='vitdense.PeftCheckpointHook')],
        randomness=dict(seed=0), **kwargs)


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    """Every tensor inside a checkpoint's nested dicts, lists and tuples."""
    if torch.is_tensor(value):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors(item)


@pytest.fixture
def base(tmp_path) -> Path:
    path = tmp_path / 'base.pth'
    torch.save(perturb_(MODELS.build(TRUNK)).state_dict(), path)
    return path


def test_checkpoints_hold_what_trains_and_resume_exactly(tmp_path, base):
    whole = runner(tmp_path / 'whole', base, max_iters=4)
    whole.train()
    final = {k: v.clone() for k, v in whole.model.state_dict().items()}

    saved = safe_load(tmp_path / 'whole' / 'iter_2.pth')
    trainable = {name: param for name, param in whole.model.named_parameters()
                 if param.requires_grad}
    assert set(saved['state_dict']) == set(trainable)
    # besides them only AdamW's two moments of each (and its step counts): no frozen tensor
    # and no moment of one anywhere in the file
    moments = list(saved['optimizer']['state'].values())
    assert sorted(tuple(m['exp_avg'].shape) for m in moments) == \
        sorted(tuple(p.shape) for p in trainable.values())
    assert sum(tensor.numel() for tensor in _tensors(saved) if tensor.dim()) == \
        3 * sum(p.numel() for p in trainable.values())
    # what benchmarks/peft_checkpoint_size.py counts from the model is the file's tensors
    counted = sum(checkpoint_bytes(whole.model).values())
    assert counted < (tmp_path / 'whole' / 'iter_2.pth').stat().st_size < counted + 2 ** 16
    assert saved['meta'][META_KEY] == {'net.backbone.': dict(
        path=str(base), prefix=None, sha256=file_sha256(str(base)),
        tensors=len(final) - len(trainable))}
    # adapters, head, their optimizer state: under a tenth of full fine-tuning's checkpoint
    runner(tmp_path / 'full', base, max_iters=2, peft=None).train()
    assert (tmp_path / 'whole' / 'iter_2.pth').stat().st_size < \
        0.1 * (tmp_path / 'full' / 'iter_2.pth').stat().st_size

    resumed = runner(tmp_path / 'resumed', base, max_iters=4,
                     load_from=str(tmp_path / 'whole' / 'iter_2.pth'), resume=True)
    resumed.train()
    for name, tensor in resumed.model.state_dict().items():
        assert torch.equal(tensor, final[name]), name


def test_a_different_base_is_refused(tmp_path, base):
    runner(tmp_path / 'run', base, max_iters=2).train()
    other = tmp_path / 'other.pth'
    torch.save(perturb_(MODELS.build(TRUNK), seed=1).state_dict(), other)
    again = runner(tmp_path / 'again', other, max_iters=4,
                   load_from=str(tmp_path / 'run' / 'iter_2.pth'), resume=True)
    with pytest.raises(ValueError, match=r'trained on the base \S*/base\.pth .* base '
                                         r'\S*/other\.pth has sha256'):
        again.train()
