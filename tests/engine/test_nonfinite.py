"""A NaN in a batch skips that step: weights, optimizer state and BatchNorm statistics stay
as they were, the iteration is named, and N bad iterations in a row stop the run with the
last checkpoint intact."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from mmengine.hooks import Hook
from mmengine.model import BaseModel
from mmengine.runner import Runner
from torch import nn
from torch.utils.data import Dataset

from vitdense.checkpoint_io import safe_load
from vitdense.engine.nonfinite import NonFiniteGuardHook, NonFiniteLossError


class BatchNormNet(BaseModel):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 1))

    def forward(self, inputs: torch.Tensor, mode: str = 'loss'):
        out = self.net(inputs)
        return dict(loss=((out - 1) ** 2).mean()) if mode == 'loss' else list(out)


class PoisonedData(Dataset):
    """Eight samples in order; the ones in ``bad`` hold a single NaN value."""

    def __init__(self, bad: set[int]) -> None:
        self.bad = bad

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> dict:
        x = torch.arange(4.0) + i
        if i in self.bad:
            x[2] = float('nan')
        return dict(inputs=x)


class Snapshots(Hook):
    """Model state after every iteration."""

    priority = 'LOWEST'

    def __init__(self) -> None:
        self.states: dict[int, dict] = {}

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        self.states[runner.iter + 1] = {k: v.clone() for k, v in runner.model.state_dict().items()}


def make_runner(work_dir: Path, bad: set[int],
                max_consecutive: int = 3) -> tuple[Runner, Snapshots]:
    snapshots = Snapshots()
    runner = Runner(
        model=BatchNormNet(), work_dir=str(work_dir),
        train_dataloader=dict(dataset=PoisonedData(bad), batch_size=2,
                              collate_fn=dict(type='default_collate'),
                              sampler=dict(type='InfiniteSampler', shuffle=False)),
        optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.01, momentum=0.9)),
        train_cfg=dict(by_epoch=False, max_iters=4),
        default_hooks=dict(checkpoint=dict(type='vitdense.SafeCheckpointHook', by_epoch=False, interval=1,
                                           max_keep_ckpts=1)),
        custom_hooks=[NonFiniteGuardHook(max_consecutive=max_consecutive), snapshots],
        randomness=dict(seed=0), env_cfg=dict(dist_cfg=dict(backend='gloo')),
        experiment_name=f'nonfinite-{work_dir.name}')  # its own logger, on this test's stdout
    return runner, snapshots


def test_nan_pixel_skips_the_step_and_keeps_norm_statistics(tmp_path, capfd):
    runner, snapshots = make_runner(tmp_path, bad={5})  # sample 5 is in the 3rd batch
    runner.train()
    for key, value in snapshots.states[2].items():
        assert torch.equal(value, snapshots.states[3][key]), key
    assert all(torch.isfinite(v.float()).all() for v in snapshots.states[4].values())
    assert not torch.equal(snapshots.states[4]['net.0.weight'], snapshots.states[3]['net.0.weight'])
    assert runner.optim_wrapper.optimizer.state  # momentum kept, and finite
    assert all(torch.isfinite(s['momentum_buffer']).all()
               for s in runner.optim_wrapper.optimizer.state.values())
    assert 'iteration 3: non-finite loss (loss=nan)' in capfd.readouterr().out


def test_bad_iterations_in_a_row_stop_the_run(tmp_path):
    runner, snapshots = make_runner(tmp_path, bad={2, 4, 6}, max_consecutive=3)
    with pytest.raises(NonFiniteLossError, match=r'iterations 2-4: 3 in a row.*iter_3\.pth'):
        runner.train()
    # The run stopped before saving iteration 4; iteration 3's checkpoint holds the weights
    # of the last good step (iteration 1).
    checkpoint = safe_load(Path(tmp_path, 'last_checkpoint').read_text())
    assert checkpoint['meta']['iter'] == 3 and 4 not in snapshots.states
    for key, value in checkpoint['state_dict'].items():
        assert torch.equal(value, snapshots.states[1][key]), key
