"""Blockwise talking heads and GPSA: the same model as the written-out maps, without them."""
import pytest
import torch

from vitdense.models.layers import GatedPositionalSelfAttention, MultiheadSelfAttention
from vitdense.models.layers import blockwise_attention
from vitdense.models.layers.blockwise_attention import use_blockwise

GRIDS = [(3, 4), (5, 5), (7, 3)]  # the last one non-square with more rows than columns


def make_mixer(kind: str) -> torch.nn.Module:
    torch.manual_seed(0)
    if kind == 'talking_heads':
        mixer = MultiheadSelfAttention(32, 4, talking_heads=True)
        # biases of the head mixes are zero-initialised in no model: give them values
        for mix in (mixer.mix_logits, mixer.mix_weights):
            torch.nn.init.normal_(mix.bias)
        return mixer
    mixer = GatedPositionalSelfAttention(32, 4)
    mixer.convolutional_init()
    with torch.no_grad():
        mixer.gating.normal_()
        mixer.pos_proj.bias.normal_()
    return mixer


def outputs_and_grads(mixer, x, hw, blockwise: bool, monkeypatch) -> dict:
    monkeypatch.setattr(blockwise_attention, 'MIN_BLOCKWISE_TOKENS', 0 if blockwise else 10 ** 9)
    # a few rows per block, the last block shorter: every block boundary is exercised
    monkeypatch.setattr(blockwise_attention, 'BLOCK_ELEMENTS', 2 * 4 * hw[0] * hw[1] * 2)
    mixer.zero_grad()
    x = x.clone().requires_grad_()
    out = mixer(x, hw)
    out.backward(torch.randn(out.shape, generator=torch.Generator().manual_seed(1)))
    return dict(out=out.detach(), x=x.grad,
                **{name: p.grad for name, p in mixer.named_parameters()})


@pytest.mark.parametrize('hw', GRIDS)
@pytest.mark.parametrize('kind', ['talking_heads', 'gpsa'])
def test_blockwise_equals_written_out_maps(kind, hw, monkeypatch):
    mixer = make_mixer(kind)
    x = torch.randn(2, hw[0] * hw[1], 32)
    written = outputs_and_grads(mixer, x, hw, False, monkeypatch)
    blockwise = outputs_and_grads(mixer, x, hw, True, monkeypatch)
    assert written.keys() == blockwise.keys()
    for name, expected in written.items():
        # 1e-5 of the tensor's largest entry (absolute below 1: the logit mix's bias has a
        # zero gradient, softmax being shift-invariant, and both paths give rounding noise)
        error = (blockwise[name] - expected).abs().max() / expected.abs().max().clamp_min(1)
        assert error <= 1e-5, f'{kind} {hw}: {name} differs by {error:.2e} of its scale'


def test_talking_heads_with_fewer_queries_than_keys(monkeypatch):
    """A classifier's last block queries with its first tokens only."""
    mixer = make_mixer('talking_heads')
    x = torch.randn(2, 9, 32)
    monkeypatch.setattr(blockwise_attention, 'BLOCK_ELEMENTS', 2 * 4 * 9)
    expected = mixer(x, num_queries=3)
    monkeypatch.setattr(blockwise_attention, 'MIN_BLOCKWISE_TOKENS', 0)
    torch.testing.assert_close(mixer(x.requires_grad_(), num_queries=3), expected)


def largest_saved(mixer, hw) -> int:
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        mixer(torch.randn(2, hw[0] * hw[1], 32, requires_grad=True), hw)
    return max(t.numel() for t in saved)


@pytest.mark.parametrize('kind', ['talking_heads', 'gpsa'])
def test_no_token_by_token_map_is_saved_for_backward(kind, monkeypatch):
    mixer, hw = make_mixer(kind), (6, 7)
    heads_map = 4 * (hw[0] * hw[1]) ** 2  # one (heads, N, N) map, 7,056 elements
    monkeypatch.setattr(blockwise_attention, 'MIN_BLOCKWISE_TOKENS', 10 ** 9)
    assert largest_saved(mixer, hw) >= heads_map
    monkeypatch.setattr(blockwise_attention, 'MIN_BLOCKWISE_TOKENS', 0)
    assert largest_saved(mixer, hw) < heads_map


def test_blockwise_only_while_autograd_records_above_the_threshold():
    big = blockwise_attention.MIN_BLOCKWISE_TOKENS
    leaf = torch.zeros(1, requires_grad=True)
    assert use_blockwise(big, leaf) and not use_blockwise(big - 1, leaf)
    assert not use_blockwise(big, torch.zeros(1))
    with torch.no_grad():
        assert not use_blockwise(big, leaf)


def test_export_never_reads_the_token_count(monkeypatch):
    """Exporting with gradients enabled takes the written-out path without comparing the
    (symbolic) token count: a dynamic H × W gets no guard from it."""
    class Symbolic(int):
        def __ge__(self, other):
            raise AssertionError('the token count was compared')

    monkeypatch.setattr(torch.compiler, 'is_exporting', lambda: True)
    assert not use_blockwise(Symbolic(10 ** 6), torch.zeros(1, requires_grad=True))


def test_gpsa_forward_changes_no_module_state():
    """Offsets come from the grid at each call: nothing is cached (export, dynamic grids)."""
    mixer = make_mixer('gpsa').eval()
    state = dict(vars(mixer))
    buffers = [b.clone() for b in mixer.buffers()]
    for hw in GRIDS:
        mixer(torch.randn(1, hw[0] * hw[1], 32), hw)
    assert vars(mixer).keys() == state.keys()
    assert all(vars(mixer)[k] is v for k, v in state.items() if k != '_modules')
    assert all(torch.equal(a, b) for a, b in zip(buffers, mixer.buffers()))
