"""A run stopped after any iteration and resumed repeats the uninterrupted run bit for bit:
losses, final weights, the place of each batch that hooks read and the log lines, with
random data, dropout, BatchNorm, shuffling, evaluation in between, and a time budget whose
spent part travels in the checkpoint and whose saves count for ``max_keep_ckpts``."""
from __future__ import annotations

import itertools
import logging
import os
import random
import re
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from mmengine.evaluator import BaseMetric
from mmengine.hooks import Hook
from mmengine.runner import Runner
from torch import nn
from torch.utils.data import DataLoader, Dataset

from vitdense.checkpoint_io import safe_load
from vitdense.engine import (ExactResumeHook, PreemptionHook, TimeBudgetHook,
                             find_resumable_checkpoint)
from vitdense.engine.hooks.resume import seed_batches
from vitdense.engine.resume_choice import remove_interrupted_saves

from common import IterationClock, RegressToOne, free_port


def noisy_net() -> RegressToOne:
    """Dropout and BatchNorm: a step draws random numbers and updates running statistics."""
    return RegressToOne(nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(),
                                      nn.Dropout(0.5), nn.Linear(8, 1)))


class AugmentedData(Dataset):
    """Each sample is jittered with numpy and python random numbers (an augmentation)."""

    def __len__(self) -> int:
        return 6

    def __getitem__(self, i: int) -> torch.Tensor:
        jitter = np.random.randn(4).astype(np.float32) * 0.1 + random.random() * 0.01
        return dict(inputs=torch.arange(4.0) * i / 6 + torch.from_numpy(jitter))


class MeanOutput(BaseMetric):
    def process(self, data_batch, data_samples) -> None:
        self.results.extend(float(x) for x in data_samples)

    def compute_metrics(self, results: list) -> dict:
        return dict(mean=float(np.mean(results)))


class TrainingLogLines(logging.Handler):
    """The training log lines (``...(train) [...]``) by iteration, timings left out."""

    TIMINGS = re.compile(r'\s+(eta|time|data_time|memory): \S+')

    def __init__(self, runner: Runner) -> None:
        super().__init__()
        self.runner = runner
        self.lines: dict[int, str] = {}

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if '(train) [' in message:
            self.lines[self.runner.iter + 1] = self.TIMINGS.sub('', message)


class Record(Hook):
    """Losses, the place in the epoch (``batch_idx``) and the training log line per
    iteration; stops the process (raises) after iteration ``kill_after``, or in the
    validation after iteration ``kill_in_validation``."""

    priority = 'LOWEST'

    def __init__(self, kill_after: int | None = None,
                 kill_in_validation: int | None = None) -> None:
        self.losses: dict[int, torch.Tensor] = {}
        self.batch_indices: dict[int, int] = {}
        self.log: TrainingLogLines | None = None
        self.kill_after = kill_after
        self.kill_in_validation = kill_in_validation

    def before_train(self, runner) -> None:
        self.log = TrainingLogLines(runner)
        runner.logger.addHandler(self.log)

    def after_train(self, runner) -> None:
        runner.logger.removeHandler(self.log)

    def after_val_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        if runner.iter == self.kill_in_validation:
            raise KeyboardInterrupt(f'killed validating after iteration {runner.iter}')

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        self.losses[runner.iter + 1] = outputs['loss'].detach().clone()
        self.batch_indices[runner.iter + 1] = batch_idx
        if runner.iter + 1 == self.kill_after:
            raise KeyboardInterrupt(f'killed after iteration {self.kill_after}')


RUN_IDS = itertools.count()  # a logger of its own per run, even within one second


def run(work_dir: Path, kill_after: int | None = None, resume: bool = False,
        budget_seconds: float | None = None,
        kill_in_validation: int | None = None, val_interval: int = 4,
        distributed: bool = False, workers: int = 0,
        persistent: bool = False, max_keep_ckpts: int = 1,
        sampler: str = 'InfiniteSampler', seed: int = 0,
        preemption: bool = False) -> tuple[Record, Runner]:
    """9 iterations, checkpoint every 3 (``max_keep_ckpts`` kept); ``distributed``: one of
    the processes of a gloo group, seeded differently per process (``diff_rank_seed``);
    ``workers`` training loader workers (``persistent``: kept from pass to pass);
    ``sampler``: mmengine's endless one, or ``'DefaultSampler'``, a pass of 3 batches that
    the loop starts again; ``seed``: the runner's; ``preemption``: with the
    ``PreemptionHook`` tools/train.py adds (which shields the workers and restarts the
    loop's loader)."""
    record = Record(kill_after, kill_in_validation)
    hooks = [ExactResumeHook(), record] + ([PreemptionHook(requeue=False)] if preemption else [])
    train_cfg = dict(by_epoch=False, max_iters=9, val_interval=val_interval)
    checkpoint = dict(type='vitdense.SafeCheckpointHook', by_epoch=False, interval=3,
                      max_keep_ckpts=max_keep_ckpts)
    schedulers = [dict(type='LinearLR', start_factor=0.1, by_epoch=False, begin=0, end=4)]
    if budget_seconds is not None:
        hooks += [IterationClock(), TimeBudgetHook(budget_seconds / 60, warmup_iters=3,
                                                   clock='iterations', checkpoints=4)]
        train_cfg.update(max_iters=10 ** 9)
        checkpoint.update(interval=10 ** 9)
        schedulers = []
    torch.manual_seed(0)  # the model is built before the Runner seeds the generators
    multi_process = dict(launcher='pytorch', cfg=dict(model_wrapper_cfg=dict(
        type='MMDistributedDataParallel', device_ids=None))) if distributed else {}
    runner = Runner(
        model=noisy_net(), work_dir=str(work_dir),
        train_dataloader=dict(dataset=AugmentedData(), batch_size=2,
                              collate_fn=dict(type='default_collate'), num_workers=workers,
                              persistent_workers=persistent,
                              sampler=dict(type=sampler, shuffle=True)),
        val_dataloader=dict(dataset=AugmentedData(), batch_size=3,
                            collate_fn=dict(type='default_collate'),
                            sampler=dict(type='DefaultSampler', shuffle=True)),
        val_cfg=dict(), val_evaluator=[MeanOutput()],
        optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.05, momentum=0.9)),
        param_scheduler=schedulers, train_cfg=train_cfg,
        default_hooks=dict(checkpoint=checkpoint, logger=dict(type='LoggerHook', interval=1)),
        custom_hooks=hooks, resume=resume, experiment_name=f'run{next(RUN_IDS)}',
        randomness=dict(seed=seed, deterministic=True, diff_rank_seed=distributed),
        env_cfg=dict(dist_cfg=dict(backend='gloo')), **multi_process)
    try:
        runner.train()
    except KeyboardInterrupt:
        pass
    return record, runner


def assert_same_run(full: tuple[Record, Runner], resumed: tuple[Record, Runner],
                     first_resumed: int) -> None:
    assert sorted(resumed[0].losses) == [i for i in sorted(full[0].losses) if i >= first_resumed]
    for i, loss in resumed[0].losses.items():
        assert torch.equal(loss, full[0].losses[i]), f'iteration {i}'
    assert resumed[0].batch_indices == {i: place for i, place in full[0].batch_indices.items()
                                        if i >= first_resumed}
    assert resumed[0].log.lines == {i: line for i, line in full[0].log.lines.items()
                                    if i >= first_resumed}
    full_weights, weights = full[1].model.state_dict(), resumed[1].model.state_dict()
    assert all(torch.equal(full_weights[k], weights[k]) for k in full_weights)


@pytest.fixture(scope='module')
def full_run(tmp_path_factory) -> tuple[Record, Runner]:
    return run(tmp_path_factory.mktemp('full'))


@pytest.mark.parametrize('kill_after', [5, 7])
def test_resume_repeats_uninterrupted_run(tmp_path, full_run, kill_after):
    full = full_run
    killed = run(tmp_path / 'killed', kill_after=kill_after)
    assert killed[1].iter == kill_after - 1 and len(list((tmp_path / 'killed').glob('*.pth'))) == 1
    resumed = run(tmp_path / 'killed', resume=True)
    assert_same_run(full, resumed, first_resumed=kill_after // 3 * 3 + 1)


@pytest.mark.parametrize('preemption', [False, True], ids=['alone', 'preemption-hook'])
@pytest.mark.parametrize('persistent', [False, True], ids=['workers', 'persistent-workers'])
def test_resume_mid_pass_with_loader_workers_repeats_the_run(tmp_path, persistent, preemption):
    # Two workers augment the batches. Resumed after iteration 3 (the sampler's one pass),
    # fresh workers load batches 4, 5, ... in another order of workers than the
    # uninterrupted run's, which had drawn for the batches before: each batch's own seed
    # makes the draws, hence the losses and weights, the same. So too with the
    # PreemptionHook tools/train.py adds, which restarts the loop's loader before this hook
    # does (the pass it starts is not the run's first; a persistent loader's kept iterator
    # is not the one that skips the trained batches).
    options = dict(workers=2, persistent=persistent, preemption=preemption)
    full = run(tmp_path / 'full', **options)
    run(tmp_path / 'killed', kill_after=5, **options)
    assert_same_run(full, run(tmp_path / 'killed', resume=True, **options), first_resumed=4)


def test_resume_after_passes_of_a_finite_sampler_repeats_the_run(tmp_path):
    # An iteration loop over a sampler of 3 batches a pass, resumed from the checkpoint of
    # iteration 6 (two passes done): the third pass's batches are loaded from the third
    # pass's seeds, as in the uninterrupted run, not from the first's.
    full = run(tmp_path / 'full', sampler='DefaultSampler')
    run(tmp_path / 'killed', kill_after=7, sampler='DefaultSampler')
    assert_same_run(full, run(tmp_path / 'killed', resume=True, sampler='DefaultSampler'),
                    first_resumed=7)


def test_a_runner_built_with_another_seed_than_its_checkpoint_is_warned(tmp_path, full_run,
                                                                          capfd):
    # mmengine takes the checkpoint's seed after the runner built its loader with its own:
    # the resumed run shuffles otherwise than the run that wrote the checkpoint, and says so.
    run(tmp_path, kill_after=5)
    resumed = run(tmp_path, resume=True, seed=1)
    assert ('this run was built with seed 1 and resumes a checkpoint of seed 0'
            in capfd.readouterr().out)
    assert resumed[1].seed == 0
    assert not all(torch.equal(full_run[0].losses[i], resumed[0].losses[i]) for i in (4, 5, 6))


def test_resume_after_a_kill_during_validation(tmp_path, full_run):
    run(tmp_path, kill_in_validation=4)
    assert [p.name for p in tmp_path.glob('*.pth')] == ['iter_3.pth']
    assert_same_run(full_run, run(tmp_path, resume=True), first_resumed=4)


def test_resume_skips_the_evaluation_the_checkpoint_was_followed_by(tmp_path):
    # Validation every 3 iterations, right after each checkpoint: the resumed run starts
    # after the validation of iteration 3 and must not lack the numbers it drew.
    full = run(tmp_path / 'full', val_interval=3)
    run(tmp_path / 'killed', kill_after=5, val_interval=3)
    resumed = run(tmp_path / 'killed', resume=True, val_interval=3)
    assert_same_run(full, resumed, first_resumed=4)


def _rank_of_two(rank: int, port: int, work_dir: str, out: str, kill_after: int | None,
                 resume: bool) -> None:
    """One process of a two-process run (forked: it inherits the imports); writes its
    losses, final weights and the methods replaced on its runner or training set that are
    left after the run to ``out/rank<rank>.pth``."""
    torch.set_num_threads(1)  # a forked child must not enter its parent's OpenMP pool
    os.environ.update(MASTER_ADDR='127.0.0.1', MASTER_PORT=str(port), RANK=str(rank),
                      LOCAL_RANK=str(rank), WORLD_SIZE='2')
    dist.init_process_group('gloo')  # mmengine's init_dist wants a GPU per process
    record, runner = run(Path(work_dir), kill_after=kill_after, resume=resume, distributed=True)
    left = [name for name, obj in (('save_checkpoint', runner),
                                   ('__getitems__', runner.train_dataloader.dataset))
            if name in vars(obj)]
    torch.save(dict(losses=record.losses, weights=runner.model.module.state_dict(), left=left),
               Path(out) / f'rank{rank}.pth')
    dist.destroy_process_group()


def _two_processes(work_dir: Path, out: Path, kill_after: int | None = None,
                   resume: bool = False) -> list[dict]:
    out.mkdir(parents=True, exist_ok=True)
    port = free_port()
    mp.start_processes(_rank_of_two, args=(port, str(work_dir), str(out), kill_after, resume),
                       nprocs=2, start_method='fork')  # spawn re-imports torch: 5x slower
    return [torch.load(out / f'rank{rank}.pth', weights_only=True) for rank in (0, 1)]


def test_every_process_resumes_its_own_random_stream(tmp_path):
    # diff_rank_seed: the processes draw different dropout masks and augmentations; each
    # must continue its own stream, not that of process 0.
    full = _two_processes(tmp_path / 'full', tmp_path / 'full_out')
    assert not torch.equal(full[0]['losses'][1], full[1]['losses'][1])  # the premise
    _two_processes(tmp_path / 'killed', tmp_path / 'killed_out', kill_after=5)
    resumed = _two_processes(tmp_path / 'killed', tmp_path / 'resumed_out', resume=True)
    for rank in (0, 1):
        assert sorted(resumed[rank]['losses']) == [4, 5, 6, 7, 8, 9]
        for i, loss in resumed[rank]['losses'].items():
            assert torch.equal(loss, full[rank]['losses'][i]), f'rank {rank}, iteration {i}'
    for key, value in full[0]['weights'].items():
        assert torch.equal(value, resumed[0]['weights'][key]), key
    # the hook's replacements last as long as the run
    assert [process['left'] for process in full + resumed] == [[]] * 4


def test_without_random_state_resume_differs(tmp_path, full_run):
    # The premise: mmengine's resume alone does not restore the random streams.
    full = full_run
    run(tmp_path / 'killed', kill_after=5)
    checkpoint = tmp_path / 'killed' / 'iter_3.pth'
    state = safe_load(checkpoint)
    del state['rng_state']
    torch.save(state, checkpoint)
    resumed = run(tmp_path / 'killed', resume=True)
    assert any(not torch.equal(loss, full[0].losses[i]) for i, loss in resumed[0].losses.items())


def test_time_budgeted_resume_continues_the_budget(tmp_path, iteration_clock):
    full = run(tmp_path / 'full', budget_seconds=10)
    assert max(full[0].losses) == 10 and (tmp_path / 'full' / 'iter_10.pth').is_file()
    killed = run(tmp_path / 'killed', kill_after=7, budget_seconds=10)
    # Saved at each quarter of the budget: after iterations 3 and 5 (max_keep_ckpts=1: the
    # older one removed).
    assert [p.name for p in (tmp_path / 'killed').glob('*.pth')] == ['iter_5.pth']
    resumed = run(tmp_path / 'killed', resume=True, budget_seconds=10)
    assert_same_run(full, resumed, first_resumed=6)
    assert resumed[1].message_hub.get_scalar('train/budget_used').current() == 1.0
    # Resuming a finished run trains nothing more.
    again = run(tmp_path / 'killed', resume=True, budget_seconds=10)
    assert again[0].losses == {} and again[1].iter == 10


def test_time_budget_saves_keep_max_keep_ckpts_checkpoints(tmp_path, iteration_clock):
    # Saved at each quarter of the budget and at its end: after iterations 3, 5, 8 and 10.
    # The checkpoint hook alone removes saves, beyond its newest two.
    run(tmp_path, budget_seconds=10, max_keep_ckpts=2)
    assert {p.name for p in tmp_path.glob('*.pth')} == {'iter_8.pth', 'iter_10.pth'}


def test_budget_eta_replaces_max_iters_eta(tmp_path, iteration_clock):
    record, runner = run(tmp_path, kill_after=4, budget_seconds=10)
    assert runner.message_hub.get_info('eta') == 6.0
    assert runner.message_hub.get_scalar('train/budget_used').current() == 0.4
    log = next(tmp_path.glob('*/*.log')).read_text()
    # the fourth iteration's log line: 4 of 10 budget seconds used, 6 left
    assert [line for line in log.splitlines() if 'budget_used: 0.4000' in line][0].count(
        'eta: 0:00:06') == 1


def test_auto_resume_falls_back_to_newest_loadable(tmp_path):
    run(tmp_path, kill_after=8)
    for step in (3, 6):  # keep two checkpoints, as max_keep_ckpts=2 would
        (tmp_path / f'iter_{step}.pth').write_bytes(b'')
    run(tmp_path / 'ref', kill_after=4)
    (tmp_path / 'iter_3.pth').write_bytes((tmp_path / 'ref' / 'iter_3.pth').read_bytes())
    assert (tmp_path / 'last_checkpoint').read_text().endswith('iter_6.pth')
    assert find_resumable_checkpoint(tmp_path) == str(tmp_path / 'iter_3.pth')
    (tmp_path / 'iter_3.pth').write_bytes(b'PK\x03\x04 truncated')
    assert find_resumable_checkpoint(tmp_path) is None
    assert find_resumable_checkpoint(tmp_path / 'missing') is None


def test_interrupted_save_leftovers_are_removed(tmp_path):
    (tmp_path / '.iter_4.pth.k2j3h.tmp').write_bytes(b'half a checkpoint')
    (tmp_path / 'iter_2.pth').write_bytes(b'kept')
    (tmp_path / '.notes.tmp').write_text('not a checkpoint save')
    assert remove_interrupted_saves(tmp_path) == [str(tmp_path / '.iter_4.pth.k2j3h.tmp')]
    assert sorted(p.name for p in tmp_path.iterdir()) == ['.notes.tmp', 'iter_2.pth']


def test_resume_loads_no_trained_batch(tmp_path, full_run, monkeypatch):
    run(tmp_path, kill_after=8)  # the newest checkpoint: iteration 6
    loaded = []
    load = AugmentedData.__getitem__
    monkeypatch.setattr(AugmentedData, '__getitem__', lambda data, i: loaded.append(i) or
                        load(data, i))
    resumed = run(tmp_path, resume=True)
    # iterations 7-9 (batches of 2) and the validations after 8 and 9 (6 samples each);
    # loading the 6 trained batches again would add 12
    assert len(loaded) == 3 * 2 + 2 * 6
    assert_same_run(full_run, resumed, first_resumed=7)


class DrawnSamples(Dataset):
    """Four samples, each a number drawn from torch's, numpy's and python's generators."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor([torch.rand(()).item(), np.random.rand(), random.random()])


def _drawn(rank: int, workers: int = 0, passes: int = 2) -> list[list[torch.Tensor]]:
    """The batches of ``passes`` passes over samples 0 and 1, twice per pass, loaded from
    their seed keys (run seed 0, ``rank``)."""
    loader = DataLoader(DrawnSamples(), batch_sampler=[[0, 1], [0, 1]], num_workers=workers)
    seed_batches(loader, seed=0, rank=rank)
    return [list(loader) for _ in range(passes)]


def test_each_part_of_a_batch_seed_key_changes_its_draws():
    # The same samples at two places of a pass, in two passes, on two ranks: every part of
    # the seed key (rank, pass, place in the pass) gives the batch other draws.
    rank0, rank1 = _drawn(rank=0), _drawn(rank=1)
    first, second = rank0
    assert not torch.equal(first[0], first[1])  # place in the pass
    assert not torch.equal(first[0], second[0])  # pass
    assert not torch.equal(first[0], rank1[0][0])  # rank
    # keys of equal sums, (0, 0, 1, 0) against (0, 1, 0, 0) and (0, 0, 0, 1)
    assert not torch.equal(second[0], rank1[0][0]) and not torch.equal(second[0], first[1])
    again = _drawn(rank=0)
    assert all(torch.equal(a, b) for pass_a, pass_b in zip(rank0, again)
               for a, b in zip(pass_a, pass_b))


def test_loading_draws_the_same_with_or_without_workers_and_leaves_the_stream():
    # Loaded in the training process or in 2 workers, a batch's draws are those of its
    # key; loading in the training process draws nothing from its generators.
    torch.manual_seed(1)
    before = torch.get_rng_state()
    in_process = _drawn(rank=0)
    assert torch.equal(torch.get_rng_state(), before)
    in_workers = _drawn(rank=0, workers=2)
    assert all(torch.equal(a, b) for pass_a, pass_b in zip(in_process, in_workers)
               for a, b in zip(pass_a, pass_b))
