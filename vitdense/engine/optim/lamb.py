"""LAMB (You et al. 2020, Algorithm 2), the optimizer of the "ResNet strikes back" A2 recipes
that the ViT A2 configs use, with every norm taken over the full tensor when the parameters
are sharded.

mmpretrain's ``Lamb`` (timm's) accumulates its global gradient norm in a plain tensor, which
a sharded parameter's gradient (a ``DTensor`` under :class:`~vitdense.engine.wrappers.fsdp.
FullyShardedModel`) cannot be added to. This class makes the same update (same defaults,
same global clip at ``max_grad_norm``, same trust ratio ``||w|| / ||update||``, skipped on
parameters without weight decay unless ``always_adapt``) with the norms reduced to plain
numbers first (``DTensor.full_tensor``: a sum over the ranks' shards), so a sharded run
steps as a DDP run with mmpretrain's ``Lamb`` does. On plain tensors it is that ``Lamb``.
"""
from __future__ import annotations

import math
from typing import Callable, Iterable, Optional

import torch
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.experimental import implicit_replication

from vitdense.registry import OPTIMIZERS


def full_value(tensor: torch.Tensor) -> torch.Tensor:
    """A reduction's value over the whole tensor: a DTensor's summed across its shards."""
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


@OPTIMIZERS.register_module()
class ShardedLamb(torch.optim.Optimizer):
    """LAMB whose norms are those of the full tensors, sharded or not (module doc)."""

    def __init__(self, params: Iterable, lr: float = 1e-3, bias_correction: bool = True,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-6,
                 weight_decay: float = 0.01, grad_averaging: bool = True,
                 max_grad_norm: float = 1.0, trust_clip: bool = False,
                 always_adapt: bool = False) -> None:
        super().__init__(params, dict(
            lr=lr, bias_correction=bias_correction, betas=betas, eps=eps,
            weight_decay=weight_decay, grad_averaging=grad_averaging,
            max_grad_norm=max_grad_norm, trust_clip=trust_clip, always_adapt=always_adapt))

    def _clip_divisor(self) -> torch.Tensor:
        """``||g|| / max_grad_norm`` over every gradient when above 1, else 1."""
        squares = [full_value(p.grad.pow(2).sum()) for group in self.param_groups
                   for p in group['params'] if p.grad is not None]
        if not squares:
            return torch.ones(())
        norm = torch.stack(squares).sum().sqrt()
        return torch.clamp(norm / self.defaults['max_grad_norm'], min=1.0)

    def _update(self, p: torch.Tensor, group: dict, divisor: torch.Tensor) -> torch.Tensor:
        """Adam's bias-corrected step of one parameter, decay added, trust ratio applied."""
        beta1, beta2 = group['betas']
        grad = p.grad.div_(divisor)
        state = self.state[p]
        if not state:
            state['exp_avg'], state['exp_avg_sq'] = torch.zeros_like(p), torch.zeros_like(p)
        exp_avg, exp_avg_sq = state['exp_avg'], state['exp_avg_sq']
        exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1 if group['grad_averaging'] else 1.0)
        exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        correction1, correction2 = ((1 - beta1 ** group['step'], 1 - beta2 ** group['step'])
                                    if group['bias_correction'] else (1.0, 1.0))
        denom = (exp_avg_sq.sqrt() / math.sqrt(correction2)).add_(group['eps'])
        update = (exp_avg / correction1).div_(denom)
        if group['weight_decay'] != 0:
            update.add_(p, alpha=group['weight_decay'])
        if group['weight_decay'] != 0 or group['always_adapt']:
            w_norm, u_norm = full_value(p.norm(2.0)), full_value(update.norm(2.0))
            ratio = torch.where((w_norm > 0) & (u_norm > 0), w_norm / u_norm,
                                torch.ones_like(w_norm))
            update.mul_(ratio.clamp(max=1.0) if group['trust_clip'] else ratio)
        return update

    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], float]] = None) -> Optional[float]:
        """One LAMB step of every parameter with a gradient."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        with implicit_replication():  # the plain scalars above meet sharded tensors
            divisor = self._clip_divisor()
            for group in self.param_groups:
                group['step'] = group.get('step', 0) + 1
                for p in group['params']:
                    if p.grad is not None:
                        p.add_(self._update(p, group, divisor), alpha=-group['lr'])
        return loss
