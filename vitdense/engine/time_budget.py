"""Training for a time budget instead of an iteration count.

Comparing backbones "within N minutes" needs every run to use the whole budget whatever its
speed, with a learning rate that still anneals to zero at the end. Following "Budgeted
Training" (Li et al., ICLR 2020), the learning rate decays linearly in the fraction of the
budget spent, after a short warmup in iterations. On a machine shared with other jobs the
budget can be counted in this process's CPU time instead of wall-clock time, so that the
work done in the budget does not depend on the neighbours.
"""
from __future__ import annotations

import time
from pathlib import Path

from mmengine.config import Config
from mmengine.hooks import Hook
from mmengine.logging import print_log

from vitdense.registry import HOOKS


@HOOKS.register_module()
class TimeBudgetHook(Hook):
    """Stop training after ``minutes``; lr = base lr · warmup(iter) · (1 - spent fraction).

    ``clock`` is 'wall' (elapsed time) or 'process' (CPU time of this process, all threads).
    Replaces the param schedulers (configure none): every optimizer group keeps its own base
    lr (``initial_lr``, e.g. after layer-wise decay) and is scaled by the same factor.
    The model it stops on is saved as ``iter_<n>.pth`` (and named in ``last_checkpoint``):
    mmengine's ``save_last`` only fires at ``max_iters``, which a budgeted run never reaches.
    """

    priority = 'VERY_HIGH'
    CLOCKS = {'wall': time.monotonic, 'process': time.process_time}

    def __init__(self, minutes: float, warmup_iters: int = 50, warmup_ratio: float = 1e-3,
                 clock: str = 'wall') -> None:
        if minutes <= 0:
            raise ValueError(f'minutes must be positive, got {minutes}')
        if clock not in self.CLOCKS:
            raise ValueError(f'clock must be one of {sorted(self.CLOCKS)}, got {clock!r}')
        self.budget = minutes * 60.0
        self.warmup_iters = warmup_iters
        self.warmup_ratio = warmup_ratio
        self.clock = self.CLOCKS[clock]
        self.start = 0.0

    def before_train(self, runner) -> None:
        if runner.param_schedulers:
            raise ValueError('TimeBudgetHook sets the learning rate itself; '
                             'configure param_scheduler = []')
        for group in runner.optim_wrapper.param_groups:
            group.setdefault('initial_lr', group['lr'])
        self.start = self.clock()

    def spent(self) -> float:
        """Fraction of the budget used so far."""
        return (self.clock() - self.start) / self.budget

    def before_train_iter(self, runner, batch_idx: int, data_batch=None) -> None:
        warmup = min(1.0, self.warmup_ratio + (1 - self.warmup_ratio) *
                     runner.iter / max(self.warmup_iters, 1))
        decay = max(0.0, 1.0 - self.spent())
        for group in runner.optim_wrapper.param_groups:
            group['lr'] = group['initial_lr'] * warmup * decay

    def after_train_iter(self, runner, batch_idx: int, data_batch=None,
                         outputs=None) -> None:
        if self.spent() >= 1.0:
            runner.train_loop.stop_training = True
            print_log(f'time budget of {self.budget / 60:.1f} min used after '
                      f'{runner.iter + 1} iterations', logger='current')

    def after_train(self, runner) -> None:
        filename = f'iter_{runner.iter}.pth'
        runner.save_checkpoint(runner.work_dir, filename)
        Path(runner.work_dir, 'last_checkpoint').write_text(
            str(Path(runner.work_dir, filename)))


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
    cfg.default_hooks.checkpoint = dict(type='CheckpointHook', by_epoch=False,
                                        interval=10 ** 9, save_last=True, max_keep_ckpts=1)
    cfg.log_processor = dict(by_epoch=False)
