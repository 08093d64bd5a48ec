"""Window attention, decomposed relative positions and the simple feature pyramid (ViTDet)."""
import pytest
import torch
import torch.nn.functional as F

from common import TINY_ARCH, TINY_CONVIT_ARCH, reference_bias
from vitdense.models import (CaiT, ConViT, SimpleFeaturePyramid, ViT, XCiT,
                             adapt_checkpoint)
from vitdense.models.backbones.checkpoint_vit import convert_detectron2_vitdet
from vitdense.models.layers import talking_heads
from vitdense.models.layers.attention import GatedPositionalSelfAttention, MultiheadSelfAttention
from vitdense.models.layers.talking_heads import with_logit_terms
from vitdense.models.layers.window_attention import (DecomposedRelativePosition,
                                                     relative_table_lookup, window_partition,
                                                     window_unpartition)

FAMILIES = {'vit': (ViT, TINY_ARCH), 'cait': (CaiT, TINY_ARCH),
            'convit': (ConViT, TINY_CONVIT_ARCH)}


def _dense(family: str, **options) -> torch.nn.Module:
    cls, arch = FAMILIES[family]
    return cls(arch, img_size=64, pyramid=False, out_indices=(0, 1, 2, 3),
               dense_class_token=False, **options).eval()


@pytest.mark.parametrize('family', FAMILIES)
def test_one_window_over_the_grid_equals_global_attention(family):
    torch.manual_seed(0)
    reference = _dense(family)
    windowed = _dense(family, window_size=5)
    windowed.load_state_dict(reference.state_dict())
    image = torch.randn(2, 3, 80, 80)  # a 5x5 grid: one window, no padding
    with torch.no_grad():
        for ours, theirs in zip(windowed(image), reference(image)):
            assert (ours - theirs).abs().max() <= 1e-5


@pytest.mark.parametrize('family', FAMILIES)
def test_zero_relative_positions_equal_none(family):
    torch.manual_seed(0)
    reference = _dense(family, window_size=3, window_block_indexes=(0, 2))
    with_rel_pos = _dense(family, window_size=3, window_block_indexes=(0, 2), use_rel_pos=True)
    missing = with_rel_pos.load_state_dict(reference.state_dict(), strict=False).missing_keys
    assert sorted(missing) == sorted(f'blocks.{i}.attn.rel_pos.{axis}'
                                     for i in range(4) for axis in ('height', 'width'))
    image = torch.randn(1, 3, 112, 80)
    with torch.no_grad():
        for ours, theirs in zip(with_rel_pos(image), reference(image)):
            assert (ours - theirs).abs().max() <= 1e-6
        # a table that is not zero changes the attention (block 1 is global: a 7x5 grid)
        tokens = torch.randn(1, 35, with_rel_pos.embed_dims)
        with_rel_pos.blocks[1].attn.rel_pos.height.normal_()
        plain = reference.blocks[1].attn.attention_weights(tokens, (7, 5))
        biased = with_rel_pos.blocks[1].attn.attention_weights(tokens, (7, 5))
        assert (biased - plain).abs().max() > 1e-2 * plain.abs().max()


def test_partition_pads_with_zeros_and_unpartition_inverts_it():
    x = torch.randn(2, 7, 5, 4)
    windows, padded = window_partition(x, 3)
    assert padded == (9, 6) and windows.shape == (2 * 3 * 2, 9, 4)
    # the last window of a row: columns 3..5, column 5 is padding
    assert torch.equal(windows[1].view(3, 3, 4)[:, :2], x[0, :3, 3:5])
    assert not windows[1].view(3, 3, 4)[:, 2].any()
    assert torch.equal(window_unpartition(windows, 3, padded, (7, 5)), x)


def test_padded_windows_attend_as_separate_zero_padded_images():
    torch.manual_seed(0)
    model = _dense('vit', window_size=3, window_block_indexes=(0,))
    attn, norm = model.blocks[0].attn, model.blocks[0].norm1
    tokens = torch.randn(1, 4 * 5, TINY_ARCH['embed_dims'])
    with torch.no_grad():
        out = model.blocks[0](tokens, (4, 5))
        normed = F.pad(norm(tokens).view(1, 4, 5, -1), (0, 0, 0, 1, 0, 2))  # to 6x6
        window = normed[:, 3:6, 3:6].reshape(1, 9, -1)  # bottom-right: 1x2 real tokens
        mixed = attn(window, (3, 3)).view(1, 3, 3, -1)[:, :1, :2]
        block = model.blocks[0]
        x = tokens.view(1, 4, 5, -1)[:, 3:4, 3:5] + mixed
        expected = x + block.mlp(block.norm2(x))
    assert torch.allclose(out.view(1, 4, 5, -1)[:, 3:4, 3:5], expected, atol=1e-6)


def test_logit_terms_add_q_dot_the_offset_rows():
    torch.manual_seed(0)
    rel_pos = DecomposedRelativePosition(4, (2, 3), zero_init=False)
    q, k = torch.randn(2, 1, 2, 6, 4).unbind(0)
    queries, keys = with_logit_terms(q * 0.5, k, rel_pos(q, (2, 3)))
    assert queries.shape[-1] == keys.shape[-1] == 16  # 4 + 2 rows + 3 columns, padded to 8s
    expected = 0.5 * q @ k.transpose(-2, -1) + reference_bias(rel_pos, q, (2, 3))
    assert torch.allclose(queries @ keys.transpose(-2, -1), expected, atol=1e-6)
    with pytest.raises(ValueError, match='patch tokens only: 7 queries'):
        rel_pos(torch.randn(1, 7, 4), (2, 3))


def _written_out(mixer: torch.nn.Module, x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
    """The mixer's output with the bias as an (N, N) term of the logits, as detectron2 adds
    it: logits + bias, softmax (talking heads: mixed before and after), weights · values."""
    if isinstance(mixer, GatedPositionalSelfAttention):
        q, k = mixer.qk(x).view(*x.shape[:2], 2, 2, 8).permute(2, 0, 3, 1, 4)
        content = ((q * 8 ** -0.5) @ k.transpose(-2, -1) +
                   reference_bias(mixer.rel_pos, q, hw)).softmax(-1)
        weights = torch.lerp(content, mixer.positional_attention(hw),
                             torch.sigmoid(mixer.gating).view(-1, 1, 1))
        values = mixer.v(x).view(*x.shape[:2], 2, 8).transpose(1, 2)
    else:
        q, k, values = mixer.qkv(x).view(*x.shape[:2], 3, 2, 8).permute(2, 0, 3, 1, 4)
        weights = (q * mixer.scale) @ k.transpose(-2, -1) + reference_bias(mixer.rel_pos, q, hw)
        if mixer.talking_heads:
            weights = mixer.mix_logits(weights.permute(0, 2, 3, 1)).softmax(-2)
            weights = mixer.mix_weights(weights).permute(0, 3, 1, 2)
        else:
            weights = weights.softmax(-1)
    return mixer.proj((weights @ values).transpose(1, 2).flatten(-2))


@pytest.mark.parametrize('kind', ['plain', 'talking-heads', 'talking-heads on CPU', 'gpsa'])
def test_folded_bias_equals_the_written_out_bias_and_keeps_no_token_map(kind):
    torch.manual_seed(0)
    if kind == 'gpsa':
        mixer = GatedPositionalSelfAttention(16, 2, rel_pos_grid=(3, 4))
    else:
        mixer = MultiheadSelfAttention(16, 2, talking_heads=kind.startswith('talking-heads'),
                                       rel_pos_grid=(3, 4))
    for table in mixer.rel_pos.parameters():
        torch.nn.init.normal_(table)
    x = torch.randn(2, 12, 16, requires_grad=True)
    saved = []
    # talking heads: as on a GPU at dense input sizes (folded into one fused call), or the
    # CPU's operator
    with talking_heads.forced_path(mixer, 'blocks' if kind.endswith('CPU') else 'fold'), \
            torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        out = mixer(x, (3, 4))
    params = [x, *mixer.parameters()]
    grads = torch.autograd.grad(out.square().sum(), params)
    expected = _written_out(mixer, x, (3, 4))
    expected_grads = torch.autograd.grad(expected.square().sum(), params)
    assert (out - expected).abs().max() <= 1e-5
    for ours, theirs in zip(grads, expected_grads):
        assert (ours - theirs).abs().max() <= 1e-5 * max(1., theirs.abs().max())
    # nothing of (B, heads, N, N) is kept for backward
    assert not [t.shape for t in saved if t.shape[-2:] == (12, 12) and t.numel() >= 2 * 2 * 144]


def test_relative_tables_resample_to_other_grids():
    table = torch.arange(5.)[:, None].expand(5, 2)  # grid 3
    rows = relative_table_lookup(table, 5, 5)  # resampled to 9 offsets
    assert rows.shape == (5, 5, 2)
    assert rows[0, 0, 0] == 2 and rows[4, 0, 0] == 4 and rows[0, 4, 0] == 0


def test_talking_heads_take_the_bias_before_mixing_heads():
    torch.manual_seed(0)
    attn = MultiheadSelfAttention(8, 2, talking_heads=True, rel_pos_grid=(2, 2)).eval()
    for table in attn.rel_pos.parameters():
        torch.nn.init.normal_(table)
    x = torch.randn(1, 4, 8)
    q, k, _ = attn.qkv(x).view(1, 4, 3, 2, 4).permute(2, 0, 3, 1, 4)
    logits = (q * attn.scale) @ k.transpose(-2, -1) + reference_bias(attn.rel_pos, q, (2, 2))
    mixed = attn.mix_logits(logits.permute(0, 2, 3, 1)).permute(0, 3, 1, 2).softmax(-1)
    expected = attn.mix_weights(mixed.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
    assert torch.allclose(attn.attention_weights(x, (2, 2)), expected, atol=1e-6)


def test_window_options_are_checked():
    with pytest.raises(ValueError, match='dense_class_token=False'):
        ViT(TINY_ARCH, window_size=7, pyramid=False)
    with pytest.raises(ValueError, match='no token attention'):
        XCiT(TINY_ARCH, window_size=7, pyramid=False)
    with pytest.raises(IndexError, match='window_block_indexes'):
        _dense('cait', window_size=7, window_block_indexes=(4,))
    with pytest.raises(ValueError, match=r'parallel blocks \(num_parallel > 1\)'):
        _dense('vit', window_size=7, num_parallel=2)
    # the windowed blocks get the window's tables, the others the global grid's
    model = _dense('vit', window_size=7, window_block_indexes=(0, 2), use_rel_pos=True,
                   rel_pos_img_size=256)
    assert [b.window_size for b in model.blocks] == [7, 0, 7, 0]
    assert [b.attn.rel_pos.height.shape[0] for b in model.blocks] == [13, 31, 13, 31]
    assert 'blocks.0.attn.rel_pos.height' in model.no_weight_decay()


def test_timm_checkpoint_loads_without_the_class_token_row():
    timm = pytest.importorskip('timm')
    source = timm.create_model('vit_tiny_patch16_224', pretrained=False).state_dict()
    model = ViT('tiny', pyramid=False, out_indices=(11,), dense_class_token=False,
                window_size=14, use_rel_pos=True)
    adapted = adapt_checkpoint(model, source)
    missing = model.load_state_dict(adapted, strict=False)
    assert not missing.unexpected_keys
    assert {k.rsplit('.', 3)[0] for k in missing.missing_keys} == {
        f'blocks.{i}' for i in range(12)}
    assert all('.attn.rel_pos.' in k for k in missing.missing_keys)
    assert torch.equal(model.pos_embed.weight, source['pos_embed'][:, 1:])


def test_simple_pyramid_levels():
    neck = SimpleFeaturePyramid(64, 32, num_outs=5)
    levels = neck((torch.randn(2, 64, 7, 5),))
    assert [tuple(level.shape[2:]) for level in levels] == [
        (28, 20), (14, 10), (7, 5), (4, 3), (2, 2)]
    assert all(level.shape[:2] == (2, 32) for level in levels)
    assert [type(m).__name__ for m in neck.rescales[0]] == [
        'ConvTranspose2d', 'LayerNorm2d', 'GELU', 'ConvTranspose2d']
    assert neck.rescales[0][-1].out_channels == 16 and neck.lateral_convs[0].conv.bias is None
    with pytest.raises(ValueError, match='powers of two'):
        SimpleFeaturePyramid(64, scale_factors=(3, 1))


def test_detectron2_rules_name_every_tensor_of_ours():
    backbone = _dense('vit', window_size=3, window_block_indexes=(0,), use_rel_pos=True)
    neck = SimpleFeaturePyramid(TINY_ARCH['embed_dims'], 16)
    ours = {*(f'backbone.{k}' for k in backbone.state_dict()),
            *(f'neck.{k}' for k in neck.state_dict())}
    detectron2_keys = ['backbone.net.pos_embed', 'backbone.net.patch_embed.proj.weight',
                       'backbone.net.blocks.0.attn.rel_pos_h', 'backbone.simfp_2.1.weight',
                       'backbone.simfp_2.4.weight', 'backbone.simfp_2.4.norm.bias',
                       'backbone.simfp_3.0.bias', 'backbone.simfp_5.2.norm.weight',
                       'proposal_generator.rpn_head.conv.weight']
    converted = convert_detectron2_vitdet(dict.fromkeys(detectron2_keys, torch.zeros(1)))
    assert sorted(converted) == sorted([
        'backbone.pos_embed.weight', 'backbone.patch_embed.proj.weight',
        'backbone.blocks.0.attn.rel_pos.height', 'neck.rescales.0.1.weight',
        'neck.lateral_convs.0.conv.weight', 'neck.lateral_convs.0.norm.bias',
        'neck.rescales.1.0.bias', 'neck.fpn_convs.3.norm.weight'])
    assert set(converted) <= ours
