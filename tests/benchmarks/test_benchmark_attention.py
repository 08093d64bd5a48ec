"""benchmarks/benchmark_attention.py: its switch between the attention paths and its measures."""
import pytest
import torch

from benchmarks import benchmark_attention as tool
from vitdense.models.layers import talking_heads


@pytest.mark.parametrize('path', talking_heads.PATHS)
def test_attention_path_switches_and_restores(path):
    layer = tool.MultiheadSelfAttention(16, 2, talking_heads=True)
    with tool.attention_path(layer, path):
        assert layer.talking_heads_path == path
    with tool.attention_path(layer, 'chosen'):
        assert layer.talking_heads_path is None
    assert layer.talking_heads_path is None


def test_written_out_gpsa_is_the_layer_it_is_compared_with():
    steps = tool.layer_steps(2, (3, 4))
    assert set(steps) == {'plain', 'talking heads', 'talking heads fold',
                          'talking heads written out', 'gpsa', 'gpsa written out'}
    torch.manual_seed(0)
    gpsa = tool.GatedPositionalSelfAttention(16, 4)
    gpsa.convolutional_init()
    x = torch.randn(2, 12, 16)
    torch.testing.assert_close(tool.written_out_gpsa(gpsa, x, (3, 4)), gpsa(x, (3, 4)))


def test_operator_shares_name_where_a_step_spends_its_time():
    weight = torch.randn(256, 256, requires_grad=True)
    x = torch.randn(64, 256)

    def step():
        (x @ weight).softmax(-1).sum().backward()
    shares = tool.operator_shares(step)
    assert 0 < sum(shares.values()) <= 1 + 1e-9
    assert any('mm' in name for name in shares)


def test_crossover_times_every_path_against_the_maps():
    (row,) = tool.crossover(repeats=1, sides=(3,))
    assert row['batch'] == 177 and row['grid'] == [3, 3]
    assert {'blocks s', 'fold s', 'maps s'} <= row.keys()
    assert all(row[f'{path} / maps'] > 0 for path in ('blocks', 'fold'))


def test_block_rows_times_the_operator_per_block_height_and_restores_it():
    default = tool.talking_heads_cpu.BLOCK_ROWS
    rows = tool.block_rows(repeats=1, counts=(16, 32), hw=(3, 30), batch=1)
    assert [(row['heads'], row['width']) for row in rows] == [(4, 192), (8, 384)]
    assert all(row['16 rows / plain'] > 0 and row['32 rows s'] > 0 for row in rows)
    assert tool.talking_heads_cpu.BLOCK_ROWS == default
