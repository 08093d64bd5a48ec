"""SwiGLU feed-forward (Shazeer 2020, "GLU variants"), as EVA-02 uses it (Fang et al. 2023,
§2): ``fc2(norm(silu(x W_g) * (x W_x)))``.

The gate and value maps are one packed linear map ``fc1`` (gate rows first: one matrix
product), which is timm's packed layout (``GluMlp``); timm's unpacked layout (``fc1_g``,
``fc1_x``) is the same map split in two and is merged on load
(:func:`merge_swiglu_tensors`). ``norm``: the LayerNorm of the hidden width that EVA-02 B/L
place before ``fc2`` (timm's ``scale_mlp``).
"""
import re

import torch
import torch.nn as nn
import torch.nn.functional as F

UNPACKED_GATE = re.compile(r'^(.*\.mlp)\.fc1_g\.(weight|bias)$')


class SwiGLU(nn.Module):
    """SwiGLU FFN of ``hidden_dim`` hidden units (``fc1``: 2·hidden_dim outputs, gate first)."""

    def __init__(self, dim: int, hidden_dim: int, drop: float = 0., norm: bool = False,
                 norm_eps: float = 1e-6) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, 2 * hidden_dim)
        self.drop = nn.Dropout(drop)
        self.norm = nn.LayerNorm(hidden_dim, eps=norm_eps) if norm else nn.Identity()
        self.fc2 = nn.Linear(hidden_dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, value = self.fc1(x).chunk(2, dim=-1)
        return self.drop(self.fc2(self.norm(self.drop(F.silu(gate) * value))))


def merge_swiglu_tensors(state_dict: dict) -> dict:
    """timm's unpacked SwiGLU tensors (``mlp.fc1_g``, ``mlp.fc1_x``) as our packed ``mlp.fc1``
    (gate rows first), in place; the packed layout passes unchanged."""
    for key in [k for k in state_dict if UNPACKED_GATE.match(k)]:
        module, param = UNPACKED_GATE.match(key).groups()
        value = state_dict.pop(f'{module}.fc1_x.{param}')
        state_dict[f'{module}.fc1.{param}'] = torch.cat([state_dict.pop(key), value])
    return state_dict
