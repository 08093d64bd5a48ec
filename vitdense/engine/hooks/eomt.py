"""EoMT's mask annealing (Kerssies et al. 2025, §3.4) driven by the runner's iteration."""
from __future__ import annotations

from typing import Sequence

from mmengine.hooks import Hook
from mmengine.model import is_model_wrapper

from vitdense.models.eomt import EoMT, annealed_mask_probability
from vitdense.registry import HOOKS


@HOOKS.register_module()
class EoMTMaskAnnealingHook(Hook):
    """Before each training iteration, set the probability that each of an EoMT model's
    masked blocks keeps its attention mask: one until ``start_iters[i]``, decaying as
    ``(1 - progress) ** power`` to zero at ``end_iters[i]`` (block i of the last
    ``num_blocks``), as the official code does after each step. Set from the iteration alone,
    so a resumed run continues the schedule.
    """

    priority = 'NORMAL'

    def __init__(self, start_iters: Sequence[int], end_iters: Sequence[int],
                 power: float = 0.9) -> None:
        if len(start_iters) != len(end_iters):
            raise ValueError(f'start_iters and end_iters need one entry per masked block; got '
                             f'{len(start_iters)} and {len(end_iters)}')
        bad = [(s, e) for s, e in zip(start_iters, end_iters) if e < s]
        if bad:
            raise ValueError(f'every end iteration must be >= its start iteration; got {bad}')
        self.start_iters, self.end_iters, self.power = list(start_iters), list(end_iters), power

    def _models(self, runner) -> list[EoMT]:
        model = runner.model.module if is_model_wrapper(runner.model) else runner.model
        models = [module for module in model.modules() if isinstance(module, EoMT)]
        if not models:
            raise TypeError(f'EoMTMaskAnnealingHook anneals the masks of an EoMT model; '
                            f'{type(model).__name__} holds none: remove the hook')
        for eomt in models:
            if eomt.num_blocks != len(self.start_iters):
                raise ValueError(f'EoMTMaskAnnealingHook has a schedule for '
                                 f'{len(self.start_iters)} blocks, the model masks '
                                 f'{eomt.num_blocks}: give one start and end per block')
        return models

    def before_train_iter(self, runner, batch_idx: int, data_batch=None) -> None:
        probabilities = [annealed_mask_probability(runner.iter, start, end, self.power).item()
                         for start, end in zip(self.start_iters, self.end_iters)]
        for eomt in self._models(runner):
            eomt.set_mask_probabilities(probabilities)
