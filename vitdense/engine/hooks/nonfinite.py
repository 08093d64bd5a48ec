"""Steps with a non-finite loss or gradient are skipped before they touch the model.

In train mode one NaN pixel is enough: BatchNorm mixes it into every image's output and into
its running statistics, the gradients turn NaN and the optimizer writes NaN into every
weight, after which training goes on producing nothing. :class:`NonFiniteGuardHook` checks
the loss and the gradients before the optimizer steps, and on a bad step keeps the weights,
the optimizer state and the normalisation statistics as they were before the iteration.
"""
from __future__ import annotations

import logging
from typing import Any

import torch
import torch.distributed as dist
from mmengine.hooks import Hook
from mmengine.logging import print_log
from mmengine.optim import AmpOptimWrapper
from torch import nn
from torch.nn.modules.batchnorm import _NormBase

from vitdense.registry import HOOKS


class NonFiniteLossError(RuntimeError):
    """Too many iterations in a row had a non-finite loss or gradient."""


@HOOKS.register_module()
class NonFiniteGuardHook(Hook):
    """Skip an optimizer step whose loss or gradients are not finite; stop after
    ``max_consecutive`` such iterations in a row.

    The normalisation layers' running statistics are copied before each iteration and put
    back when the step is skipped, so the forward pass of a bad batch leaves no trace. Under
    mixed precision gradients overflow as part of loss scaling (the scaler skips those steps
    itself), so only the loss is checked there. In a multi-process run the decision is
    shared, so every process skips the same steps.
    """

    priority = 'ABOVE_NORMAL'

    def __init__(self, max_consecutive: int = 5) -> None:
        if max_consecutive < 1:
            raise ValueError(f'max_consecutive must be at least 1, got {max_consecutive}')
        self.max_consecutive = max_consecutive
        self.bad_iterations: list[int] = []
        self.skipped_total = 0
        self._loss_finite = True
        self._skipped = False
        self._norm_state: list[tuple[torch.Tensor, torch.Tensor]] = []

    def before_train(self, runner) -> None:
        wrapper = runner.optim_wrapper
        update_params, step = wrapper.update_params, wrapper.step
        check_grads = not isinstance(wrapper, AmpOptimWrapper)

        def guarded_update_params(loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
            self._loss_finite = bool(torch.isfinite(loss.detach()).all())
            update_params(loss, *args, **kwargs)

        def guarded_step(*args: Any, **kwargs: Any) -> None:
            finite = self._loss_finite and (not check_grads or _grads_finite(wrapper))
            if not _all_agree(finite):
                self._skipped = True
                return
            step(*args, **kwargs)

        wrapper.update_params = guarded_update_params
        wrapper.step = guarded_step

    def before_train_iter(self, runner, batch_idx: int, data_batch=None) -> None:
        self._skipped = False
        self._loss_finite = True
        self._norm_state = [(buffer, buffer.detach().clone())
                            for module in _unwrap(runner.model).modules()
                            if isinstance(module, _NormBase)
                            for buffer in module.buffers(recurse=False)]

    def after_train_iter(self, runner, batch_idx: int, data_batch=None,
                         outputs: dict | None = None) -> None:
        if not self._skipped:
            self.bad_iterations = []
            return
        with torch.no_grad():
            for buffer, saved in self._norm_state:
                buffer.copy_(saved)
        self.skipped_total += 1
        self.bad_iterations.append(runner.iter + 1)
        terms = ', '.join(f'{name}={float(value):.4g}' for name, value in (outputs or {}).items()
                          if not torch.isfinite(torch.as_tensor(value)).all())
        print_log(f'iteration {runner.iter + 1}: non-finite '
                  f'{"loss (" + terms + ")" if terms else "gradient"}; the step was skipped, '
                  'weights, optimizer state and norm statistics are unchanged '
                  f'({len(self.bad_iterations)} in a row, {self.skipped_total} in all)',
                  logger='current', level=logging.WARNING)
        if len(self.bad_iterations) >= self.max_consecutive:
            last = runner.message_hub.get_info('last_ckpt')
            raise NonFiniteLossError(
                f'iterations {self.bad_iterations[0]}-{self.bad_iterations[-1]}: '
                f'{len(self.bad_iterations)} in a row had a non-finite loss or gradient '
                f'(max_consecutive={self.max_consecutive}); training stopped. No skipped '
                'step changed the model; the last checkpoint '
                f'({last or "none written yet"}) is intact. Check the data of these '
                'iterations and the learning rate.')


def _unwrap(model: nn.Module) -> nn.Module:
    return getattr(model, 'module', model)


def _grads_finite(wrapper) -> bool:
    grads = [p.grad for group in wrapper.param_groups for p in group['params']
             if p.grad is not None]
    if not grads:
        return True
    return bool(torch.isfinite(torch.stack(torch._foreach_norm(grads))).all())


def _all_agree(finite: bool) -> bool:
    """True only when every process found its step finite."""
    if not (dist.is_available() and dist.is_initialized()):
        return finite
    flag = torch.tensor([0.0 if finite else 1.0])
    if dist.get_backend() == 'nccl':
        flag = flag.cuda()
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return flag.item() == 0.0
