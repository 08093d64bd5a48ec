"""ConViT's gates and nonlocality: σ(λ) is read from the parameters, and a purely positional
layer with a sharp convolutional init looks exactly one kernel offset away."""
import math

import pytest
import torch

from vitdense.analysis import gating_strengths, mean_attention_distance, record_attention
from vitdense.models import ConViT, ViT

from common import TINY_ARCH

ARCH = dict(embed_dims=36, num_layers=3, num_heads=9, num_local_layers=2)


def test_gates_are_the_sigmoid_of_the_parameters():
    model = ConViT(ARCH, out_indices=[0, 1, 2], pyramid=False)
    values = torch.linspace(-3, 3, 18).view(2, 9)
    with torch.no_grad():
        for index in range(2):
            model.blocks[index].attn.gating.copy_(values[index])
    gates = gating_strengths(model)
    assert list(gates) == [0, 1]
    for index in range(2):
        torch.testing.assert_close(gates[index], torch.sigmoid(values[index]))


def test_gates_need_gpsa_blocks():
    with pytest.raises(TypeError, match='no gated positional self-attention'):
        gating_strengths(ViT(TINY_ARCH))


def test_positional_heads_look_one_kernel_offset_away():
    # locality strength 20: each head attends to its offset (dx, dy) in {-1, 0, 1}^2, or,
    # at the border where that patch is missing, to the best one left (hand-counted below)
    model = ConViT(dict(ARCH, locality_strength=20.), out_indices=[0, 1, 2], pyramid=False)
    with torch.no_grad():
        model.blocks[0].attn.gating.fill_(30.)  # σ = 1: position only
    record = record_attention(model, torch.randn(1, 3, 128, 128))  # an 8x8 grid
    distance = mean_attention_distance(record.trunk[0], record.grid)
    weight = model.blocks[0].attn.pos_proj.weight / 20.
    for head in range(9):
        dx, dy = (weight[head, :2] / 2).round().int().tolist()
        if dx == dy == 0:
            expected = 0.
        elif dx == 0 or dy == 0:
            expected = 56 / 64  # the 8 queries on the far edge attend to themselves
        else:  # 49 inner queries at sqrt(2), 14 on an edge at 1, the corner at 0
            expected = (49 * math.sqrt(2) + 14) / 64
        assert distance[head].item() == pytest.approx(expected, abs=1e-4), (head, dx, dy)
