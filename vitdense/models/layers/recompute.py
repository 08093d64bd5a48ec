"""Recomputing a cheap, memory-hungry step in backward instead of keeping its tensors."""
from typing import Any, Callable

import torch
from torch.utils.checkpoint import checkpoint


def recomputed_in_backward(function: Callable[..., torch.Tensor], *args: Any) -> torch.Tensor:
    """``function(*args)``; while autograd records, only its inputs are kept for backward,
    which runs it again (non-reentrant activation checkpointing)."""
    if torch.is_grad_enabled():
        return checkpoint(function, *args, use_reentrant=False)
    return function(*args)
