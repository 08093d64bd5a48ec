"""Training for a time budget instead of an iteration count.

Comparing backbones "within N minutes" needs every run to use the whole budget whatever its
speed, with a learning rate that still anneals to zero at the end. Following "Budgeted
Training" (Li et al., ICLR 2020), the learning rate decays linearly in the fraction of the
budget spent, after a short warmup in iterations. On a machine shared with other jobs the
budget can be counted in this process's CPU time instead of wall-clock time, so that the
work done in the budget does not depend on the neighbours.
"""
from __future__ import annotations

import logging
import time
from pathlib import Path

from mmengine.config import Config
from mmengine.hooks import Hook
from mmengine.logging import print_log
from mmengine.runner import LogProcessor

from vitdense.engine.hooks.checkpoint import save_resumable
from vitdense.registry import HOOKS, LOG_PROCESSORS


@HOOKS.register_module()
class TimeBudgetHook(Hook):
    """Stop training after ``minutes``; lr = base lr · warmup(iter) · (1 - spent fraction).

    ``clock`` is 'wall' (elapsed time) or 'process' (CPU time of this process, all threads).
    Replaces the param schedulers (configure none): every optimizer group keeps its own base
    lr (``initial_lr``, e.g. after layer-wise decay) and is scaled by the same factor.

    The budget spent travels in every checkpoint, so a resumed run goes on with the time
    that was left (and one resumed after its budget was used up trains no further). A
    checkpoint ``iter_<n>.pth`` is written each ``1 / checkpoints`` of the budget and when
    the budget is used up (mmengine's ``save_last`` only fires at ``max_iters``, which a
    budgeted run never reaches). They count among the checkpoints the run's
    ``SafeCheckpointHook`` keeps, which alone removes those beyond its ``max_keep_ckpts``
    (:func:`~vitdense.engine.hooks.checkpoint.save_resumable`); a run without one in the
    work dir keeps them all. The log line's ``eta`` is the budget left and ``budget_used``
    the fraction spent (the iteration count has no end to measure from);
    :class:`TimeBudgetLogProcessor` puts the minutes spent and budgeted in its header.
    """

    # After IterTimerHook (NORMAL), which writes an eta from max_iters, and before
    # LoggerHook (BELOW_NORMAL), which prints it.
    priority = 55
    CLOCKS = {'wall': time.monotonic, 'process': time.process_time}
    STATE_KEY = 'time_budget'
    INFO_KEY = 'time_budget_seconds'

    def __init__(self, minutes: float, warmup_iters: int = 50, warmup_ratio: float = 1e-3,
                 clock: str = 'wall', checkpoints: int = 10) -> None:
        if minutes <= 0:
            raise ValueError(f'minutes must be positive, got {minutes}')
        if clock not in self.CLOCKS:
            raise ValueError(f'clock must be one of {sorted(self.CLOCKS)}, got {clock!r}')
        if checkpoints < 1:
            raise ValueError(f'checkpoints must be at least 1 (the last), got {checkpoints}')
        self.budget = minutes * 60.0
        self.warmup_iters = warmup_iters
        self.warmup_ratio = warmup_ratio
        self.clock = self.CLOCKS[clock]
        self.checkpoints = checkpoints
        self.start = 0.0
        self.spent_before = 0.0
        self.saved: Path | None = None

    def before_train(self, runner) -> None:
        if runner.param_schedulers:
            raise ValueError('TimeBudgetHook sets the learning rate itself; '
                             'configure param_scheduler = []')
        for group in runner.optim_wrapper.param_groups:
            group.setdefault('initial_lr', group['lr'])
        self.start = self.clock()
        if self.spent() >= 1.0:
            runner.train_loop.stop_training = True
            print_log(f'the time budget of {self.budget / 60:.1f} min was used up before '
                      f'this resume (at iteration {runner.iter}); nothing left to train',
                      logger='current', level=logging.WARNING)

    def seconds_spent(self) -> float:
        """Budget seconds used so far, including the runs this one resumed."""
        return self.spent_before + self.clock() - self.start

    def spent(self) -> float:
        """Fraction of the budget used so far."""
        return self.seconds_spent() / self.budget

    def before_train_iter(self, runner, batch_idx: int, data_batch=None) -> None:
        warmup = min(1.0, self.warmup_ratio + (1 - self.warmup_ratio) *
                     runner.iter / max(self.warmup_iters, 1))
        decay = max(0.0, 1.0 - self.spent())
        for group in runner.optim_wrapper.param_groups:
            group['lr'] = group['initial_lr'] * warmup * decay

    def after_train_iter(self, runner, batch_idx: int, data_batch=None,
                         outputs=None) -> None:
        seconds = self.seconds_spent()
        runner.message_hub.update_info('eta', max(0.0, self.budget - seconds))
        runner.message_hub.update_info(self.INFO_KEY, (seconds, self.budget))
        runner.message_hub.update_scalar('train/budget_used', min(1.0, seconds / self.budget))
        if seconds >= self.budget:
            runner.train_loop.stop_training = True
            print_log(f'time budget of {self.budget / 60:.1f} min used after '
                      f'{runner.iter + 1} iterations', logger='current')
        elif int(seconds / self.budget * self.checkpoints) > \
                int(self.spent_before / self.budget * self.checkpoints):
            self._save(runner, runner.iter + 1)

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        checkpoint[self.STATE_KEY] = dict(seconds_spent=self.seconds_spent(),
                                          budget_seconds=self.budget)

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        state = checkpoint.get(self.STATE_KEY)
        if state is None:
            print_log('the checkpoint holds no time budget state; the budget starts anew',
                      logger='current', level=logging.WARNING)
            return
        self.spent_before = float(state['seconds_spent'])
        print_log(f'resuming a time-budgeted run: {self.spent_before / 60:.2f} of '
                  f'{self.budget / 60:.2f} min already used', logger='current')

    def after_train(self, runner) -> None:
        if self.saved is None or self.saved.name != f'iter_{runner.iter}.pth':
            self._save(runner, runner.iter)

    def _save(self, runner, step: int) -> None:
        """Checkpoint ``iter_<step>.pth`` (atomically) and point ``last_checkpoint`` at it.
        The budget spent is recorded so the next periodic save waits for the next
        ``1 / checkpoints`` of the budget."""
        self.spent_before, self.start = self.seconds_spent(), self.clock()
        self.saved = save_resumable(runner, step)


@LOG_PROCESSORS.register_module()
class TimeBudgetLogProcessor(LogProcessor):
    """mmengine's iteration log, headed by the time budget instead of a total iteration count.

    A budgeted run's loop has a stand-in ``max_iters`` that is never reached, so the usual
    header ``Iter(train) [ 100/1000000000]`` says nothing; with :class:`TimeBudgetHook` it
    reads ``Iter(train) [100 | 3.20/10.00 min]``, the minutes spent (runs resumed from
    included) of the budget. Validation and test lines, and lines of another layout
    (``by_epoch``), are mmengine's.
    """

    def get_log_after_iter(self, runner, batch_idx: int, mode: str) -> tuple[dict, str]:
        tag, log_str = super().get_log_after_iter(runner, batch_idx, mode)
        budget = runner.message_hub.get_info(TimeBudgetHook.INFO_KEY)
        cur_iter = self._get_iter(runner, batch_idx)
        header = f'Iter(train) [{str(cur_iter).rjust(len(str(runner.max_iters)))}/' \
                 f'{runner.max_iters}]'
        if mode != 'train' or budget is None or not log_str.startswith(header):
            return tag, log_str
        seconds, total = budget
        return tag, (f'Iter(train) [{cur_iter} | {seconds / 60:.2f}/{total / 60:.2f} min]'
                     + log_str[len(header):])


def train_on_time_budget(cfg: Config, minutes: float, clock: str = 'wall') -> None:
    """Rewrite ``cfg`` in place to train for ``minutes`` and evaluate once, at the end.

    The iteration loop is made open-ended, the param schedulers give way to
    :class:`TimeBudgetHook`, and one checkpoint is kept (the last), so the run's length is
    set by the clock on any machine while everything else of the recipe stays as configured.
    """
    cfg.param_scheduler = []
    cfg.train_cfg = dict(type='IterBasedTrainLoop', max_iters=10 ** 9, val_interval=10 ** 9)
    cfg.custom_hooks = [hook for hook in cfg.get('custom_hooks') or []
                        if hook.get('type') not in ('TimeBudgetHook', 'vitdense.TimeBudgetHook')]
    cfg.custom_hooks.append(dict(type='vitdense.TimeBudgetHook', minutes=minutes, clock=clock))
    cfg.default_hooks.checkpoint = dict(type='vitdense.SafeCheckpointHook', by_epoch=False,
                                        interval=10 ** 9, save_last=True, max_keep_ckpts=1)
    cfg.log_processor = dict(type='vitdense.TimeBudgetLogProcessor', by_epoch=False,
                             custom_cfg=[dict(data_src='budget_used', method_name='mean',
                                             window_size=1)])
