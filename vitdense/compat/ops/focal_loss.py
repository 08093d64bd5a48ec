"""The sigmoid and softmax focal losses (Lin et al., 2017) and their derivatives."""
from __future__ import annotations

import torch
from torch import Tensor

from vitdense.compat.ops.kernel import FLT_MIN, kernel

__all__ = ['sigmoid_focal_loss_backward', 'sigmoid_focal_loss_forward',
           'softmax_focal_loss_backward', 'softmax_focal_loss_forward']


def _class_weights(weight: Tensor, target: Tensor, num_classes: int, op: str) -> Tensor | None:
    """``weight[target]`` (the kernels' per-row class weight), None for no weight; a target
    past the weight's entries (which the CUDA kernels read out of bounds) raises."""
    if weight.numel() == 0:
        return None
    if bool((target >= num_classes).any()):
        raise ValueError(
            f'{op}: a target is {int(target.max())} but the class weight has {num_classes} '
            'entries (the compiled kernel would read past them); pass weight=None and weigh '
            'the loss afterwards, as mmdet\'s FocalLoss does')
    return weight[target.clamp(min=0)]


def _sigmoid_focal(input: Tensor, target: Tensor, weight: Tensor, gamma: float, alpha: float,
                   derivative: bool) -> Tensor:
    """mmcv's sigmoid focal loss per element, or its derivative by the logit; ``target`` is a
    class index per row, ``num_classes`` meaning background."""
    p = input.sigmoid()
    log_p, log_q = p.clamp(min=FLT_MIN).log(), (1 - p).clamp(min=FLT_MIN).log()
    if derivative:
        positive = (1 - p).pow(gamma) * (1 - p - gamma * p * log_p)
        negative = p.pow(gamma) * (gamma * (1 - p) * log_q - p)
    else:
        positive, negative = (1 - p).pow(gamma) * log_p, p.pow(gamma) * log_q
    is_target = target[:, None] == torch.arange(input.shape[1], device=input.device)
    loss = torch.where(is_target, -alpha * positive, -(1 - alpha) * negative)
    class_weight = _class_weights(weight, target, input.shape[1], 'sigmoid_focal_loss')
    return loss if class_weight is None else loss * class_weight[:, None]


@kernel
def sigmoid_focal_loss_forward(input: Tensor, target: Tensor, weight: Tensor, output: Tensor,
                               gamma: float, alpha: float) -> None:
    """The sigmoid focal loss of each logit of ``input`` (N, C) into ``output``."""
    output.copy_(_sigmoid_focal(input, target, weight, gamma, alpha, derivative=False))


@kernel
def sigmoid_focal_loss_backward(input: Tensor, target: Tensor, weight: Tensor,
                                grad_input: Tensor, gamma: float, alpha: float) -> None:
    """The derivative of each element's sigmoid focal loss by its logit into ``grad_input``."""
    grad_input.copy_(_sigmoid_focal(input, target, weight, gamma, alpha, derivative=True))


def _target_probability(softmax: Tensor, target: Tensor) -> tuple[Tensor, Tensor]:
    """Each row's probability of its target class and whether the row has one (target >= 0);
    a target past the classes raises."""
    if bool((target >= softmax.shape[1]).any()):
        raise ValueError(f'softmax_focal_loss: a target is {int(target.max())} but there are '
                         f'{softmax.shape[1]} classes (targets are 0..C-1, or negative to '
                         'ignore the row)')
    return softmax.gather(1, target.clamp(min=0)[:, None])[:, 0], target >= 0


def _softmax_focal_weighted(per_row: Tensor, target: Tensor, weight: Tensor,
                            labelled: Tensor) -> Tensor:
    """``per_row`` with rows without a target zeroed and the class weight applied."""
    class_weight = _class_weights(weight, target, len(weight), 'softmax_focal_loss')
    per_row = per_row if class_weight is None else per_row * class_weight
    return torch.where(labelled, per_row, torch.zeros_like(per_row))


@kernel
def softmax_focal_loss_forward(softmax: Tensor, target: Tensor, weight: Tensor, output: Tensor,
                               gamma: float, alpha: float) -> None:
    """Each row's softmax focal loss, ``-alpha (1 - p)^gamma log p`` of its target's
    probability ``p``, into ``output`` (N,)."""
    p, labelled = _target_probability(softmax, target)
    loss = -alpha * (1 - p).pow(gamma) * p.clamp(min=FLT_MIN).log()
    output.copy_(_softmax_focal_weighted(loss, target, weight, labelled))


@kernel
def softmax_focal_loss_backward(softmax: Tensor, target: Tensor, weight: Tensor, buff: Tensor,
                                grad_input: Tensor, gamma: float, alpha: float) -> None:
    """The derivative by the logits into ``grad_input`` (N, C), through ``buff`` (N,), the
    derivative by the target's log-probability, as mmcv's two kernels pass it."""
    p, labelled = _target_probability(softmax, target)
    by_log_p = alpha * (-(1 - p).pow(gamma)
                        + gamma * (1 - p).pow(gamma - 1) * p * p.clamp(min=FLT_MIN).log())
    buff.copy_(_softmax_focal_weighted(by_log_p, target, weight, labelled))
    is_target = target[:, None] == torch.arange(softmax.shape[1], device=softmax.device)
    grad = buff[:, None] * (is_target.to(softmax.dtype) - softmax)
    grad_input.copy_(torch.where(labelled[:, None], grad, torch.zeros_like(grad)))
