"""A checkpoint write that fails part-way (the disk refuses bytes past a size, as a full disk
would) leaves the previous checkpoint and ``last_checkpoint`` as they were, no partial file,
and a run that resumes from them ends where the uninterrupted run ends."""
from __future__ import annotations

import resource
import signal
from pathlib import Path

import pytest
import torch
from mmengine.hooks import Hook
from mmengine.runner import Runner
from torch import nn

from vitdense.checkpoint_io import safe_load

from common import RegressToOne
from test_checkpoint_io import Ones


def make_runner(work_dir: Path, max_epochs: int = 2, **kwargs) -> Runner:
    """Two epochs of linear regression on 4 samples, a checkpoint each epoch; the model is
    initialised the same way in every runner."""
    torch.manual_seed(0)
    return Runner(
        model=RegressToOne(nn.Linear(2, 1)), work_dir=str(work_dir),
        train_dataloader=dict(dataset=Ones(), batch_size=2, collate_fn=dict(type='default_collate'),
                              sampler=dict(type='DefaultSampler', shuffle=False)),
        optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.01, momentum=0.9)),
        train_cfg=dict(by_epoch=True, max_epochs=max_epochs),
        default_hooks=dict(checkpoint=dict(type='vitdense.SafeCheckpointHook', interval=1,
                                           max_keep_ckpts=1)),
        randomness=dict(seed=0), **kwargs)


class DiskFullDuringSecondSave(Hook):
    """Before the second checkpoint is written, files may grow to half the size of the first
    one only: the write fails with EFBIG after its first bytes reached the disk."""

    def __init__(self, first: Path) -> None:
        self.first = first

    def before_save_checkpoint(self, runner, checkpoint) -> None:
        if runner.epoch >= 1:
            limit = self.first.stat().st_size // 2
            resource.setrlimit(resource.RLIMIT_FSIZE,
                               (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))


@pytest.fixture
def file_size_limit_restored():
    """Undo the hook's limit; past the limit writes fail with EFBIG instead of SIGXFSZ."""
    limits = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    yield
    resource.setrlimit(resource.RLIMIT_FSIZE, limits)
    signal.signal(signal.SIGXFSZ, handler)


def test_a_write_that_fails_part_way_keeps_the_previous_checkpoint(tmp_path,
                                                                   file_size_limit_restored):
    reference = make_runner(tmp_path / 'reference')
    reference.train()

    work = tmp_path / 'work'
    runner = make_runner(work, custom_hooks=[DiskFullDuringSecondSave(work / 'epoch_1.pth')])
    with pytest.raises(OSError, match='too large'):
        runner.train()
    hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
    resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))

    left = sorted(p.name for p in work.iterdir() if p.is_file() and p.suffix != '.py')
    assert left == ['epoch_1.pth', 'last_checkpoint'], f'a partial write was left: {left}'
    assert (work / 'last_checkpoint').read_text() == str(work / 'epoch_1.pth')
    assert safe_load(str(work / 'epoch_1.pth'))['meta']['epoch'] == 1

    resumed = make_runner(work, resume=True)
    resumed.train()
    ours, theirs = resumed.model.state_dict(), reference.model.state_dict()
    assert all(torch.equal(ours[key], theirs[key]) for key in theirs)
