"""A hook that sends a stop signal to the trainer's whole process group (its loader workers
included) at a chosen moment of a run, as torchrun's agent (``os.killpg``) and ``srun`` send
it; imported by the trainer through ``custom_imports`` in the preemption tests. Loader worker
processes that are sent a stop signal as they start, before torch's worker loop runs."""
from __future__ import annotations

import atexit
import os
import signal
import time
from multiprocessing.context import ForkContext, ForkProcess, SpawnContext, SpawnProcess
from typing import Any

from mmengine.hooks import Hook
from mmengine.registry import HOOKS

#: the moments ``LauncherSignalHook`` can signal at
MOMENTS = ('training', 'last_of_epoch', 'saving', 'validation', 'worker_start')


class SignalledAtStart(ForkProcess):
    """A forked process sent SIGTERM by itself (a process other than its parent) first
    thing in its start-up, before its target runs."""

    def run(self) -> None:
        os.kill(os.getpid(), signal.SIGTERM)
        super().run()


class ForkSignalledAtStart(ForkContext):
    """The ``fork`` context, starting :class:`SignalledAtStart` processes."""

    Process = SignalledAtStart


class GroupSignalledAtStart(SpawnProcess):
    """A spawned process that, first thing once its interpreter runs, sends SIGTERM to its
    process group: the trainer, this worker and its siblings, as a launcher's signal that
    reaches a loader worker while it starts."""

    def run(self) -> None:
        os.killpg(os.getpgid(0), signal.SIGTERM)
        super().run()


class SpawnGroupSignalledAtStart(SpawnContext):
    """The ``spawn`` context, starting :class:`GroupSignalledAtStart` processes."""

    Process = GroupSignalledAtStart


@HOOKS.register_module()
class LauncherSignalHook(Hook):
    """SIGTERM to the process group once, at ``moment``: after the first iteration of epoch 2
    (``training``), after the last iteration of epoch 1 (``last_of_epoch``), while the first
    checkpoint is being saved (``saving``), or after the first validation iteration
    (``validation``). Runs before ``PreemptionHook`` looks for a signal. ``worker_start``:
    each training loader worker, spawned, sends it to the group as it starts
    (:class:`GroupSignalledAtStart`); set before ``PreemptionHook`` shields the loader.

    ``hold``: once the signal is sent, the iteration in progress (``'iteration'``) or the
    next checkpoint save, before its file is written (``'save'``), takes ``HOLD_SECONDS``
    more, where a launcher's SIGKILL after its grace period lands; or the process's exit
    (``'exit'``, its exit handlers) takes ``EXIT_HOLD_SECONDS`` more, as a slow exit, where
    a second signal after the stop save lands.
    """

    priority = 'NORMAL'
    HOLD_SECONDS = 60
    EXIT_HOLD_SECONDS = 3

    def __init__(self, moment: str, iterations_per_epoch: int, hold: str | None = None) -> None:
        if moment not in MOMENTS:
            raise ValueError(f'moment must be one of {MOMENTS}, got {moment!r}')
        if hold not in (None, 'iteration', 'save', 'exit'):
            raise ValueError(f"hold must be None, 'iteration', 'save' or 'exit', "
                             f"got {hold!r}")
        self.moment, self.per_epoch, self.hold, self.sent = moment, iterations_per_epoch, hold, False

    def _send(self, moment: str) -> None:
        if moment == self.moment and not self.sent:
            self.sent = True
            os.killpg(os.getpgid(0), signal.SIGTERM)
            if self.hold == 'iteration':
                time.sleep(self.HOLD_SECONDS)
            if self.hold == 'exit':
                atexit.register(time.sleep, self.EXIT_HOLD_SECONDS)

    def before_train(self, runner: Any) -> None:
        if self.moment == 'worker_start':
            runner.train_loop.dataloader.multiprocessing_context = SpawnGroupSignalledAtStart()

    def after_train_iter(self, runner: Any, batch_idx: int, data_batch: Any = None,
                         outputs: Any = None) -> None:
        if runner.iter + 1 == self.per_epoch + 1:
            self._send('training')
        if runner.iter + 1 == self.per_epoch:
            self._send('last_of_epoch')

    def before_save_checkpoint(self, runner: Any, checkpoint: dict) -> None:
        if self.sent and self.hold == 'save':
            time.sleep(self.HOLD_SECONDS)
        self._send('saving')

    def after_val_iter(self, runner: Any, batch_idx: int, data_batch: Any = None,
                       outputs: Any = None) -> None:
        self._send('validation')


@HOOKS.register_module()
class KillRankOnce(Hook):
    """SIGKILL to the process of ``rank`` after its training iteration ``iteration`` (counted
    from 1), in the group's first start only (``TORCHELASTIC_RESTART_COUNT`` 0): a worker
    that dies without saving, for ``torchrun --max-restarts`` to start the group again."""

    def __init__(self, rank: int, iteration: int) -> None:
        self.rank, self.iteration = rank, iteration

    def after_train_iter(self, runner: Any, batch_idx: int, data_batch: Any = None,
                         outputs: Any = None) -> None:
        if (runner.rank == self.rank and runner.iter + 1 == self.iteration
                and os.environ.get('TORCHELASTIC_RESTART_COUNT') == '0'):
            os.kill(os.getpid(), signal.SIGKILL)
