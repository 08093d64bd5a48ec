"""A preemption signal in the middle of an epoch: the run saves a checkpoint of exactly that
iteration and stops; ``resume`` repeats the uninterrupted run bit for bit, loading no batch
already trained, in one process and in two (the signal reaching one of them only), and
with loader workers (the demo classifier); the saves count for ``max_keep_ckpts``. A stop
signal sent to the process group as loader workers start, before their shield is set, stops
the run as any other; SIGKILL 2 s after SIGTERM leaves the last complete checkpoint to resume
from; loader workers started by a fork server stop and let a finished run exit; a finished
run ends its loader workers itself (the garbage collector would wait 5 s for each), and a
launched one exits in less time than those waits took; a second SIGTERM after the stop save
still exits 75. The demo classifier with its shipped runtime (a seed drawn per run) stops and
resumes exactly too. Started through tools/torchrun.sh, a
stopped run exits 75 (signalled twice too, with no process left behind), a failed one does
not, and a finished run signalled in its tail exits 0."""
from __future__ import annotations

import gc
import itertools
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from mmengine.hooks import Hook
from mmengine.runner import Runner
from torch.utils.data import DataLoader
from torch.utils.data._utils import MP_STATUS_CHECK_INTERVAL

from vitdense.checkpoint_io import safe_load
from vitdense.demo_data import make_demo_imagenet
from vitdense.engine import (PREEMPTED_EXIT_CODE, ExactResumeHook, Preempted, PreemptionHook,
                             find_resumable_checkpoint)
from vitdense.engine.hooks.preemption import shield_loader_workers
from vitdense.engine.tool_config import point_at_data_root

from common import (CHECKOUT_ENV, REPO_ROOT, Watched, free_port, largest_difference,
                    load_tool_config, shipped_leaf, train_to_end, train_tool)
from launcher_signals import ForkSignalledAtStart
from test_resume import AugmentedData, Record, assert_same_run, noisy_net

RUN_IDS = itertools.count()


class CountedData(AugmentedData):
    """``AugmentedData`` of ``size`` samples, counting those loaded (no loader workers)."""

    loaded = [0]

    def __init__(self, size: int = 6) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int) -> dict:
        self.loaded[0] += 1
        return super().__getitem__(i)


class SignalAfter(Hook):
    """Sends ``signum`` to this process after iteration ``iteration`` (before the
    preemption hook's end-of-iteration check, as a signal arriving mid-iteration)."""

    def __init__(self, iteration: int | None, signum: int = signal.SIGTERM) -> None:
        self.iteration, self.signum = iteration, signum

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        if runner.iter + 1 == self.iteration:
            os.kill(os.getpid(), self.signum)


def epoch_run(work_dir: Path, signal_after: int | None = None, resume: bool = False,
              distributed: bool = False, signum: int = signal.SIGTERM,
              checkpoint: dict | None = None) -> tuple[Record, Runner]:
    """3 epochs of 3 batches of 2 per process (shuffled per epoch), an epoch checkpoint at
    epoch 2 only (or as ``checkpoint`` says), a log line every 2 batches of an epoch and at
    its end; ``Preempted`` is caught and left in ``runner.preempted``."""
    record = Record()
    torch.manual_seed(0)
    multi_process = dict(launcher='pytorch', cfg=dict(model_wrapper_cfg=dict(
        type='MMDistributedDataParallel', device_ids=None))) if distributed else {}
    runner = Runner(
        model=noisy_net(), work_dir=str(work_dir),
        train_dataloader=dict(dataset=CountedData(12 if distributed else 6), batch_size=2,
                              collate_fn=dict(type='default_collate'),
                              sampler=dict(type='DefaultSampler', shuffle=True)),
        optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.05, momentum=0.9)),
        param_scheduler=[dict(type='LinearLR', start_factor=0.1, by_epoch=False, begin=0,
                              end=4)],
        train_cfg=dict(by_epoch=True, max_epochs=3),
        default_hooks=dict(checkpoint=dict(type='vitdense.SafeCheckpointHook',
                                           **(checkpoint or dict(interval=2))),
                           logger=dict(type='LoggerHook', interval=2, ignore_last=False)),
        custom_hooks=[ExactResumeHook(), record, SignalAfter(signal_after, signum),
                      PreemptionHook(signals=('SIGTERM', 'SIGUSR1'), requeue=False)],
        resume=resume, experiment_name=f'preempt{next(RUN_IDS)}',
        randomness=dict(seed=0, deterministic=True, diff_rank_seed=distributed),
        env_cfg=dict(dist_cfg=dict(backend='gloo')), **multi_process)
    runner.preempted = runner.handler_after_stop = None
    try:
        runner.train()
    except Preempted as stop:
        runner.preempted, runner.handler_after_stop = stop, signal.getsignal(signum)
        stop.restore_signals()
    return record, runner


def _same_weights(a: Runner, b: Runner) -> bool:
    ours, theirs = a.model.state_dict(), b.model.state_dict()
    return all(torch.equal(ours[k], theirs[k]) for k in theirs)


@pytest.mark.parametrize('signum', [signal.SIGTERM, signal.SIGUSR1])
def test_signal_mid_epoch_saves_that_iteration_and_resume_is_exact(tmp_path, signum):
    before = signal.getsignal(signum)
    full = epoch_run(tmp_path / 'full')
    CountedData.loaded[0] = 0
    stopped = epoch_run(tmp_path / 'work', signal_after=5, signum=signum)
    stop = stopped[1].preempted
    assert stop is not None and stop.iteration == 5 and stop.exit_code == PREEMPTED_EXIT_CODE
    assert sorted(stopped[0].losses) == [1, 2, 3, 4, 5]  # epoch 2 (iterations 4-6) cut short
    assert stop.checkpoint == tmp_path / 'work' / 'iter_5.pth'
    assert find_resumable_checkpoint(tmp_path / 'work') == str(stop.checkpoint)
    # the hook's handler stays through the stop (a second signal cannot kill the process
    # before it exits) until the caller, going on, puts the previous one back
    assert stopped[1].handler_after_stop not in (before, signal.SIG_DFL)
    assert signal.getsignal(signum) == before

    CountedData.loaded[0] = 0
    resumed = epoch_run(tmp_path / 'work', resume=True)
    assert CountedData.loaded[0] == 4 * 2  # iterations 6-9 only: no trained batch is loaded
    # losses, weights, and each batch's place in its epoch as hooks and log lines read it:
    # the resumed epoch goes on at [2][3/3] (end of epoch: logged), then [3][1/3], ...
    assert full[0].log.lines[6].startswith('Epoch(train) [2][3/3]')
    assert_same_run(full, resumed, first_resumed=6)
    assert (tmp_path / 'work' / 'epoch_2.pth').is_file()  # epoch checkpoints go on as before


def test_resume_without_the_skip_would_differ(tmp_path):
    # The premise of the count: a resumed epoch started from its first batch trains other data.
    full = epoch_run(tmp_path / 'full')
    epoch_run(tmp_path / 'work', signal_after=5)
    checkpoint = torch.load(tmp_path / 'work' / 'iter_5.pth', weights_only=True)
    checkpoint['meta']['iter'] = 3  # as if the epoch had not started: no batch skipped
    torch.save(checkpoint, tmp_path / 'work' / 'iter_5.pth')
    resumed = epoch_run(tmp_path / 'work', resume=True)
    assert not _same_weights(resumed[1], full[1])


def test_preemption_saves_count_among_the_checkpoints_kept(tmp_path):
    # max_keep_ckpts=2: a run stopped and resumed again and again keeps its two newest
    # checkpoints, whether epoch checkpoints or the saves on a signal.
    keep = dict(interval=1, max_keep_ckpts=2)
    stages = [(2, {'iter_2.pth'}), (4, {'epoch_1.pth', 'iter_4.pth'}),
              (5, {'iter_4.pth', 'iter_5.pth'}), (None, {'epoch_2.pth', 'epoch_3.pth'})]
    for stage, (signal_after, files) in enumerate(stages):
        runner = epoch_run(tmp_path, signal_after=signal_after, resume=stage > 0,
                           checkpoint=keep)[1]
        assert (runner.preempted is None) == (signal_after is None)
        assert {path.name for path in tmp_path.glob('*.pth')} == files, f'stage {stage}'
        named = Path((tmp_path / 'last_checkpoint').read_text())
        assert named.is_file() and named.name == (f'iter_{signal_after}.pth' if signal_after
                                                  else 'epoch_3.pth')


DEMO_CLASSIFIER = REPO_ROOT / 'configs/vit/vit-mini-p16_1xb64-a2-8e_demo-in10-64px.py'


def demo_classifier_run(work_dir: Path, data_root: Path, signal_after: int | None = None,
                        resume: bool | Path = False, workers: int = 2, persistent: bool = False,
                        epochs: int = 1) -> Runner:
    """The demo classifier (random-resized crop, flip, RandAugment, random erasing in
    ``workers`` loader workers; Mixup / CutMix), ``epochs`` epochs of 3 batches of 4 (a
    checkpoint at each epoch's end), no validation; AdamW (the recipe's LAMB steps slowly on
    CPU). ``resume``: the newest checkpoint of the work dir, or that file."""
    options = {'train_dataloader.batch_size': 4, 'train_dataloader.num_workers': workers,
               'train_dataloader.persistent_workers': persistent,
               'train_cfg.max_epochs': epochs, 'train_cfg.val_interval': 10,
               'default_hooks.checkpoint.interval': 1,
               'default_hooks.checkpoint.max_keep_ckpts': -1,
               'optim_wrapper.optimizer.type': 'AdamW', 'randomness.seed': 0,
               'randomness.deterministic': True}
    cfg = load_tool_config(str(DEMO_CLASSIFIER), options, 'none', str(work_dir))
    point_at_data_root(cfg, data_root)
    cfg.update(resume=bool(resume), load_from=str(resume) if isinstance(resume, Path) else None,
               experiment_name=f'demo{next(RUN_IDS)}',
               custom_hooks=[dict(type='vitdense.ExactResumeHook'),
                             dict(type='vitdense.PreemptionHook', requeue=False)])
    runner = Runner.from_cfg(cfg)
    runner.register_hook(SignalAfter(signal_after))
    runner.preempted = None
    try:
        runner.train()
    except Preempted as stop:
        runner.preempted = stop
        stop.restore_signals()
    return runner


def test_preemption_saves_do_not_count_where_checkpoints_go_elsewhere(tmp_path):
    # out_dir: the hook keeps one checkpoint there; the saves on a signal, in the work dir,
    # are not its own to count or remove.
    keep = dict(interval=1, max_keep_ckpts=1, out_dir=str(tmp_path / 'out'))
    for stage, signal_after in enumerate([2, 4, None]):
        epoch_run(tmp_path / 'work', signal_after=signal_after, resume=stage > 0,
                  checkpoint=keep)
    assert {path.name for path in (tmp_path / 'work').glob('*.pth')} == {'iter_2.pth',
                                                                         'iter_4.pth'}
    assert [path.name for path in (tmp_path / 'out').rglob('*.pth')] == ['epoch_3.pth']


def test_demo_classifier_with_loader_workers_resumes_mid_epoch_exactly(tmp_path):
    # Stopped after the first iteration, resumed: the fresh workers load batches 2-3 of
    # the epoch (worker 0 loads what worker 1 loaded uninterrupted) with the augmentations
    # of the uninterrupted run.
    data_root = make_demo_imagenet(tmp_path / 'in10', num_train=1, num_val=1, size=72)
    full = demo_classifier_run(tmp_path / 'full', data_root)
    stopped = demo_classifier_run(tmp_path / 'work', data_root, signal_after=1)
    assert stopped.preempted is not None and stopped.preempted.iteration == 1
    resumed = demo_classifier_run(tmp_path / 'work', data_root, resume=True)
    assert resumed.iter == full.iter == 3
    assert _max_difference(resumed, full) == 0


def _max_difference(a: Runner, b: Runner) -> float:
    theirs = b.model.state_dict()
    return max(float((value - theirs[key]).abs().max())
               for key, value in a.model.state_dict().items())


def test_demo_classifier_resumes_an_epoch_checkpoint_with_persistent_workers(tmp_path):
    # The persistent workers' iterator is built once in the uninterrupted run and afresh in
    # the resumed one: its seed comes from the loader's own generator, so the resumed run
    # draws what the uninterrupted one drew.
    data_root = make_demo_imagenet(tmp_path / 'in10', num_train=1, num_val=1, size=72)
    full = demo_classifier_run(tmp_path / 'full', data_root, persistent=True, epochs=2)
    resumed = demo_classifier_run(tmp_path / 'work', data_root, persistent=True, epochs=2,
                                  resume=tmp_path / 'full' / 'epoch_1.pth')
    assert resumed.iter == full.iter == 6
    assert _max_difference(resumed, full) == 0


def test_demo_classifier_resumed_with_other_num_workers_repeats_the_run(tmp_path):
    # Stopped with 2 persistent workers, resumed with none: each batch is loaded from its
    # own seed in a worker or in the training process alike, so the augmentations and the
    # training stream are those of the uninterrupted run.
    data_root = make_demo_imagenet(tmp_path / 'in10', num_train=1, num_val=1, size=72)
    full = demo_classifier_run(tmp_path / 'full', data_root, persistent=True, epochs=2)
    before = set(multiprocessing.active_children())
    stopped = demo_classifier_run(tmp_path / 'work', data_root, signal_after=4,
                                  persistent=True, epochs=2)
    assert stopped.preempted is not None and stopped.preempted.iteration == 4
    assert set(multiprocessing.active_children()) <= before  # the stop ended the workers
    assert stopped.train_loop.dataloader._iterator is None
    resumed = demo_classifier_run(tmp_path / 'work', data_root, resume=True, workers=0,
                                  epochs=2)
    assert _max_difference(resumed, full) == 0


def test_shielded_loader_workers_take_stop_signals_from_their_trainer_only():
    # SIGTERM and SIGUSR1 from another process (a launcher) leave the workers loading; the
    # trainer's own SIGTERM (torch's way to end a worker) ends one.
    loader = DataLoader(range(8), batch_size=2, num_workers=2, persistent_workers=True)
    assert shield_loader_workers(loader, [signal.SIGUSR1])
    assert not shield_loader_workers(loader, [signal.SIGUSR1])  # once
    batches = iter(loader)
    # a batch from each worker: both are past their start-up, where the shield is set
    assert [next(batches).tolist() for _ in range(2)] == [[0, 1], [2, 3]]
    for worker in batches._workers:
        for name in ('TERM', 'USR1'):
            subprocess.run(['kill', f'-{name}', str(worker.pid)], check=True)
    time.sleep(1)
    assert [batch.tolist() for batch in batches] == [[4, 5], [6, 7]]
    assert all(worker.is_alive() for worker in batches._workers)
    worker = batches._workers[0]
    worker.terminate()
    worker.join(timeout=10)
    assert worker.exitcode == 0
    batches._shutdown_workers()


class _Cycle:
    """An object that refers to itself, as mmengine's runner does, holding ``loader``."""

    def __init__(self, loader: DataLoader) -> None:
        self.loader, self.itself = loader, self


def test_a_loader_left_to_the_garbage_collector_waits_out_its_worker():
    # Why a run ends its loaders' workers itself: a persistent loader held in a reference
    # cycle (the runner's) is ended by the garbage collector, which closes the loader's
    # index queue before torch's shutdown can send the worker its end-of-work message, so
    # the shutdown waits MP_STATUS_CHECK_INTERVAL (5 s) for the worker, then terminates it.
    loader = DataLoader(range(4), batch_size=2, num_workers=1, persistent_workers=True)
    assert [batch.tolist() for batch in loader] == [[0, 1], [2, 3]]
    worker = loader._iterator._workers[0]
    _Cycle(loader)
    del loader
    start = time.monotonic()
    gc.collect()
    assert time.monotonic() - start >= MP_STATUS_CHECK_INTERVAL
    assert not worker.is_alive()


def test_a_finished_run_ends_its_loader_workers(tmp_path):
    # The demo classifier with 2 persistent loader workers trains to its end: when the
    # runner returns, the workers are gone (not left to the collector or the exit) and the
    # loader starts new ones for a later pass.
    data_root = make_demo_imagenet(tmp_path / 'in10', num_train=1, num_val=1, size=72)
    before = set(multiprocessing.active_children())
    runner = demo_classifier_run(tmp_path / 'work', data_root, persistent=True)
    assert runner.preempted is None and runner.iter == 3
    assert set(multiprocessing.active_children()) <= before
    assert runner.train_loop.dataloader._iterator is None


def test_loader_workers_signalled_as_they_start_keep_loading():
    # Each worker is sent SIGTERM by another process (itself) as it starts, before torch's
    # worker loop and the shield's worker_init_fn run: it started with the stop signals
    # blocked, so the shield takes the signal once set and ignores it, and every batch loads.
    # The process starting the workers gets its own signal mask back.
    loader = DataLoader(range(8), batch_size=2, num_workers=2,
                        multiprocessing_context=ForkSignalledAtStart())
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    assert shield_loader_workers(loader, [signal.SIGUSR1])
    assert [batch.tolist() for batch in loader] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == mask


def test_unknown_or_uncatchable_signal_is_refused():
    with pytest.raises(ValueError, match=r"names of signals a process can catch.*'SIGKILL'"):
        PreemptionHook(signals=('SIGKILL',))
    with pytest.raises(ValueError, match=r"not these: \['SIGTREM'\]"):
        PreemptionHook(signals=('SIGTREM',))


def _rank_of_two(rank: int, port: int, work_dir: str, out: str, signal_after: int | None,
                 resume: bool) -> None:
    """One process of two (forked); the signal goes to rank 1 only."""
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR='127.0.0.1', MASTER_PORT=str(port), RANK=str(rank),
                      LOCAL_RANK=str(rank), WORLD_SIZE='2')
    dist.init_process_group('gloo')
    record, runner = epoch_run(Path(work_dir), signal_after=signal_after if rank == 1 else None,
                               resume=resume, distributed=True)
    stop = runner.preempted
    torch.save(dict(losses=record.losses, weights=runner.model.module.state_dict(),
                    stopped_after=None if stop is None else stop.iteration),
               Path(out) / f'rank{rank}.pth')
    dist.barrier()
    dist.destroy_process_group()


def _two_processes(work_dir: Path, out: Path, signal_after: int | None = None,
                   resume: bool = False) -> list[dict]:
    out.mkdir(parents=True, exist_ok=True)
    port = free_port()
    mp.start_processes(_rank_of_two, args=(port, str(work_dir), str(out), signal_after, resume),
                       nprocs=2, start_method='fork')
    return [torch.load(out / f'rank{rank}.pth', weights_only=True) for rank in (0, 1)]


def test_two_processes_stop_together_and_resume_exactly(tmp_path):
    full = _two_processes(tmp_path / 'full', tmp_path / 'full_out')
    stopped = _two_processes(tmp_path / 'work', tmp_path / 'stopped_out', signal_after=5)
    assert [s['stopped_after'] for s in stopped] == [5, 5]  # rank 0 got no signal
    resumed = _two_processes(tmp_path / 'work', tmp_path / 'resumed_out', resume=True)
    for rank in (0, 1):
        assert sorted(resumed[rank]['losses']) == [6, 7, 8, 9]
        for i, loss in resumed[rank]['losses'].items():
            assert torch.equal(loss, full[rank]['losses'][i]), f'rank {rank}, iteration {i}'
    for key, value in full[0]['weights'].items():
        assert torch.equal(value, resumed[0]['weights'][key]), key


PER_EPOCH = 3  # 10 demo images in batches of 4
#: moment of the launcher's signal -> the iterations the stop checkpoint holds
STOPPED_AFTER = dict(training=PER_EPOCH + 1, last_of_epoch=PER_EPOCH, saving=PER_EPOCH,
                     validation=PER_EPOCH, worker_start=1)


def _demo_leaf(path: Path, data_root: Path, moment: str | None = None,
               hold: str | None = None, start_method: str | None = None) -> Path:
    """The demo classifier with its own loader settings (persistent workers), on the 10-image
    demo set for 2 epochs, validated and saved every epoch (the last one kept); with
    ``moment``, its process group gets SIGTERM then, and ``hold`` stalls the trainer
    afterwards (``launcher_signals.LauncherSignalHook``); ``start_method``: how the loaders
    start their workers (multiprocessing's default: ``fork`` on Linux)."""
    context = '' if start_method is None else f", multiprocessing_context='{start_method}'"
    loader = f"dict(dataset=dict(data_root='{data_root}'){context}"
    signal_hook = ('' if moment is None else
                   "custom_imports = dict(imports=['vitdense', 'vitdense.cls', "
                   "'launcher_signals'], allow_failed_imports=False)\n"
                   f"custom_hooks = [dict(type='LauncherSignalHook', moment='{moment}', "
                   f"iterations_per_epoch={PER_EPOCH}, hold={hold!r})]\n")
    path.write_text(f"_base_ = ['{DEMO_CLASSIFIER}']\n"
                    f"train_dataloader = {loader}, batch_size=4)\n"
                    f"val_dataloader = {loader}, batch_size=5)\n"
                    f"test_dataloader = val_dataloader\n"
                    "train_cfg = dict(max_epochs=2, val_interval=1)\n"
                    "default_hooks = dict(checkpoint=dict(interval=1), logger=dict(interval=1))\n"
                    "randomness = dict(seed=0, deterministic=True)\n" + signal_hook)
    return path


def _train_until_killed(config: Path, work_dir: Path, grace: float = 2.0) -> tuple[int, str]:
    """``tools/train.py`` in a process group of its own, which gets SIGKILL ``grace`` seconds
    after the trainer reports its stop signal, as SLURM (``KillWait``) and torchrun's agent
    (``--shutdown-timeout``) escalate; its exit status and output."""
    trainer = train_tool(config, work_dir)
    trainer.until('SIGTERM received', 600)
    time.sleep(grace)
    trainer.signal_group(signal.SIGKILL)
    return trainer.end(60)


@pytest.fixture(scope='module')
def demo_reference(tmp_path_factory) -> tuple[Path, dict]:
    """The demo set and the uninterrupted run's final weights."""
    root = tmp_path_factory.mktemp('demo_reference')
    data_root = make_demo_imagenet(root / 'in10', num_train=1, num_val=1, size=72)
    status, log = train_to_end(_demo_leaf(root / 'leaf.py', data_root), root / 'work')
    assert status == 0, log[-3000:]
    return data_root, safe_load(str(root / 'work' / 'epoch_2.pth'))['state_dict']


@pytest.mark.parametrize('moment', list(STOPPED_AFTER))
def test_launcher_signal_to_the_process_group_stops_and_resume_is_exact(tmp_path, moment,
                                                                        demo_reference):
    # SIGTERM to every process of the trainer's group, its persistent loader workers
    # included, in training, at an epoch's last iteration, during a save, in validation,
    # and as the training loader's (spawned) workers start, before their shield is set:
    # exit 75 with the checkpoint of where the run was, no process left, and --resume ends
    # bit for bit where the uninterrupted run ended.
    data_root, reference = demo_reference
    work = tmp_path / 'work'
    status, log = train_to_end(_demo_leaf(tmp_path / 'signalled.py', data_root, moment), work)
    assert status == PREEMPTED_EXIT_CODE, log[-3000:]
    assert 'killed by signal' not in log
    stop = work / f'iter_{STOPPED_AFTER[moment]}.pth'
    assert (work / 'last_checkpoint').read_text() == str(stop)
    assert safe_load(str(stop))['meta']['iter'] == STOPPED_AFTER[moment]

    status, log = train_to_end(_demo_leaf(tmp_path / 'leaf.py', data_root), work, '--resume')
    assert status == 0, log[-3000:]
    resumed = safe_load(str(work / 'epoch_2.pth'))['state_dict']
    assert max(float((resumed[key] - value).abs().max()) for key, value in reference.items()) == 0


SHIPPED_PER_EPOCH = 2  # 70 demo images in the recipe's batches of 64
#: the demo classifier as shipped (its runtime's ``seed=None, diff_rank_seed=True``, its
#: persistent loader worker, LAMB, validation every 2 epochs) for 2 epochs, both epochs'
#: checkpoints kept
SHIPPED_RUN = ('train_cfg = dict(max_epochs=2)\n'
               'default_hooks = dict(checkpoint=dict(interval=1, max_keep_ckpts=2))\n')


def test_the_shipped_demo_classifier_stops_and_resumes_exactly_with_its_drawn_seed(tmp_path):
    # The recipe as users run it: the run draws its seed. SIGTERM to the group in epoch 2
    # exits 75, and --resume ends bit for bit where the uninterrupted run of that seed ends
    # (the same recipe given the seed drawn); so does --resume from that run's epoch 1
    # checkpoint. Both resumed runs are built with the checkpoint's seed (its data order),
    # not one they draw.
    data_root = make_demo_imagenet(tmp_path / 'in10', num_train=7, num_val=1, size=72)
    leaf = shipped_leaf(tmp_path / 'leaf.py', DEMO_CLASSIFIER, data_root, SHIPPED_RUN)
    work = tmp_path / 'stopped'
    status, log = train_to_end(shipped_leaf(tmp_path / 'signalled.py', DEMO_CLASSIFIER, data_root,
                                            SHIPPED_RUN, 'training', SHIPPED_PER_EPOCH), work)
    assert status == PREEMPTED_EXIT_CODE, log[-3000:]
    assert (work / 'last_checkpoint').read_text() == str(work / 'iter_3.pth')
    status, log = train_to_end(leaf, work, '--resume')
    assert status == 0, log[-3000:]

    seed = safe_load(str(work / 'iter_3.pth'))['meta']['seed']
    status, log = train_to_end(leaf, tmp_path / 'full', '--cfg-options', f'randomness.seed={seed}')
    assert status == 0, log[-3000:]
    reference = safe_load(str(tmp_path / 'full' / 'epoch_2.pth'))['state_dict']
    assert largest_difference(work / 'epoch_2.pth', reference) == 0

    work = tmp_path / 'from_epoch_1'
    status, log = train_to_end(leaf, work, '--resume', str(tmp_path / 'full' / 'epoch_1.pth'))
    assert status == 0, log[-3000:]
    assert 'resumes a checkpoint of seed' not in log
    assert largest_difference(work / 'epoch_2.pth', reference) == 0


@pytest.mark.parametrize('held', ['iteration', 'save'])
def test_sigkill_after_the_grace_period_leaves_the_last_checkpoint_to_resume(tmp_path, held,
                                                                             demo_reference):
    # SIGTERM to the process group after the first iteration of epoch 2, SIGKILL to it 2 s
    # later while the trainer is still in that iteration or in the save of its stop: the
    # epoch 1 checkpoint (the one kept) is intact and named, no file is left half-written,
    # and --resume picks it without a word of a missing or unreadable file and ends bit for
    # bit where the uninterrupted run ended.
    data_root, reference = demo_reference
    work = tmp_path / 'work'
    status, log = _train_until_killed(_demo_leaf(tmp_path / 'signalled.py', data_root,
                                                 'training', hold=held), work)
    assert status == -signal.SIGKILL, log[-3000:]
    assert (work / 'last_checkpoint').read_text() == str(work / 'epoch_1.pth')
    assert sorted(path.name for path in work.iterdir() if path.suffix != '.py'
                  and not path.is_dir()) == ['epoch_1.pth', 'last_checkpoint']
    assert all(Path(path).is_file() for path in re.findall(r'/[^\s\'"]+\.pth\b', log))

    status, log = train_to_end(_demo_leaf(tmp_path / 'leaf.py', data_root), work, '--resume')
    assert status == 0, log[-3000:]
    assert f'--resume: resuming from {work / "epoch_1.pth"}' in log
    assert 'does not exist' not in log and 'cannot resume' not in log
    resumed = safe_load(str(work / 'epoch_2.pth'))['state_dict']
    assert max(float((resumed[key] - value).abs().max()) for key, value in reference.items()) == 0



def test_forkserver_loader_workers_stop_and_let_a_finished_run_exit(tmp_path, demo_reference):
    # Loader workers forked by multiprocessing's fork server, whose children they are (not
    # the trainer's): SIGTERM to the group mid-epoch 2 stops the run (exit 75), and the
    # resumed run ends bit for bit where the uninterrupted one ended and exits, its workers
    # ended by the trainer's SIGTERM at its exit.
    data_root, reference = demo_reference
    work = tmp_path / 'work'
    status, log = train_to_end(_demo_leaf(tmp_path / 'signalled.py', data_root, 'training',
                                    start_method='forkserver'), work)
    assert status == PREEMPTED_EXIT_CODE, log[-3000:]
    resumed = train_tool(_demo_leaf(tmp_path / 'leaf.py', data_root, start_method='forkserver'),
                       work, '--resume')
    resumed.until(f'Epoch(train) [2][{PER_EPOCH}/{PER_EPOCH}]', 600)  # the last iteration
    status, log = resumed.end(120)  # then a validation, a save and the exit
    assert status == 0, log[-3000:]
    final = safe_load(str(work / 'epoch_2.pth'))['state_dict']
    assert max(float((final[key] - value).abs().max()) for key, value in reference.items()) == 0


@pytest.mark.parametrize('gap', [0.2, 0.5])
def test_a_second_sigterm_after_the_stop_save_still_exits_75(tmp_path, demo_reference, gap):
    # SIGTERM to the group (forkserver loader workers) mid-epoch 2, and again ``gap`` s after
    # the trainer logs its saved stop, while its exit is under way (held 3 s, as a slow
    # exit): exit 75 with that checkpoint, not killed by the second signal (-15).
    data_root, _ = demo_reference
    work = tmp_path / 'work'
    trainer = train_tool(_demo_leaf(tmp_path / 'signalled.py', data_root, 'training',
                                  hold='exit', start_method='forkserver'), work)
    trainer.until('stopping after iteration', 600)
    time.sleep(gap)
    assert trainer.process.poll() is None  # still exiting
    trainer.signal_group(signal.SIGTERM)
    status, log = trainer.end(120)
    assert status == PREEMPTED_EXIT_CODE, log[-3000:]
    assert (work / 'last_checkpoint').read_text() == str(work / f'iter_{PER_EPOCH + 1}.pth')


def _torchrun(config: Path, work_dir: Path, *extra: str) -> Watched:
    """``tools/torchrun.sh`` starting 2 processes of ``tools/train.py`` on CPU, in a process
    group of its own (a scheduler's SIGTERM goes to that group), watched. Temporary files go
    beside ``work_dir``."""
    env = {**CHECKOUT_ENV, 'OMP_NUM_THREADS': '1', 'CUDA_VISIBLE_DEVICES': '',
           'PYTHONUNBUFFERED': '1', 'TMPDIR': str(work_dir.parent)}
    return Watched(['bash', 'tools/torchrun.sh', '2', 'tools/train.py', str(config),
                    '--work-dir', str(work_dir), '--skip-data-check', *extra], env)


def test_torchrun_launcher_exits_75_on_a_stop_and_its_own_status_on_a_failure(tmp_path):
    # SIGTERM to the launcher's process group (tools/torchrun.sh and torchrun's agent, which
    # forwards it to the workers' own process groups) once the first iteration is logged:
    # both workers save and exit 75, torchrun exits 1, and the launcher exits 75, leaving the
    # stop checkpoint for --resume. Workers that fail (a config option the config does not
    # have) leave the launcher torchrun's status.
    data_root = make_demo_imagenet(tmp_path / 'in10', num_train=1, num_val=1, size=72)
    config, work = _demo_leaf(tmp_path / 'leaf.py', data_root), tmp_path / 'work'
    # 8 epochs of 2 iterations: the signal lands well before the end, after iteration 1 or 2
    launcher = _torchrun(config, work, '--cfg-options', 'train_cfg.max_epochs=8')
    launcher.until('Epoch(train) [1][1/2]', 300)
    launcher.signal_group(signal.SIGTERM)
    status, log = launcher.end(300)
    assert status == PREEMPTED_EXIT_CODE, log[-3000:]
    stop = Path((work / 'last_checkpoint').read_text())
    stopped_after = re.fullmatch(r'iter_(\d+)\.pth', stop.name)
    assert stop.parent == work and stopped_after, stop
    assert safe_load(str(stop))['meta']['iter'] == int(stopped_after[1]) < 16
    assert find_resumable_checkpoint(work) == str(stop)  # what --resume loads
    assert not list(tmp_path.glob('vitdense-stopped.*'))  # the launcher's, in its TMPDIR

    status, log = _torchrun(config, tmp_path / 'failed', '--cfg-options', 'no_such_key=1').end(300)
    assert status not in (0, PREEMPTED_EXIT_CODE), log[-3000:]
    assert "has no top-level key 'no_such_key'" in log


def test_torchrun_restarts_a_group_whose_worker_died_from_its_last_checkpoint(tmp_path):
    # torchrun --max-restarts 1, and rank 1 killed (SIGKILL: no stop checkpoint) after the
    # first iteration of epoch 2: the agent stops rank 0 and starts the group again on a new
    # rendezvous (gloo), which resumes from the epoch-1 checkpoint without being told
    # (TORCHELASTIC_RESTART_COUNT), repeats epoch 2's first loss and finishes.
    data_root = make_demo_imagenet(tmp_path / 'in10', num_train=1, num_val=1, size=72)
    config, work = _demo_leaf(tmp_path / 'leaf.py', data_root), tmp_path / 'work'
    with config.open('a') as leaf:
        leaf.write("custom_imports = dict(imports=['vitdense', 'vitdense.cls', "
                   "'launcher_signals'], allow_failed_imports=False)\n"
                   "custom_hooks = [dict(type='KillRankOnce', rank=1, iteration=3)]\n")
    env = {**CHECKOUT_ENV, 'OMP_NUM_THREADS': '1', 'CUDA_VISIBLE_DEVICES': '',
           'PYTHONPATH': f'{REPO_ROOT}{os.pathsep}{Path(__file__).parent}'}
    done = subprocess.run(
        [sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=2',
         '--max-restarts=1', 'tools/train.py', str(config), '--work-dir', str(work),
         '--skip-data-check', '--launcher', 'pytorch', '--cfg-options', 'train_cfg.max_epochs=3'],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300)
    text = done.stdout + done.stderr
    assert done.returncode == 0, text[-3000:]
    assert 'exitcode: -9' in text  # rank 1 died, and the group was started again
    for rank in (0, 1):
        assert f'rank {rank} of 2: --resume: resuming from {work / "epoch_1.pth"}' in text
    first_losses = re.findall(r'Epoch\(train\) \[2\]\[1/2\].*loss: (\S+)', text)
    assert len(first_losses) == 2 and first_losses[0] == first_losses[1], first_losses
    assert 'Epoch(train) [3][2/2]' in text and (work / 'epoch_3.pth').is_file()


def test_a_finished_launched_run_exits_within_what_its_loaders_alone_once_took(tmp_path):
    # 2 processes under tools/torchrun.sh for an epoch of 2 iterations; each one's training
    # and validation loaders keep a worker. Left to the garbage collection with which each
    # process closes its process group, those loaders' ends alone took 2 x
    # MP_STATUS_CHECK_INTERVAL (10 s; 15.1 s for the whole tail on two shared cores at a
    # load of 8). Ended with the run, the whole tail from the last training iteration's line
    # (a validation, a save, the group's close, the exits of the processes, torchrun's agent
    # and the launcher) takes less: 2.9 and 3.6 s there.
    data_root = make_demo_imagenet(tmp_path / 'in10', num_train=1, num_val=1, size=72)
    launcher = _torchrun(_demo_leaf(tmp_path / 'leaf.py', data_root), tmp_path / 'work',
                         '--cfg-options', 'train_cfg.max_epochs=1')
    launcher.until(re.compile(r'Epoch\(train\) +\[1\]\[2/2\]'), 300)
    last_iteration = time.monotonic()
    status, log = launcher.end(300)
    tail = time.monotonic() - last_iteration
    assert status == 0, log[-3000:]
    assert tail < 2 * MP_STATUS_CHECK_INTERVAL, f'{tail:.1f} s'


def _processes_under(folder: Path) -> list[int]:
    """The processes whose environment names a ``VITDENSE_STOPPED_DIR`` in ``folder``: those
    a tools/torchrun.sh started with ``folder`` as its TMPDIR (workers, loader workers)."""
    found = []
    for entry in Path('/proc').iterdir():
        try:
            environ = (entry / 'environ').read_bytes().split(b'\0') if entry.name.isdigit() else []
        except OSError:
            continue
        if any(variable.startswith(f'VITDENSE_STOPPED_DIR={folder}/'.encode())
               for variable in environ):
            found.append(int(entry.name))
    return found


def test_torchrun_launcher_signalled_twice_exits_75_and_outlives_its_processes(tmp_path):
    # SIGTERM to the launcher's process group once the first iteration is logged, and again
    # 0.2 s later, while torchrun's agent shuts its workers down (the second signal ends the
    # agent's shutdown, leaving the workers): the launcher waits for every process it
    # started, then exits 75 with the stop checkpoint.
    data_root = make_demo_imagenet(tmp_path / 'in10', num_train=1, num_val=1, size=72)
    config, work = _demo_leaf(tmp_path / 'leaf.py', data_root), tmp_path / 'work'
    launcher = _torchrun(config, work, '--cfg-options', 'train_cfg.max_epochs=8')
    launcher.until('Epoch(train) [1][1/2]', 300)
    launcher.signal_group(signal.SIGTERM)
    time.sleep(0.2)
    launcher.signal_group(signal.SIGTERM)
    status = launcher.exit(300)
    left = _processes_under(tmp_path)
    log = launcher.end(60)[1]
    assert not left and status == PREEMPTED_EXIT_CODE, (left, log[-3000:])
    stop = Path((work / 'last_checkpoint').read_text())
    assert re.fullmatch(r'iter_\d+\.pth', stop.name)
    assert find_resumable_checkpoint(work) == str(stop)


def test_torchrun_launcher_signalled_after_a_finished_run_exits_0(tmp_path):
    # SIGTERM to the launcher's process group at the finished run's last line (its
    # validation's result), while its processes and torchrun's agent end: the run is
    # complete, and the launcher says so (0), not a failure (1).
    data_root = make_demo_imagenet(tmp_path / 'in10', num_train=1, num_val=1, size=72)
    config, work = _demo_leaf(tmp_path / 'leaf.py', data_root), tmp_path / 'work'
    launcher = _torchrun(config, work, '--cfg-options', 'train_cfg.max_epochs=1')
    launcher.until('accuracy/top1', 300)
    launcher.signal_group(signal.SIGTERM)
    status, log = launcher.end(300)
    assert status == 0, log[-3000:]
    assert (work / 'last_checkpoint').read_text() == str(work / 'epoch_1.pth')
