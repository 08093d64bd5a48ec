"""Parallel branches computed in one batched op ("Three things everyone should know about
ViTs", §3): a block with ``num_branches`` attention (or FFN) branches keeps the branch
parameters stacked and runs all branches with one ``baddbmm`` instead of a Python loop.

Tensors inside a branched sub-layer carry a leading branch dimension: (branches, B, N, C).
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class BranchedLinear(nn.Module):
    """``num_branches`` independent linear maps applied to a (branches, ..., in) tensor."""

    def __init__(self, num_branches: int, in_features: int, out_features: int,
                 bias: bool = True) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(torch.empty(num_branches, out_features, in_features))
        self.bias = nn.Parameter(torch.zeros(num_branches, out_features)) if bias else None
        bound = 1 / math.sqrt(in_features)
        nn.init.uniform_(self.weight, -bound, bound)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        branches, *lead, _ = x.shape
        flat = x.reshape(branches, -1, self.in_features)
        if self.bias is None:
            out = torch.bmm(flat, self.weight.transpose(1, 2))
        else:
            out = torch.baddbmm(self.bias.unsqueeze(1), flat, self.weight.transpose(1, 2))
        return out.reshape(branches, *lead, self.out_features)


class BranchedLayerNorm(nn.Module):
    """One LayerNorm per branch applied to the same input: (B, N, C) -> (branches, B, N, C).

    The normalisation is shared; only the affine parameters differ per branch.
    """

    def __init__(self, num_branches: int, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(num_branches, dim))
        self.bias = nn.Parameter(torch.zeros(num_branches, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        normed = F.layer_norm(x, x.shape[-1:], eps=self.eps)
        shape = (self.weight.shape[0],) + (1,) * (x.dim() - 1) + (x.shape[-1],)
        return torch.addcmul(self.bias.view(shape), normed.unsqueeze(0), self.weight.view(shape))


def make_linear(in_features: int, out_features: int, bias: bool = True,
                num_branches: int = 1) -> nn.Module:
    """A plain ``nn.Linear`` for one branch, a :class:`BranchedLinear` for several."""
    if num_branches == 1:
        return nn.Linear(in_features, out_features, bias=bias)
    return BranchedLinear(num_branches, in_features, out_features, bias=bias)


def make_layer_norm(dim: int, eps: float = 1e-6, num_branches: int = 1) -> nn.Module:
    """A plain ``nn.LayerNorm`` for one branch, a :class:`BranchedLayerNorm` for several."""
    if num_branches == 1:
        return nn.LayerNorm(dim, eps=eps)
    return BranchedLayerNorm(num_branches, dim, eps=eps)
