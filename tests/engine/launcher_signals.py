"""A hook that sends a stop signal to the trainer's whole process group (its loader workers
included) at a chosen moment of a run, as torchrun's agent (``os.killpg``) and ``srun`` send
it; imported by the trainer through ``custom_imports`` in the preemption tests."""
from __future__ import annotations

import os
import signal
from typing import Any

from mmengine.hooks import Hook
from mmengine.registry import HOOKS

#: the moments ``LauncherSignalHook`` can signal at
MOMENTS = ('training', 'last_of_epoch', 'saving', 'validation')


@HOOKS.register_module()
class LauncherSignalHook(Hook):
    """SIGTERM to the process group once, at ``moment``: after the first iteration of epoch 2
    (``training``), after the last iteration of epoch 1 (``last_of_epoch``), while the first
    checkpoint is being saved (``saving``), or after the first validation iteration
    (``validation``). Runs before ``PreemptionHook`` looks for a signal."""

    priority = 'NORMAL'

    def __init__(self, moment: str, iterations_per_epoch: int) -> None:
        if moment not in MOMENTS:
            raise ValueError(f'moment must be one of {MOMENTS}, got {moment!r}')
        self.moment, self.per_epoch, self.sent = moment, iterations_per_epoch, False

    def _send(self, moment: str) -> None:
        if moment == self.moment and not self.sent:
            self.sent = True
            os.killpg(os.getpgid(0), signal.SIGTERM)

    def after_train_iter(self, runner: Any, batch_idx: int, data_batch: Any = None,
                         outputs: Any = None) -> None:
        if runner.iter + 1 == self.per_epoch + 1:
            self._send('training')
        if runner.iter + 1 == self.per_epoch:
            self._send('last_of_epoch')

    def before_save_checkpoint(self, runner: Any, checkpoint: dict) -> None:
        self._send('saving')

    def after_val_iter(self, runner: Any, batch_idx: int, data_batch: Any = None,
                       outputs: Any = None) -> None:
        self._send('validation')
