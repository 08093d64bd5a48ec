"""Saving a checkpoint when the job is told to stop (preemption, a time limit), then exiting
or requeueing the job.

A cluster stops a job with a signal and a grace period before SIGKILL: SLURM sends SIGTERM
(KillWait later, SIGKILL) on preemption or cancellation, and ``--signal=B:USR1@120`` a
warning before the time limit; Kubernetes sends SIGTERM. Python's default for both is to
die on the spot, losing every iteration since the last interval checkpoint (16k iterations
of the UperNet recipe). mmengine has no hook for this, hence :class:`PreemptionHook`.

The signal only sets a flag. At the end of the iteration in progress every process takes
part in one all-reduce of the flag, so all of them stop after the same iteration even when
the signal reached one of them only; all save through the atomic writer
(:func:`~vitdense.engine.checkpoint_hook.save_resumable`, random state and sampler position
included via :class:`~vitdense.engine.resume.ExactResumeHook`) and :class:`Preempted` is
raised. ``tools/train.py`` catches it and exits with :data:`PREEMPTED_EXIT_CODE`; under
SLURM process 0 first asks for the job to be requeued (``scontrol requeue``), and the
requeued job's ``--resume`` continues from that iteration.
"""
from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import threading
from pathlib import Path
from types import FrameType
from typing import Any, Sequence

import torch
from mmengine.dist import all_reduce, get_rank, get_world_size, is_main_process
from mmengine.hooks import Hook
from mmengine.logging import print_log

from vitdense.engine.checkpoint_hook import save_resumable
from vitdense.registry import HOOKS

#: exit status of a training process stopped by a preemption signal after its checkpoint
#: was saved (``EX_TEMPFAIL`` of sysexits.h: try again later, e.g. ``--resume``)
PREEMPTED_EXIT_CODE = 75


class Preempted(Exception):
    """Training stopped on a preemption signal; ``checkpoint`` holds the last iteration."""

    exit_code = PREEMPTED_EXIT_CODE

    def __init__(self, checkpoint: Path, iteration: int, requeued: bool) -> None:
        self.checkpoint, self.iteration, self.requeued = checkpoint, iteration, requeued
        then = 'the job was requeued' if requeued else 'run with --resume to continue'
        super().__init__(f'stopped by a preemption signal after iteration {iteration}; '
                         f'saved {checkpoint}; {then}')


def slurm_job_to_requeue() -> str | None:
    """The SLURM job id ``scontrol requeue`` takes (``<array job>_<task>`` for an array
    task), or None outside a SLURM job."""
    array_job, task = os.environ.get('SLURM_ARRAY_JOB_ID'), os.environ.get('SLURM_ARRAY_TASK_ID')
    if array_job and task:
        return f'{array_job}_{task}'
    return os.environ.get('SLURM_JOB_ID')


@HOOKS.register_module()
class PreemptionHook(Hook):
    """On any of ``signals``: save a checkpoint of the iteration in progress, then stop.

    Args:
        signals: names of the signals that mean "stop soon" (default SIGTERM and SIGUSR1).
        requeue: under SLURM (``SLURM_JOB_ID`` set, ``scontrol`` on the PATH), have process
            0 requeue the job once the checkpoint is saved (the job needs ``--requeue``).

    The handlers are installed when the hook is built (with the Runner, before its data
    loaders start their worker processes), so that forked workers inherit them and survive
    a signal sent to the whole process group, as SLURM sends it; they are put back when
    training ends or stops.
    """

    priority = 'LOWEST'  # after every other hook has finished the iteration (checkpoint, logs)

    def __init__(self, signals: Sequence[str] = ('SIGTERM', 'SIGUSR1'),
                 requeue: bool = True) -> None:
        unknown = [name for name in signals if name in ('SIGKILL', 'SIGSTOP') or
                   not isinstance(getattr(signal, str(name), None), signal.Signals)]
        if unknown or not signals:
            raise ValueError(f'PreemptionHook signals={list(signals)!r}: give one or more '
                             f'names of signals a process can catch, such as SIGTERM, SIGUSR1 '
                             f'(not these: {unknown})')
        self.signals = [getattr(signal, name) for name in signals]
        self.requeue = requeue
        self.received: signal.Signals | None = None
        self.previous: dict[signal.Signals, Any] = {}
        self._install()

    def _install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            print_log('PreemptionHook built outside the main thread, where Python cannot '
                      'install signal handlers: preemption signals will not be caught',
                      logger='current', level=logging.WARNING)
            return
        for sig in self.signals:
            self.previous[sig] = signal.signal(sig, self._on_signal)

    def _uninstall(self) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
        self.previous = {}

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        """Only a flag and one line on stderr (os.write: a handler may run mid-print)."""
        if self.received is None:
            os.write(2, f'[pid {os.getpid()}] {signal.Signals(signum).name} received: saving '
                        f'a checkpoint at the end of this iteration, then stopping\n'.encode())
        self.received = signal.Signals(signum)

    def _agreed(self) -> bool:
        """Whether any process received a signal (every process calls this each iteration)."""
        flag = torch.tensor([0 if self.received is None else 1], dtype=torch.int32)
        if get_world_size() > 1:
            all_reduce(flag, op='max')
        return bool(flag.item())

    def after_train_iter(self, runner, batch_idx: int, data_batch: Any = None,
                         outputs: Any = None) -> None:
        if not self._agreed():
            return
        step = runner.iter + 1
        path = save_resumable(runner, step)
        how = self.received.name if self.received is not None else 'another process\'s signal'
        print_log(f'rank {get_rank()}: stopping after iteration {step} on {how}; saved '
                  f'{path}', logger='current', level=logging.WARNING)
        self._uninstall()
        raise Preempted(path, step, self._requeue())

    def after_train(self, runner) -> None:
        self._uninstall()

    def _requeue(self) -> bool:
        """Process 0 requeues the SLURM job; whether that was done."""
        job = slurm_job_to_requeue()
        if not (self.requeue and job and is_main_process()):
            return False
        scontrol = shutil.which('scontrol')
        if scontrol is None:
            print_log(f'SLURM job {job}: scontrol is not on the PATH, the job is not '
                      'requeued', logger='current', level=logging.WARNING)
            return False
        done = subprocess.run([scontrol, 'requeue', job], capture_output=True, text=True)
        if done.returncode != 0:
            print_log(f'scontrol requeue {job} failed ({done.stderr.strip()}); was the job '
                      'submitted with --requeue?', logger='current', level=logging.WARNING)
            return False
        print_log(f'SLURM job {job} requeued', logger='current')
        return True
