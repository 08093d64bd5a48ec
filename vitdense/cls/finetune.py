"""Attention-only fine-tuning ("Three things everyone should know about ViTs", §4).

Fine-tuning only the self-attention weights at a higher resolution matches full fine-tuning
(Table 5) while the parameter-heavy FFNs stay frozen: about a third of the weights train, no
gradients or optimizer moments are kept for the rest, and a model per resolution costs only its
attention weights in storage.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

from torch import nn

#: What trains in attention-only mode, as regular expressions over parameter names: attention
#: (trunk and class-attention blocks, incl. XCA temperatures and GPSA gates), the attention
#: branch's LayerScale, every norm, position embeddings, class token and classifier head, as in
#: the paper. FFNs (``mlp``), their LayerScale (``ls2``), XCiT's LPI and the patch stem freeze.
ATTENTION_ONLY = (r'\.attn\.', r'\.ls1\.', r'(^|\.)norm', r'pos_embed', r'cls_token',
                  r'^head\.')


@dataclass(frozen=True)
class TrainableSummary:
    """Counts of trainable and frozen parameters after selecting what trains."""

    trainable: int
    total: int

    @property
    def frozen(self) -> int:
        return self.total - self.trainable

    def saved_bytes(self, states_per_param: int = 3, bytes_per_value: int = 4) -> int:
        """Memory frozen weights never allocate: a gradient and two AdamW moments in fp32."""
        return self.frozen * states_per_param * bytes_per_value

    def __str__(self) -> str:
        return (f'{self.trainable:,} of {self.total:,} parameters trainable '
                f'({100 * self.trainable / self.total:.1f}%); frozen weights save '
                f'{self.saved_bytes() / 2**20:.1f} MiB of gradients and AdamW moments')


def train_only(model: nn.Module, patterns: Sequence[str]) -> TrainableSummary:
    """Set ``requires_grad`` to whether a parameter's name matches any of ``patterns``."""
    selected = [re.compile(p) for p in patterns]
    trainable = total = 0
    for name, param in model.named_parameters():
        param.requires_grad_(any(p.search(name) for p in selected))
        total += param.numel()
        trainable += param.numel() if param.requires_grad else 0
    if trainable == 0:
        raise ValueError(f'no parameter name matches {list(patterns)}')
    return TrainableSummary(trainable, total)
