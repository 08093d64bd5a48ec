"""EoMT's mask annealing (Kerssies et al. 2025, §3.4) driven by the runner's iteration, or by
the fraction of a time budget spent (:class:`~vitdense.engine.hooks.time_budget.TimeBudgetHook`)."""
from __future__ import annotations

from typing import Optional, Sequence

from mmengine.hooks import Hook
from mmengine.model import is_model_wrapper

from vitdense.engine.hooks.time_budget import TimeBudgetHook
from vitdense.models.eomt import EoMT, annealed_mask_probability
from vitdense.registry import HOOKS


@HOOKS.register_module()
class EoMTMaskAnnealingHook(Hook):
    """Before each training iteration, set the probability that each of an EoMT model's
    masked blocks keeps its attention mask: one until ``start_iters[i]``, decaying as
    ``(1 - progress) ** power`` to zero at ``end_iters[i]`` (block i of the last
    ``num_blocks``), as the official code does after each step. Set from the iteration alone,
    so a resumed run continues the schedule.

    A run on a time budget has no iteration count to schedule by: give ``start_fractions``
    and ``end_fractions`` of the budget instead (read from the runner's ``TimeBudgetHook``).
    """

    priority = 'NORMAL'

    def __init__(self, start_iters: Optional[Sequence[int]] = None,
                 end_iters: Optional[Sequence[int]] = None, power: float = 0.9, *,
                 start_fractions: Optional[Sequence[float]] = None,
                 end_fractions: Optional[Sequence[float]] = None) -> None:
        by_budget = start_fractions is not None or end_fractions is not None
        if by_budget == (start_iters is not None or end_iters is not None):
            raise ValueError('give the schedule either in iterations (start_iters, end_iters) '
                             'or in fractions of a time budget (start_fractions, '
                             'end_fractions)')
        starts, ends = (start_fractions, end_fractions) if by_budget else (start_iters,
                                                                           end_iters)
        if starts is None or ends is None or len(starts) != len(ends):
            raise ValueError(f'the starts and ends need one entry per masked block; got '
                             f'{starts} and {ends}')
        bad = [(s, e) for s, e in zip(starts, ends) if e < s]
        if bad:
            raise ValueError(f'every end must be >= its start; got {bad}')
        self.starts, self.ends, self.power = list(starts), list(ends), power
        self.by_budget = by_budget

    def _models(self, runner) -> list[EoMT]:
        model = runner.model.module if is_model_wrapper(runner.model) else runner.model
        models = [module for module in model.modules() if isinstance(module, EoMT)]
        if not models:
            raise TypeError(f'EoMTMaskAnnealingHook anneals the masks of an EoMT model; '
                            f'{type(model).__name__} holds none: remove the hook')
        for eomt in models:
            if eomt.num_blocks != len(self.starts):
                raise ValueError(f'EoMTMaskAnnealingHook has a schedule for '
                                 f'{len(self.starts)} blocks, the model masks '
                                 f'{eomt.num_blocks}: give one start and end per block')
        return models

    def _progress(self, runner) -> float:
        """The runner's iteration, or the fraction of its time budget spent."""
        if not self.by_budget:
            return runner.iter
        budgets = [hook for hook in runner.hooks if isinstance(hook, TimeBudgetHook)]
        if not budgets:
            raise ValueError('start_fractions / end_fractions schedule the masks over a time '
                             'budget: add a vitdense.TimeBudgetHook or give start_iters / '
                             'end_iters')
        return budgets[0].spent()

    def before_train_iter(self, runner, batch_idx: int, data_batch=None) -> None:
        progress = self._progress(runner)
        probabilities = [annealed_mask_probability(progress, start, end, self.power).item()
                         for start, end in zip(self.starts, self.ends)]
        for eomt in self._models(runner):
            eomt.set_mask_probabilities(probabilities)
