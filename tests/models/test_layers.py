"""Shared layers: each mechanism against its definition."""
from unittest import mock

import pytest
import torch
import torch.nn.functional as F
from timm.layers import resample_abs_pos_embed

from vitdense.models.layers import (CrossCovarianceAttention, GatedPositionalSelfAttention,
                                    HMLPPatchEmbed, LearnedPositionEmbedding,
                                    MultiheadSelfAttention, MultiLevelPyramid, build_norm2d)
from vitdense.models.layers.attention import patch_offsets
from vitdense.models.layers.blocks import (GELU, LayerScale, TransformerBlock,
                                           residual_add)


def test_relative_positions_on_a_rectangular_grid():
    offsets = patch_offsets((2, 3), torch.device('cpu'), torch.float32)
    assert offsets.shape == (6, 6, 3)
    # token 1 is (row 0, col 1), token 5 is (row 1, col 2): dx = 1, dy = 1
    assert offsets[1, 5].tolist() == [1., 1., 2.]
    assert offsets[5, 0].tolist() == [-2., -1., 5.]
    assert torch.equal(offsets[..., 2], offsets[..., 0] ** 2 + offsets[..., 1] ** 2)


def test_gpsa_matches_explicit_gated_attention():
    torch.manual_seed(0)
    gpsa = GatedPositionalSelfAttention(dim=16, num_heads=4).eval()
    gpsa.convolutional_init()
    with torch.no_grad():
        gpsa.gating.copy_(torch.randn(4))
    x, hw = torch.randn(2, 6, 16), (2, 3)
    q, k = gpsa.qk(x).reshape(2, 6, 2, 4, 4).permute(2, 0, 3, 1, 4)
    v = gpsa.v(x).reshape(2, 6, 4, 4).transpose(1, 2)
    content = (q @ k.transpose(-2, -1) * 4 ** -0.5).softmax(-1)
    position = gpsa.pos_proj(patch_offsets(hw, x.device, x.dtype)).permute(2, 0, 1)
    gate = torch.sigmoid(gpsa.gating).view(1, 4, 1, 1)
    attn = (1 - gate) * content + gate * position.softmax(-1)
    attn = attn / attn.sum(-1, keepdim=True)
    expected = gpsa.proj((attn @ v).transpose(1, 2).reshape(2, 6, 16))
    assert torch.allclose(gpsa(x, hw), expected, atol=1e-6)


def test_gpsa_convolutional_init_attends_to_kernel_neighbours():
    gpsa = GatedPositionalSelfAttention(dim=36, num_heads=9, locality_strength=10.)
    gpsa.convolutional_init()
    hw = (5, 5)
    position = gpsa.pos_proj(patch_offsets(hw, torch.device('cpu'), torch.float32))
    attention = position.permute(2, 0, 1).softmax(-1)  # (heads, N, N)
    centre = 12  # (row 2, col 2)
    targets = {int(attention[h, centre].argmax()) for h in range(9)}
    neighbours = {r * 5 + c for r in (1, 2, 3) for c in (1, 2, 3)}
    assert targets == neighbours


def test_xca_is_softmax_over_channel_covariance():
    torch.manual_seed(0)
    xca = CrossCovarianceAttention(dim=8, num_heads=2).eval()
    with torch.no_grad():
        xca.temperature.copy_(torch.tensor([0.5, 2.0]).view(2, 1, 1))
    x = torch.randn(1, 5, 8)
    q, k, v = xca.qkv(x).reshape(1, 5, 3, 2, 4).permute(2, 0, 3, 4, 1)
    q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
    attn = ((q @ k.transpose(-2, -1)) * xca.temperature).softmax(-1)  # (1, 2, 4, 4)
    expected = xca.proj((attn @ v).permute(0, 3, 1, 2).reshape(1, 5, 8))
    assert torch.allclose(xca(x), expected, atol=1e-6)
    torch.testing.assert_close(xca.attention_weights(x), attn)


def test_xca_memory_is_linear_in_tokens():
    """The attention map is d×d per head whatever the number of tokens."""
    xca = CrossCovarianceAttention(dim=8, num_heads=2)
    for n in (4, 400):
        q, _, _ = xca.qkv(torch.randn(1, n, 8)).reshape(1, n, 3, 2, 4).permute(2, 0, 3, 4, 1)
        assert (q @ q.transpose(-2, -1)).shape == (1, 2, 4, 4)


def test_talking_heads_mix_logits_and_weights_across_heads():
    torch.manual_seed(0)
    attn = MultiheadSelfAttention(dim=8, num_heads=2, talking_heads=True).eval()
    x = torch.randn(1, 3, 8)
    q, k, v = attn.qkv(x).reshape(1, 3, 3, 2, 4).permute(2, 0, 3, 1, 4)
    logits = (q * 4 ** -0.5) @ k.transpose(-2, -1)
    logits = torch.einsum('bhnm,gh->bgnm', logits, attn.mix_logits.weight) \
        + attn.mix_logits.bias.view(1, 2, 1, 1)
    weights = torch.einsum('bhnm,gh->bgnm', logits.softmax(-1), attn.mix_weights.weight) \
        + attn.mix_weights.bias.view(1, 2, 1, 1)
    expected = attn.proj((weights @ v).transpose(1, 2).reshape(1, 3, 8))
    assert torch.allclose(attn(x), expected, atol=1e-6)


def test_branched_attention_equals_independent_branches():
    torch.manual_seed(0)
    fused = MultiheadSelfAttention(dim=8, num_heads=2, num_branches=3).eval()
    x = torch.randn(3, 2, 5, 8)  # (branches, B, N, C)
    out = fused(x)
    for b in range(3):
        single = MultiheadSelfAttention(dim=8, num_heads=2).eval()
        with torch.no_grad():
            single.qkv.weight.copy_(fused.qkv.weight[b])
            single.qkv.bias.copy_(fused.qkv.bias[b])
            single.proj.weight.copy_(fused.proj.weight[b])
            single.proj.bias.copy_(fused.proj.bias[b])
        assert torch.allclose(out[b], single(x[b]), atol=1e-6)


@pytest.mark.parametrize('num_branches', (1, 2))
def test_attention_mask_hides_keys_per_image(num_branches):
    """A boolean (B, N, N) mask (EoMT's masked attention) gives each image's rows the softmax
    over the keys it allows, in every head and branch."""
    torch.manual_seed(0)
    attn = MultiheadSelfAttention(dim=8, num_heads=2, num_branches=num_branches).eval()
    x = torch.randn(num_branches, 2, 5, 8) if num_branches > 1 else torch.randn(2, 5, 8)
    mask = torch.rand(2, 5, 5) > 0.5
    mask[:, :, 0] = True  # every row attends somewhere
    out = attn(x, attn_mask=mask)
    for b in range(num_branches):
        branch = attn if num_branches == 1 else MultiheadSelfAttention(dim=8, num_heads=2)
        if num_branches > 1:
            with torch.no_grad():
                for name in ('qkv', 'proj'):
                    getattr(branch, name).weight.copy_(getattr(attn, name).weight[b])
                    getattr(branch, name).bias.copy_(getattr(attn, name).bias[b])
        tokens = x if num_branches == 1 else x[b]
        q, k, v = branch.qkv(tokens).reshape(2, 5, 3, 2, 4).permute(2, 0, 3, 1, 4)
        logits = ((q * 4 ** -0.5) @ k.transpose(-2, -1)).masked_fill(~mask[:, None], -torch.inf)
        expected = branch.proj((logits.softmax(-1) @ v).transpose(1, 2).reshape(2, 5, 8))
        torch.testing.assert_close(out if num_branches == 1 else out[b], expected)
    assert not torch.allclose(out, attn(x))


def test_talking_heads_take_an_attention_mask_on_their_maps():
    """Masked keys get -inf in the mixed logits and zero in the mixed weights (so the weight
    mix's bias does not reach them); a fused path forced with a mask is refused."""
    torch.manual_seed(0)
    attn = MultiheadSelfAttention(dim=8, num_heads=2, talking_heads=True).eval()
    with torch.no_grad():
        attn.mix_weights.bias.fill_(0.3)
    x, mask = torch.randn(2, 5, 8), torch.rand(2, 5, 5) > 0.5
    mask[:, :, 0] = True
    q, k, v = attn.qkv(x).reshape(2, 5, 3, 2, 4).permute(2, 0, 3, 1, 4)
    logits = torch.einsum('bhnm,gh->bgnm', (q * 4 ** -0.5) @ k.transpose(-2, -1),
                          attn.mix_logits.weight) + attn.mix_logits.bias.view(1, 2, 1, 1)
    weights = logits.masked_fill(~mask[:, None], -torch.inf).softmax(-1)
    weights = torch.einsum('bhnm,gh->bgnm', weights, attn.mix_weights.weight) \
        + attn.mix_weights.bias.view(1, 2, 1, 1)
    weights = weights.masked_fill(~mask[:, None], 0.)
    expected = attn.proj((weights @ v).transpose(1, 2).reshape(2, 5, 8))
    torch.testing.assert_close(attn(x, attn_mask=mask), expected)
    forced = MultiheadSelfAttention(8, 2, talking_heads=True, talking_heads_path='fold')
    with pytest.raises(ValueError, match="an attention mask takes the 'maps'"):
        forced(x, attn_mask=mask)


def test_attention_mask_of_the_first_tokens_leaves_the_others_free():
    """A (B, M, N) mask restricts the first M tokens: the same as the (B, N, N) mask whose
    other rows allow every key."""
    torch.manual_seed(0)
    attn = MultiheadSelfAttention(dim=8, num_heads=2).eval()
    x, mask = torch.randn(2, 5, 8), torch.rand(2, 2, 5) > 0.5
    mask[:, :, 0] = True
    full = torch.cat([mask, torch.ones(2, 3, 5, dtype=torch.bool)], dim=1)
    torch.testing.assert_close(attn(x, attn_mask=mask), attn(x, attn_mask=full))


def test_cross_covariance_attention_takes_a_mask_as_attention_on_the_tokens_seen():
    """XCA masked for the first M tokens: each such token's output is what XCA gives it on
    the tokens its row marks alone (its covariance over those tokens); the other tokens
    take the covariance over all of them; a mask allowing everything changes nothing."""
    torch.manual_seed(0)
    attn = CrossCovarianceAttention(dim=16, num_heads=2).eval()
    with torch.no_grad():
        attn.temperature.uniform_(0.5, 2.0)
    x, mask = torch.randn(2, 9, 16), torch.rand(2, 3, 9) > 0.4
    mask[:, :, :3] = True  # the masked tokens see each other, as EoMT's queries do
    out = attn(x, attn_mask=mask)
    for b in range(2):
        for row in range(3):
            alone = attn(x[b:b + 1, mask[b, row]])[0, row]
            torch.testing.assert_close(out[b, row], alone)
    torch.testing.assert_close(out[:, 3:], attn(x)[:, 3:])
    torch.testing.assert_close(attn(x, attn_mask=torch.ones_like(mask)), attn(x))
    assert not torch.allclose(out[:, :3], attn(x)[:, :3])


class _NoMixing(torch.nn.Module):
    def forward(self, x, hw, attn_mask=None):
        return torch.zeros_like(x)


def test_local_patch_interaction_leaves_the_tokens_before_the_patches_out():
    """XCiT's LPI runs on the patch grid (the last rows·cols tokens); the tokens before them
    (EoMT's queries) take only the FFN, and the patches are as without them."""
    torch.manual_seed(0)
    block = TransformerBlock(8, _NoMixing(), layer_scale=0.5,
                             local_patch_interaction=True).eval()
    prefix, patches = torch.randn(2, 3, 8), torch.randn(2, 6, 8)
    with torch.no_grad():
        out = block(torch.cat([prefix, patches], dim=1), (2, 3))
        torch.testing.assert_close(out[:, 3:], block(patches, (2, 3)))
        torch.testing.assert_close(out[:, :3],
                                   prefix + block.ls2(block.mlp(block.norm2(prefix))))


def test_attention_mask_refusals():
    x, mask = torch.randn(2, 5, 8), torch.ones(2, 5, 5, dtype=torch.bool)
    with pytest.raises(ValueError, match=r'shape \(B, M, N\) = \(2, M <= 5, 5\).*float32'):
        MultiheadSelfAttention(8, 2)(x, attn_mask=mask.float())
    with pytest.raises(ValueError, match=r'shape \(B, M, N\) = \(2, M <= 5, 5\)'):
        CrossCovarianceAttention(8, 2)(x, attn_mask=mask[:, :, :4])
    block = TransformerBlock(8, MultiheadSelfAttention(8, 2), window_size=2)
    with pytest.raises(ValueError, match='does not combine with window attention'):
        block(x[:, 1:], (2, 2), attn_mask=mask[:, 1:, 1:])


@pytest.mark.parametrize('num_branches,talking_heads', [(1, False), (2, False), (1, True)])
def test_block_updating_only_the_first_tokens_equals_the_full_block(num_branches,
                                                                     talking_heads):
    """A classifier's last block needs only its class token: same values, FFN spared."""
    torch.manual_seed(0)
    mixer = MultiheadSelfAttention(8, 2, num_branches=num_branches,
                                   talking_heads=talking_heads)
    block = TransformerBlock(8, mixer, layer_scale=0.5, num_branches=num_branches).eval()
    x = torch.randn(2, 7, 8)
    torch.testing.assert_close(block(x, (2, 3), num_queries=1), block(x, (2, 3))[:, :1])
    xca_block = TransformerBlock(8, CrossCovarianceAttention(8, 2),
                                 local_patch_interaction=True)
    with pytest.raises(ValueError, match='local patch interaction needs every token'):
        xca_block(x[:, 1:], (2, 3), num_queries=1)


def test_res_post_norm_block_is_timms_and_saves_attn_before_norm1():
    """A res-post-norm block (``x + norm(branch(x))``) computes timm's ``ResPostBlock`` from
    its tensors, under the same names saved in the same order (``attn`` first), with and
    without ``num_queries``; it refuses parallel branches and the LPI."""
    from timm.models.vision_transformer import ResPostBlock
    torch.manual_seed(0)
    reference = ResPostBlock(8, 2, qkv_bias=True, init_values=.5).eval()
    block = TransformerBlock(8, MultiheadSelfAttention(8, 2), res_post_norm=True).eval()
    assert list(block.state_dict()) == list(reference.state_dict())
    with torch.no_grad():
        for param in reference.parameters():
            param.add_(torch.randn_like(param) * .1)
    block.load_state_dict(reference.state_dict())
    x = torch.randn(2, 7, 8)
    with torch.no_grad():
        expected = reference(x)
        torch.testing.assert_close(block(x, (2, 3)), expected)
        torch.testing.assert_close(block(x, (2, 3), num_queries=1), expected[:, :1])
    for options in (dict(num_branches=2), dict(local_patch_interaction=True)):
        with pytest.raises(ValueError, match='res_post_norm normalises the output of a single'):
            TransformerBlock(8, MultiheadSelfAttention(8, 2), res_post_norm=True, **options)


def test_in_place_only_when_no_gradient_is_needed():
    """Inference writes into the branch (x, which a dense map may view, is untouched);
    with autograd a new tensor is made and the gradient is that of x + branch."""
    x, branch = torch.randn(3, 4), torch.randn(3, 4)
    x_before, branch_before = x.clone(), branch.clone()
    with torch.no_grad():
        out = residual_add(x, branch)
    assert out.data_ptr() == branch.data_ptr() and torch.equal(x, x_before)
    assert torch.equal(out, x_before + branch_before)

    x, branch = torch.randn(3, 4, requires_grad=True), torch.randn(3, 4)
    branch_before = branch.clone()
    out = residual_add(x, branch)
    out.sum().backward()
    assert torch.equal(branch, branch_before) and torch.equal(x.grad, torch.ones(3, 4))

    h = torch.randn(5)
    with torch.no_grad():
        expected = F.gelu(h)
        assert GELU()(h).data_ptr() == h.data_ptr() and torch.equal(h, expected)
        # a LayerScale used as a plain layer keeps its input; our blocks' ones reuse it
        assert torch.equal(LayerScale(5, 0.5)(h), expected * 0.5)
        assert torch.equal(h, expected)
        assert LayerScale(5, 0.5, inplace=True)(h).data_ptr() == h.data_ptr()
        assert torch.equal(h, expected * 0.5)


def test_hmlp_stem_follows_appendix_c_and_keeps_patches_independent():
    torch.manual_seed(0)
    stem = HMLPPatchEmbed(3, 64, 16).eval()
    convs = [m for m in stem.proj if isinstance(m, torch.nn.Conv2d)]
    assert [(c.kernel_size, c.stride) for c in convs] == [((4, 4), (4, 4)), ((2, 2), (2, 2)),
                                                          ((2, 2), (2, 2))]
    assert [c.out_channels for c in convs] == [16, 16, 64]
    assert [type(m).__name__ for m in stem.proj] == [
        'Conv2d', 'BatchNorm2d', 'GELU', 'Conv2d', 'BatchNorm2d', 'GELU', 'Conv2d', 'BatchNorm2d']
    for m in stem.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.uniform_(-1, 1)
            m.running_var.uniform_(0.5, 2)
    image = torch.randn(1, 3, 32, 48)
    tokens, hw = stem(image)
    assert hw == (2, 3)
    # each token is the MLP of its own 16x16 patch: same result when run patch by patch
    for r in range(2):
        for c in range(3):
            patch_token, _ = stem(image[:, :, 16 * r:16 * r + 16, 16 * c:16 * c + 16])
            assert torch.allclose(tokens[:, r * 3 + c], patch_token[:, 0], atol=1e-5)
    # the first layer is a linear map of each flattened 4x4 sub-patch
    sub = image[:, :, :4, :4].reshape(1, -1)
    first = sub @ convs[0].weight.reshape(16, -1).T + convs[0].bias
    assert torch.allclose(stem.proj[0](image)[:, :, 0, 0], first, atol=1e-5)


def test_hmlp_layer_norm_variant_and_bad_arguments():
    stem = HMLPPatchEmbed(3, 32, 16, norm='LN')
    assert stem(torch.randn(2, 3, 16, 16))[0].shape == (2, 1, 32)
    with pytest.raises(ValueError, match='patch_size'):
        HMLPPatchEmbed(3, 32, 14)
    with pytest.raises(ValueError, match="'BN' or 'LN'"):
        HMLPPatchEmbed(3, 32, 16, norm='GN')


def test_position_table_resamples_on_load_and_per_grid():
    table = LearnedPositionEmbedding(4, (4, 4), num_prefix_tokens=1)
    small = LearnedPositionEmbedding(4, (2, 2), num_prefix_tokens=1)
    small.load_state_dict(table.state_dict())
    assert small.weight.shape == (1, 5, 4)
    assert torch.equal(small.weight[:, 0], table.weight[:, 0])  # class position kept
    out = table(torch.zeros(1, 1 + 6, 4), (2, 3))
    assert out.shape == (1, 7, 4)
    with pytest.raises(ValueError, match='cannot be resampled'):
        small.load_state_dict({'weight': torch.zeros(1, 7, 4)})


@pytest.mark.parametrize('antialias', [False, True])
def test_a_float64_table_resamples_in_float64(antialias):
    """As ``F.interpolate`` (bicubic) on the float64 grid: no float32 rounding on the way."""
    table = LearnedPositionEmbedding(3, (4, 4), num_prefix_tokens=1, antialias=antialias)
    table.double()
    grid = table.weight[:, 1:].reshape(1, 4, 4, 3).permute(0, 3, 1, 2)
    expected = F.interpolate(grid, size=(3, 7), mode='bicubic', antialias=antialias,
                             align_corners=False).flatten(2).transpose(1, 2)
    out = table(torch.zeros(1, 1 + 21, 3, dtype=torch.float64), (3, 7))
    assert out.dtype == torch.float64
    torch.testing.assert_close(out[:, 1:], expected, atol=1e-15, rtol=0)
    assert torch.equal(out[:, 0], table.weight[:, 0])


class _TableOnMap(torch.nn.Module):
    """A position table added to a (1, C, H, W) map's tokens: the grid from the input."""

    def __init__(self, table: LearnedPositionEmbedding) -> None:
        super().__init__()
        self.table = table

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        hw = (tokens.shape[2], tokens.shape[3])
        return self.table(tokens.flatten(2).transpose(1, 2), hw)


def test_position_table_resamples_alike_eager_compiled_and_exported():
    torch.manual_seed(0)
    table = LearnedPositionEmbedding(8, (4, 4))
    module = _TableOnMap(table).eval()
    tokens = torch.randn(1, 8, 5, 6)
    eager = module(tokens)
    reference = resample_abs_pos_embed(table.weight, (5, 6), (4, 4), num_prefix_tokens=0)
    torch.testing.assert_close(eager, tokens.flatten(2).transpose(1, 2) + reference,
                               atol=1e-6, rtol=0)
    at_own_grid = module(torch.zeros(1, 8, 4, 4))
    assert torch.equal(at_own_grid, table.weight.expand_as(at_own_grid))
    compiled = torch.compile(module, backend='aot_eager', dynamic=True, fullgraph=True)
    assert torch.equal(compiled(tokens), eager)
    rows, cols = torch.export.Dim('rows', min=2, max=64), torch.export.Dim('cols', min=2, max=64)
    exported = torch.export.export(module, (tokens,),
                                   dynamic_shapes=({2: rows, 3: cols},)).module()
    assert torch.equal(exported(tokens), eager)
    other = torch.randn(1, 8, 7, 3)
    assert torch.equal(exported(other), module(other))


@pytest.mark.parametrize('patch_size,expected', [
    (16, ['Sequential', 'Sequential', 'Identity', 'MaxPool2d']),
    (8, ['Sequential', 'Identity', 'MaxPool2d', 'MaxPool2d']),
])
def test_pyramid_levels_follow_the_official_recipe(patch_size, expected):
    pyramid = MultiLevelPyramid(16, patch_size, dict(type='BN'))
    assert [type(getattr(pyramid, f'fpn{i}')).__name__ for i in range(1, 5)] == expected
    if patch_size == 16:
        assert [type(m).__name__ for m in pyramid.fpn1] == [
            'ConvTranspose2d', 'BatchNorm2d', 'GELU', 'ConvTranspose2d']
    maps = [torch.randn(2, 16, 7, 5) for _ in range(4)]
    image_hw = (7 * patch_size, 5 * patch_size)
    outs = pyramid(maps, image_hw)
    assert [o.shape[-2:] for o in outs] == [
        (-(-image_hw[0] // s), -(-image_hw[1] // s)) for s in (4, 8, 16, 32)]


def test_pyramid_crop_slices_in_eager_mode_and_gathers_the_same_values_under_export():
    torch.manual_seed(0)
    pyramid = MultiLevelPyramid(16, 16, dict(type='BN')).eval()
    maps = [torch.randn(1, 16, 7, 5) for _ in range(4)]
    image_hw = (7 * 16 - 9, 5 * 16)  # the last row of patches is padding at strides 4, 8
    eager = pyramid(maps, image_hw)
    assert eager[2].data_ptr() == maps[2].data_ptr()  # nothing cropped: a view, no copy
    with mock.patch.object(torch.compiler, 'is_exporting', return_value=True):
        gathered = pyramid(maps, image_hw)
    assert [o.shape[-2:] for o in eager] == [(26, 20), (13, 10), (7, 5), (4, 3)]
    for ours, exported in zip(eager, gathered):
        assert torch.equal(ours, exported)


@pytest.mark.parametrize('cfg,name', [(dict(type='BN'), 'BatchNorm2d'),
                                      (dict(type='SyncBN'), 'SyncBatchNorm'),
                                      (dict(type='GN', num_groups=4), 'GroupNorm'),
                                      (dict(type='LN'), 'LayerNorm2d')])
def test_pyramid_norms(cfg, name):
    pyramid = MultiLevelPyramid(16, 16, cfg)
    assert type(pyramid.fpn1[1]).__name__ == name


def test_layer_norm_2d_normalises_channels():
    norm = build_norm2d(dict(type='LN'), 6)
    x = torch.randn(2, 6, 3, 4)
    expected = F.layer_norm(x.permute(0, 2, 3, 1), (6,)).permute(0, 3, 1, 2)
    assert torch.allclose(norm(x), expected, atol=1e-6)
    with pytest.raises(KeyError, match='unknown norm type'):
        build_norm2d(dict(type='IN'), 6)
