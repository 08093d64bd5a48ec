"""What the served ops share: running as a compiled kernel runs, the kernels' float limits
and their atomic adds under deterministic mode."""
from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable, Iterator, TypeVar

import torch
from torch import Tensor

__all__ = ['FLT_MAX', 'FLT_MIN', 'atomic_adds_allowed', 'kernel']

# the CUDA kernels' float limits, in every dtype: log's argument is clamped at FLT_MIN and an
# empty max-pooling bin holds -FLT_MAX
FLT_MIN = torch.finfo(torch.float32).tiny
FLT_MAX = torch.finfo(torch.float32).max

_Op = TypeVar('_Op', bound=Callable[..., Any])


def kernel(op: _Op) -> _Op:
    """Run ``op`` as a compiled kernel runs: in the dtypes of its tensors (autocast off) and
    outside autograd (what it needs of autograd it enables itself)."""
    @functools.wraps(op)
    def run(*args: Any, **kwargs: Any) -> Any:
        device = next(a for a in (*args, *kwargs.values()) if isinstance(a, Tensor)).device
        with torch.no_grad(), torch.autocast(device.type, enabled=False):
            return op(*args, **kwargs)
    return run  # type: ignore[return-value]


@contextlib.contextmanager
def atomic_adds_allowed(device: torch.device) -> Iterator[None]:
    """Under ``torch.use_deterministic_algorithms(True)``, warn instead of failing on CUDA.

    The backward kernels of RoIAlign and deformable convolution scatter with atomic adds on
    CUDA, mmcv's as well as torch's and torchvision's; mmcv's run regardless, torch's and
    torchvision's raise in deterministic mode.  Here they run like mmcv's, and torch warns
    that the result is not deterministic.  (Deformable attention needs none of it: its
    ``embedding_bag`` sums by sorted index, deterministically.)
    """
    relax = (device.type == 'cuda' and torch.are_deterministic_algorithms_enabled()
             and not torch.is_deterministic_algorithms_warn_only_enabled())
    if relax:
        torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        yield
    finally:
        if relax:
            torch.use_deterministic_algorithms(True)
