"""A NaN in a batch, or a finite loss with an infinite gradient, skips that step: weights,
optimizer state (momentum, compared exactly) and BatchNorm statistics stay as they were, the
iteration is named, and N bad iterations in a row stop the run with the last checkpoint
intact. Under AMP the guard checks the loss and leaves overflowing gradients to the loss
scaler; in a two-process run a step that one process finds bad is skipped by both."""
from __future__ import annotations

import os
from pathlib import Path
from unittest import mock

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from mmengine.hooks import Hook
from mmengine.model import BaseModel
from mmengine.optim import AmpOptimWrapper
from mmengine.optim.optimizer import amp_optimizer_wrapper
from mmengine.runner import Runner
from torch import nn
from torch.utils.data import Dataset

from vitdense.checkpoint_io import safe_load
from vitdense.engine.hooks.nonfinite import NonFiniteGuardHook, NonFiniteLossError

from common import free_port


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


class InfiniteGradient(torch.autograd.Function):
    """Identity forward; backward multiplies the gradient by infinity."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return grad * float('inf')


class FlaggedNet(BatchNormNet):
    """A sample whose last value is ``-1`` gives a finite loss with an infinite gradient, one
    whose last value is ``-2`` adds an infinite term that carries no gradient (a logged
    quantity gone wrong): the loss is inf, the gradients finite."""

    def forward(self, inputs: torch.Tensor, mode: str = 'loss'):
        out = self.net(inputs)
        if mode != 'loss':
            return list(out)
        if (inputs[:, -1] == -1).any():
            out = InfiniteGradient.apply(out)
        loss = ((out - 1) ** 2).mean()
        if (inputs[:, -1] == -2).any():
            loss = loss + torch.tensor(float('inf'))
        return dict(loss=loss)


class FlaggedData(Dataset):
    """Eight samples in order; the one at ``index`` ends in ``flag``."""

    def __init__(self, index: int = -1, flag: float = 0.) -> None:
        self.index, self.flag = index, flag

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> dict:
        x = torch.arange(4.0) / 4 + i / 8
        if i == self.index:
            x[-1] = self.flag
        return dict(inputs=x)


class OptimizerSnapshots(Snapshots):
    """Model and optimizer state (momentum) after every iteration."""

    def __init__(self) -> None:
        super().__init__()
        self.momentum: dict[int, list[torch.Tensor]] = {}

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        super().after_train_iter(runner, batch_idx, data_batch, outputs)
        state = runner.optim_wrapper.optimizer.state
        self.momentum[runner.iter + 1] = [state[p]['momentum_buffer'].clone()
                                          for p in runner.model.parameters() if p in state]


def flagged_runner(work_dir: Path, flag: float, optim_wrapper: dict | None = None,
                   model: BaseModel | None = None, **kwargs) -> tuple[Runner, OptimizerSnapshots]:
    """4 iterations of batch 2; the 3rd batch (samples 4, 5) carries ``flag`` in sample 5."""
    snapshots = OptimizerSnapshots()
    torch.manual_seed(0)
    runner = Runner(
        model=model or FlaggedNet(), work_dir=str(work_dir),
        train_dataloader=dict(dataset=FlaggedData(5, flag), batch_size=2,
                              collate_fn=dict(type='default_collate'),
                              sampler=dict(type='InfiniteSampler', shuffle=False)),
        optim_wrapper=optim_wrapper or dict(optimizer=dict(type='SGD', lr=0.01, momentum=0.9)),
        train_cfg=dict(by_epoch=False, max_iters=4), default_hooks=dict(checkpoint=None),
        custom_hooks=[NonFiniteGuardHook(max_consecutive=3), snapshots],
        randomness=dict(seed=0), experiment_name=f'nonfinite-{work_dir.name}', **kwargs)
    return runner, snapshots


def _assert_step_3_skipped(snapshots: OptimizerSnapshots, norm_statistics: bool = True) -> None:
    """Weights and momentum after iteration 3 are those after 2 (and the BatchNorm running
    statistics, unless the step was skipped by AMP's scaler, after the forward pass)."""
    for key, value in snapshots.states[2].items():
        if norm_statistics or 'running' not in key and 'num_batches' not in key:
            assert torch.equal(value, snapshots.states[3][key]), key
    assert all(torch.equal(before, after) for before, after in
               zip(snapshots.momentum[2], snapshots.momentum[3], strict=True)), 'momentum moved'
    assert not torch.equal(snapshots.momentum[4][0], snapshots.momentum[3][0])
    assert all(torch.isfinite(v.float()).all() for v in snapshots.states[4].values())


def test_finite_loss_with_an_infinite_gradient_skips_the_step(tmp_path, capfd):
    runner, snapshots = flagged_runner(tmp_path, flag=-1)
    runner.train()
    _assert_step_3_skipped(snapshots)
    assert 'iteration 3: non-finite gradient; the step was skipped' in capfd.readouterr().out


class CpuAmpOptimWrapper(AmpOptimWrapper):
    """mmengine's AMP wrapper (it insists on a GPU) with bf16 autocast and torch's CPU
    gradient scaler, so that the guard's AMP branch runs on a CPU."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        with mock.patch.object(amp_optimizer_wrapper, 'is_cuda_available', return_value=True):
            super().__init__(optimizer=optimizer, dtype='bfloat16')
        self.loss_scaler = torch.amp.GradScaler('cpu', init_scale=2.0 ** 8)


@pytest.mark.parametrize('flag, skipped_by', [(-2, 'guard'), (-1, 'scaler')])
def test_amp_bad_loss_is_skipped_by_the_guard_overflow_by_the_scaler(tmp_path, flag,
                                                                     skipped_by):
    # Under loss scaling an overflowing gradient is the scaler's business: it skips the step
    # and halves its scale. A guard that skipped it instead would keep the scale too large.
    torch.manual_seed(0)
    model = FlaggedNet()
    wrapper = CpuAmpOptimWrapper(torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9))
    scales = []
    wrapper.loss_scaler.update = _recording(wrapper.loss_scaler.update, wrapper.loss_scaler,
                                            scales)
    runner, snapshots = flagged_runner(tmp_path, flag, optim_wrapper=wrapper, model=model)
    runner.train()
    _assert_step_3_skipped(snapshots, norm_statistics=skipped_by == 'guard')
    assert runner.optim_wrapper is wrapper
    if skipped_by == 'scaler':
        assert scales == [2.0 ** 8, 2.0 ** 8, 2.0 ** 7, 2.0 ** 7]
    else:
        assert scales == [2.0 ** 8] * 3  # the guard skipped iteration 3, scaler untouched


def _recording(update, scaler, scales: list):
    def recorded(*args, **kwargs):
        update(*args, **kwargs)
        scales.append(scaler.get_scale())
    return recorded


def _two_process_run(rank: int, work_dir: str, port: int) -> None:
    """One of two gloo processes training FlaggedNet under DDP; the sampler gives rank 1
    samples 5 and 7 in its second batch, whose loss is infinite there only. Writes each rank's
    weights after every iteration."""
    torch.set_num_threads(1)  # a forked child must not enter its parent's OpenMP pool
    os.environ.update(MASTER_ADDR='127.0.0.1', MASTER_PORT=str(port), RANK=str(rank),
                      LOCAL_RANK=str(rank), WORLD_SIZE='2', OMP_NUM_THREADS='1')
    dist.init_process_group('gloo')  # mmengine's init_dist wants a GPU per process
    runner, snapshots = flagged_runner(
        Path(work_dir) / f'rank{rank}', flag=-2 if rank else 0, launcher='pytorch',
        cfg=dict(model_wrapper_cfg=dict(type='MMDistributedDataParallel', device_ids=None)))
    runner.train()
    torch.save(snapshots.states, Path(work_dir) / f'rank{rank}.pth')
    dist.destroy_process_group()


def test_processes_agree_to_skip_a_step_only_one_found_bad(tmp_path):
    # In iteration 2 rank 1's loss is infinite, its gradients (and so the averaged ones) are
    # finite: rank 0 alone would step. Both must skip, or the replicas part ways.
    port = free_port()
    mp.start_processes(_two_process_run, args=(str(tmp_path), port), nprocs=2,
                       start_method='fork')  # spawn re-imports torch: 5x slower
    ranks = [torch.load(tmp_path / f'rank{r}.pth', weights_only=True) for r in (0, 1)]
    for states in ranks:
        for key, value in states[1].items():
            assert torch.equal(value, states[2][key]), key
    weights = [key for key in ranks[0][4] if 'running' not in key and 'batches' not in key]
    for key in weights:  # BatchNorm statistics are each process's own
        assert torch.equal(ranks[0][4][key], ranks[1][4][key]), key
