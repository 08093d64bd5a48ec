"""benchmarks/benchmark_attention.py: its switch between the attention paths and its measures."""
import pytest
import torch

from benchmarks import benchmark_attention as tool
from vitdense.models.layers import blockwise_attention


@pytest.mark.parametrize('path, blockwise', [('written-out', False), ('blockwise', True)])
def test_attention_path_switches_and_restores(path, blockwise):
    default = blockwise_attention.MIN_BLOCKWISE_TOKENS
    leaf = torch.zeros(1, requires_grad=True)
    with tool.attention_path(path):
        assert blockwise_attention.use_blockwise(196, leaf) == blockwise
    with tool.attention_path('chosen'):
        assert blockwise_attention.MIN_BLOCKWISE_TOKENS == default
    assert blockwise_attention.MIN_BLOCKWISE_TOKENS == default


def test_operator_shares_name_where_a_step_spends_its_time():
    weight = torch.randn(256, 256, requires_grad=True)
    x = torch.randn(64, 256)

    def step():
        (x @ weight).softmax(-1).sum().backward()
    shares = tool.operator_shares(step)
    assert 0 < sum(shares.values()) <= 1 + 1e-9
    assert any('mm' in name for name in shares)
