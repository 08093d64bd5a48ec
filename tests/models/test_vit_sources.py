"""ViTs users hold from other sources (EVA-02, DINOv3, CLIP, qk_norm ViTs) load into ViT and
compute what the source library computes: small random timm models with perturbed weights,
at their own size and a non-square one, in the classifier, pyramid and ViTDet layouts."""
import contextlib
import math
from typing import Callable, Iterator

import pytest
import torch
import torch.nn.functional as F
from mmengine.logging import MMLogger
from timm.layers import resample_abs_pos_embed

from vitdense.analysis.timm_parity import compare_with_timm, perturbed
from vitdense.models import ViT, adapt_checkpoint
from vitdense.models.layers.rotary import RotaryPositionEmbedding
from vitdense.models.layers.swiglu import merge_swiglu_tensors
from vitdense.models.layers.window_attention import window_partition, window_unpartition

from common import dinov3_hub_layout, eva02_official_rotary_tables

#: the floor: each source equal to timm's forward within this, relative to its largest value
RELATIVE_TOLERANCE = 1e-5
SMALL = dict(embed_dims=64, num_layers=4, num_heads=2)
SMALL_TIMM = dict(embed_dim=64, depth=4, num_heads=2)
#: each source's own size and a non-square one, multiples of its patch
SIZES = {14: [(224, 224), (196, 280)], 16: [(224, 224), (192, 288)]}
#: the published EVA-02, DINOv3, CLIP and SigLIP sizes of ViT's table, and a class-token-free
#: ViT with registers, the res-post-norm ViT
SOURCES = [name for _, _, name in ViT.timm_models if name and any(
    source in name for source in ('eva02', 'dinov3', 'clip', 'siglip', 'gap', 'rpn'))]


def table_options(timm_name: str) -> dict:
    """ViT's options for ``timm_name`` from its ``timm_models`` table."""
    return next(dict(options) for _, options, name in ViT.timm_models if name == timm_name)


@pytest.mark.parametrize('timm_name', SOURCES)
@pytest.mark.parametrize('size_index', [0, 1])
def test_each_source_computes_what_timm_computes(timm_name, size_index):
    """Class token or pooled features (the head timm reads), every block's map and the
    pyramid's levels, from timm's state dict as it is saved."""
    options = table_options(timm_name)
    image_hw = SIZES[options.get('patch_size', 16)][size_index]
    result = compare_with_timm('vit', SMALL, timm_name, num_classes=10, image_hw=image_hw,
                               timm_kwargs=dict(SMALL_TIMM, dynamic_img_size=True),
                               perturbation=.05, **options)
    if 'siglip' in timm_name:  # its attention-pooling head: no head of ours reads it
        assert result['logit_rel_diff'] is None
    else:
        assert result['logit_rel_diff'] <= RELATIVE_TOLERANCE
    assert result['feature_rel_diff'] <= RELATIVE_TOLERANCE
    if options.get('patch_size', 16) == 16:
        assert result['pyramid_rel_diff'] <= RELATIVE_TOLERANCE
    else:  # the multi-layer pyramid takes power-of-two patch sizes
        assert result['pyramid_rel_diff'] is None


def test_qk_norm_vit_computes_what_timm_computes():
    result = compare_with_timm('vit', SMALL, 'vit_small_patch16_224', num_classes=10,
                               image_hw=(192, 288), perturbation=.05, qk_norm=True,
                               timm_kwargs=dict(SMALL_TIMM, qk_norm=True))
    assert result['logit_rel_diff'] <= RELATIVE_TOLERANCE
    assert result['feature_rel_diff'] <= RELATIVE_TOLERANCE


def timm_vitdet_maps(reference, images: torch.Tensor, window: int, windowed: set[int],
                     indices: list[int], attend: Callable) -> list[torch.Tensor]:
    """ViTDet's layout written out from timm's own modules: patch tokens only (the class
    token and its position row dropped), blocks in ``windowed`` attending within each
    zero-padded window of ``window`` tokens a side, the others over the whole grid;
    ``attend(index, tokens, grid)`` is block ``index``'s attention of (B, N, C) tokens on a
    grid as the source computes it. Returns the maps of blocks ``indices``."""
    x = reference.patch_embed(images)
    rows, cols = (side // reference.patch_embed.patch_size[0] for side in images.shape[-2:])
    batch, dims = x.shape[0], x.shape[-1]
    x = x.reshape(batch, rows * cols, dims)
    if reference.pos_embed is not None:
        table = reference.pos_embed[:, reference.num_prefix_tokens:]
        side = int(table.shape[1] ** .5)
        x = x + resample_abs_pos_embed(table, (rows, cols), (side, side), num_prefix_tokens=0)
    x = getattr(reference, 'norm_pre', torch.nn.Identity())(x)
    maps = []
    for index, block in enumerate(reference.blocks):
        if index in windowed:
            windows, padded = window_partition(block.norm1(x).view(batch, rows, cols, dims),
                                               window)
            mixed = attend(index, windows, (window, window))
            mixed = window_unpartition(mixed, window, padded, (rows, cols)).reshape(x.shape)
        else:
            mixed = attend(index, block.norm1(x), (rows, cols))
        x = x + layer_scaled(block, 1, mixed)
        x = x + layer_scaled(block, 2, block.mlp(block.norm2(x)))
        if index in indices:
            maps.append(x.transpose(1, 2).reshape(batch, dims, rows, cols))
    return maps


def layer_scaled(block: torch.nn.Module, branch: int, x: torch.Tensor) -> torch.Tensor:
    """A timm block's LayerScale of residual branch 1 or 2: ViT's ``ls<branch>`` module,
    EVA's and BEiT's ``gamma_<branch>`` (None without LayerScale)."""
    if hasattr(block, f'ls{branch}'):
        return getattr(block, f'ls{branch}')(x)
    gamma = getattr(block, f'gamma_{branch}')
    return x if gamma is None else gamma * x


def beit_for_patches(state_dict: dict, grid: tuple[int, int]) -> torch.nn.Module:
    """timm's BEiT built for ``grid`` (its tables resampled by timm's
    ``checkpoint_filter_fn``) whose attention, fed a zero class token before the patches,
    leaves the patches unaffected by it: its entries patch -> class and class -> class are
    -inf, so that no patch attends to it."""
    import timm
    from timm.models.beit import checkpoint_filter_fn
    model = timm.create_model('beit_base_patch16_224', num_classes=0, img_size=tuple(
        16 * side for side in grid), **SMALL_TIMM).eval()
    model.load_state_dict(checkpoint_filter_fn(dict(state_dict), model))
    with torch.no_grad():
        for block in model.blocks:  # timm's last entries: patch -> class, class -> class
            block.attn.relative_position_bias_table[-2:] = float('-inf')
    return model


def with_zero_class_token(attention: torch.nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """``attention`` of a zero class token and ``tokens``, the class token's output dropped."""
    zero = tokens.new_zeros(tokens.shape[0], 1, tokens.shape[-1])
    return attention(torch.cat([zero, tokens], dim=1))[:, 1:]


@pytest.mark.parametrize('timm_name', ['eva02_base_patch14_224', 'vit_base_patch16_dinov3'])
@pytest.mark.parametrize('size_index', [0, 1])
def test_vitdet_layout_rotates_each_window_as_its_own_grid(timm_name, size_index):
    """Window attention with rotary positions (EVA-02's detectors): each window is rotated
    as a grid of its own, coordinates rescaled to the pretraining grid (EVA-02) or
    normalised over the window (DINOv3); global blocks take the whole grid."""
    import timm
    options = table_options(timm_name)
    image_hw = SIZES[options.get('patch_size', 16)][size_index]
    reference = timm.create_model(timm_name, pretrained=False, num_classes=0,
                                  dynamic_img_size=True, **SMALL_TIMM).eval()
    state_dict = perturbed(reference.state_dict(), .05)
    reference.load_state_dict(state_dict)
    for block in reference.blocks:
        block.attn.num_prefix_tokens = 0

    def attend(index: int, tokens: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
        return reference.blocks[index].attn(tokens, rope=reference.rope.get_embed(shape=grid))
    window, windowed = 6, {0, 2}
    ours = ViT(SMALL, out_type='featmap', pyramid=False, out_indices=(0, 1, 2, 3),
               dense_class_token=False, window_size=window, window_block_indexes=sorted(windowed),
               **options).eval()
    ours.load_state_dict(adapt_checkpoint(ours, state_dict))
    images = torch.randn(2, 3, *image_hw)
    with torch.no_grad():
        expected = timm_vitdet_maps(reference, images, window, windowed, [0, 1, 2, 3], attend)
        for got, want in zip(ours(images), expected):
            assert (got - want).abs().max() <= RELATIVE_TOLERANCE * want.abs().max()


def assert_file_computes_as_timm(released: dict, options: dict, reference: torch.nn.Module,
                                 images: torch.Tensor) -> None:
    """ViTs built with ``options`` and loaded from ``released`` give the class token and every
    block's map of ``reference``, timm's model holding the same tensors."""
    classifier = ViT(SMALL, out_type='cls_token', **options).eval()
    classifier.load_state_dict(adapt_checkpoint(classifier, released))
    dense = ViT(SMALL, pyramid=False, out_indices=(0, 1, 2, 3), **options).eval()
    dense.load_state_dict(adapt_checkpoint(dense, released))
    with torch.no_grad():
        expected = reference.forward_features(images)[:, 0]
        assert (classifier(images)[0] - expected).abs().max() <= \
            RELATIVE_TOLERANCE * expected.abs().max()
    assert_block_maps_match(dense, reference.forward_intermediates(
        images, indices=[0, 1, 2, 3], norm=False, output_fmt='NCHW', intermediates_only=True),
        images)


@pytest.mark.parametrize('timm_name', ['beit_base_patch16_224', 'vit_base_patch16_clip_224',
                                       'vit_base_patch16_clip_quickgelu_224'])
@pytest.mark.parametrize('size_index', [0, 1])
def test_beit_and_clip_in_the_vitdet_layout_compute_timms_blocks(timm_name, size_index):
    """BEiT's relative position bias resampled to each window's grid and to the whole grid
    as BEiT resamples it; CLIP's positions and ``norm_pre`` before windowed blocks."""
    import timm
    options = table_options(timm_name)
    image_hw = SIZES[16][size_index]
    window, windowed = 6, {0, 2}
    grid = (image_hw[0] // 16, image_hw[1] // 16)
    if 'beit' in timm_name:
        state_dict = perturbed(timm.create_model(timm_name, num_classes=0,
                                                 **SMALL_TIMM).state_dict(), .05)
        for key in [k for k in state_dict if k.endswith('relative_position_bias_table')]:
            state_dict[key] = torch.randn_like(state_dict[key])  # a trained table's scale
        by_grid = {size: beit_for_patches(state_dict, size) for size in ((window, window), grid)}
        reference = by_grid[grid]

        def attend(index: int, tokens: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
            return with_zero_class_token(by_grid[size].blocks[index].attn, tokens)
    else:
        reference = timm.create_model(timm_name, num_classes=0, dynamic_img_size=True,
                                      **SMALL_TIMM).eval()
        state_dict = perturbed(reference.state_dict(), .05)
        reference.load_state_dict(state_dict)

        def attend(index: int, tokens: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
            return reference.blocks[index].attn(tokens)
    ours = ViT(SMALL, out_type='featmap', pyramid=False, out_indices=(0, 1, 2, 3),
               dense_class_token=False, window_size=window, window_block_indexes=sorted(windowed),
               **options).eval()
    ours.load_state_dict(adapt_checkpoint(ours, state_dict))
    images = torch.randn(2, 3, *image_hw)
    with torch.no_grad():
        expected = timm_vitdet_maps(reference, images, window, windowed, [0, 1, 2, 3], attend)
        for got, want in zip(ours(images), expected):
            assert (got - want).abs().max() <= RELATIVE_TOLERANCE * want.abs().max()


def test_eva02_rotation_is_rescaled_to_the_reference_grid():
    """A 1024-px detector keeps the 224-px model's positions: with ``ref_feat_shape`` the
    grid of 64 patches spans the coordinates of the pretraining grid of 16."""
    rope = RotaryPositionEmbedding(32, 'eva02', ref_grid=(16, 16))
    coarse, fine = rope.angles((16, 16), 'cpu'), rope.angles((64, 64), 'cpu')
    assert torch.allclose(fine.view(64, 64, -1)[::4, ::4].reshape(256, -1), coarse)
    assert not torch.allclose(RotaryPositionEmbedding(32, 'eva02', ref_grid=(64, 64)).angles(
        (64, 64), 'cpu'), fine)


def test_swiglu_packed_and_unpacked_tensors_load_alike():
    """timm's unpacked SwiGLU (``fc1_g``, ``fc1_x``) is its packed ``fc1``, gate rows first."""
    gate, value = torch.randn(8, 4), torch.randn(8, 4)
    merged = merge_swiglu_tensors({'blocks.0.mlp.fc1_g.weight': gate,
                                   'blocks.0.mlp.fc1_x.weight': value})
    assert list(merged) == ['blocks.0.mlp.fc1.weight']
    assert torch.equal(merged['blocks.0.mlp.fc1.weight'], torch.cat([gate, value]))


def test_rotary_positions_leave_the_prefix_tokens_unrotated():
    rope = RotaryPositionEmbedding(8, 'dinov3')
    tokens = torch.randn(2, 1 + 4 + 6, 8)
    rotated = rope(tokens, (2, 3))
    assert torch.equal(rotated[:, :5], tokens[:, :5])
    assert not torch.allclose(rotated[:, 5:], tokens[:, 5:])
    # a rotation: lengths kept
    assert torch.allclose(rotated.norm(dim=-1), tokens.norm(dim=-1), atol=1e-6)


def test_bad_options_name_the_problem():
    with pytest.raises(ValueError, match='unknown rotary style'):
        ViT(SMALL, rope='beit')
    with pytest.raises(ValueError, match='multiple of 4'):
        ViT(dict(SMALL, num_heads=32), rope='eva02')
    with pytest.raises(ValueError, match='scale_mlp .* swiglu_mlp=True'):
        ViT(SMALL, scale_mlp=True)
    with pytest.raises(ValueError, match='unknown act_layer'):
        ViT(SMALL, act_layer='relu6')
    with pytest.raises(ValueError, match='unknown pos_embed'):
        ViT(SMALL, pos_embed='sincos')
    with pytest.raises(ValueError, match='parallel'):
        ViT(SMALL, rope='eva02', num_parallel=2)


def test_norm_pre_belongs_to_the_embeddings():
    """``norm_pre`` is frozen with the embeddings and shares their lr-decay layer."""
    model = ViT(SMALL, pre_norm=True, frozen_stages=0, pyramid=False)
    assert not model.norm_pre.weight.requires_grad
    assert model.get_layer_depth('norm_pre.weight')[0] == 0
    images = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        model.norm_pre.weight.zero_()
        model.norm_pre.bias.zero_()
        # every token zero after norm_pre: the blocks see constants, so all positions agree
        out = model(images)[-1]
    assert torch.allclose(out, out[..., :1, :1].expand_as(out), atol=1e-5)


def test_a_model_without_class_token_keeps_its_registers():
    """timm's class-token-free ViTs with registers (``*_reg4_gap_*``) load exactly with
    ``class_token=False``; asking such a model for its class token is an error."""
    import timm
    reference = timm.create_model('vit_base_patch16_reg4_gap_256', num_classes=0,
                                  **SMALL_TIMM)
    model = ViT(SMALL, out_type='avg_featmap', fc_norm=True, class_token=False, reg_tokens=4,
                no_embed_class=True, img_size=256)
    adapted = adapt_checkpoint(model, reference.state_dict())
    assert adapted['reg_token'].shape == (1, 4, 64) and 'cls_token' not in adapted
    assert model.num_prefix_tokens == 4
    with pytest.raises(ValueError, match="class_token=False builds no class token"):
        ViT(SMALL, out_type='cls_token', class_token=False)


def test_siglip_attention_pooling_is_refused_where_it_would_be_read():
    """Dense models leave SigLIP's attention-pooling head out (logged); a classifier, which
    has no such head, refuses the checkpoint instead of pooling otherwise."""
    import timm
    state_dict = timm.create_model('vit_base_patch16_siglip_224', num_classes=0,
                                   **SMALL_TIMM).state_dict()
    dense = ViT(SMALL, class_token=False, pyramid=False)
    assert not any(key.startswith('attn_pool') for key in adapt_checkpoint(dense, state_dict))
    with pytest.raises(ValueError, match='attn_pool'):
        adapt_checkpoint(ViT(SMALL, class_token=False, out_type='avg_featmap'), state_dict)


@contextlib.contextmanager
def mmengine_log_in(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """mmengine's current logger (which does not propagate to the root) also writes to
    ``caplog`` while the block runs."""
    logger = MMLogger.get_current_instance()
    logger.addHandler(caplog.handler)
    try:
        yield
    finally:
        logger.removeHandler(caplog.handler)


def assert_block_maps_match(ours: ViT, reference_maps: list[torch.Tensor],
                            images: torch.Tensor) -> None:
    with torch.no_grad():
        for got, want in zip(ours(images), reference_maps):
            assert (got - want).abs().max() <= RELATIVE_TOLERANCE * want.abs().max()


def test_dinov2_hub_file_loads_as_timm_converts_it(caplog):
    """The official DINOv2 file with registers (``register_tokens``, a class-token row in the
    table, ``mask_token``) computes what timm computes from it after timm's own conversion;
    the mask token is left out with a log line naming it."""
    import timm
    from timm.models.vision_transformer import checkpoint_filter_fn
    reference = timm.create_model('vit_base_patch14_reg4_dinov2', num_classes=0, img_size=98,
                                  dynamic_img_size=True, **SMALL_TIMM).eval()
    timm_layout = perturbed(reference.state_dict(), .05)
    class_row = torch.randn(1, 1, 64)
    hub = {key: value for key, value in timm_layout.items()
           if key not in ('reg_token', 'cls_token', 'pos_embed')}
    hub.update(register_tokens=timm_layout['reg_token'],
               cls_token=timm_layout['cls_token'] - class_row,
               pos_embed=torch.cat([class_row, timm_layout['pos_embed']], dim=1),
               mask_token=torch.zeros(1, 64))
    reference.load_state_dict(checkpoint_filter_fn(dict(hub), reference))
    options = dict(patch_size=14, img_size=98, reg_tokens=4, no_embed_class=True,
                   layer_scale=1e-5)
    images = torch.randn(2, 3, 70, 126)
    classifier = ViT(SMALL, out_type='cls_token', **options).eval()
    classifier.load_state_dict(adapt_checkpoint(classifier, hub))
    with torch.no_grad():
        expected = reference.forward_features(images)[:, 0]
        assert (classifier(images)[0] - expected).abs().max() <= \
            RELATIVE_TOLERANCE * expected.abs().max()
    dense = ViT(SMALL, pyramid=False, out_indices=(0, 1, 2, 3), **options).eval()
    with mmengine_log_in(caplog):
        dense.load_state_dict(adapt_checkpoint(dense, hub))
    assert 'leaves out 1 checkpoint tensors' in caplog.text and 'mask_token' in caplog.text
    assert_block_maps_match(dense, reference.forward_intermediates(
        images, indices=[0, 1, 2, 3], norm=False, output_fmt='NCHW', intermediates_only=True),
        images)


def dinov2_positions(table: torch.Tensor, hw: tuple[int, int], antialias: bool,
                     offset: float) -> torch.Tensor:
    """DINOv2's ``interpolate_pos_encoding`` (facebookresearch/dinov2,
    ``dinov2/models/vision_transformer.py``), written from its code: the table (class row,
    then M x M patch rows) kept at its own grid, else the patch rows resampled by bicubic
    ``F.interpolate`` with the scale factor ``(side + offset) / M`` (the hub's files without
    registers: offset 0.1, no antialiasing) or, without offset, to the size (with registers:
    antialiased)."""
    side = math.isqrt(table.shape[1] - 1)
    if tuple(hw) == (side, side):
        return table
    grid = table[:, 1:].reshape(1, side, side, -1).permute(0, 3, 1, 2)
    resize = dict(scale_factor=((hw[0] + offset) / side, (hw[1] + offset) / side)) \
        if offset else dict(size=hw)
    grid = F.interpolate(grid, mode='bicubic', antialias=antialias, **resize)
    assert grid.shape[-2:] == hw
    return torch.cat([table[:, :1], grid.permute(0, 2, 3, 1).flatten(1, 2)], dim=1)


def dinov2_forward(reference: torch.nn.Module, hub: dict, images: torch.Tensor
                   ) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """DINOv2's forward (``prepare_tokens_with_masks``, its blocks, its norm) on the hub
    file ``hub``, with the blocks of timm's ViT (DINOv2's blocks: LayerScale, fused qkv):
    the normalised class token and every block's map of patches."""
    registers = hub.get('register_tokens')
    kernel = dict(antialias=True, offset=0.) if registers is not None else \
        dict(antialias=False, offset=.1)
    x = reference.patch_embed.proj(images)
    hw = tuple(x.shape[-2:])
    x = torch.cat([hub['cls_token'].expand(len(x), -1, -1), x.flatten(2).transpose(1, 2)], 1)
    x = x + dinov2_positions(hub['pos_embed'], hw, **kernel)
    if registers is not None:
        x = torch.cat([x[:, :1], registers.expand(len(x), -1, -1), x[:, 1:]], dim=1)
    maps = []
    for block in reference.blocks:
        x = block(x)
        maps.append(x[:, -hw[0] * hw[1]:].transpose(1, 2).reshape(len(x), -1, *hw))
    return reference.norm(x)[:, 0], maps


#: DINOv2's hub files: ViT-S/B/L/14 (an MLP), ViT-g/14 (xformers' fused SwiGLU, ``w12`` and
#: ``w3``), each without registers and with them
DINOV2_HUB_FILES = [('mlp', False), ('swiglu', False), ('mlp', True)]


@pytest.mark.parametrize('ffn,registers', DINOV2_HUB_FILES)
@pytest.mark.parametrize('image_hw', [(518, 518), (224, 224), (224, 308)])
def test_dinov2_hub_file_is_resampled_as_dinov2_resamples_it(ffn, registers, image_hw, caplog):
    """DINOv2's hub files, built as documented (``img_size=518``; ViT-g/14's SwiGLU as its
    advice names it), compute DINOv2's own forward at the file's size, at 224 and at a
    non-square size: the kernel of each hub file (offset scale factor without registers,
    antialiased with them) is read from the file's layout. Timm's antialiased kernel, the
    default for a file without registers, is off."""
    import timm
    giant = dict(mlp_ratio=340 / 64) if ffn == 'swiglu' else {}  # a hidden width of 170
    reference = timm.create_model(
        'vit_giant_patch14_dinov2' if ffn == 'swiglu' else 'vit_base_patch14_dinov2',
        num_classes=0, img_size=518, **SMALL_TIMM, **giant).eval()
    timm_layout = perturbed(reference.state_dict(), .05)
    reference.load_state_dict(timm_layout)
    hub = {key.replace('mlp.fc1.', 'mlp.w12.').replace('mlp.fc2.', 'mlp.w3.'): value
           for key, value in timm_layout.items()}
    hub['mask_token'] = torch.zeros(1, 64)
    options = dict(patch_size=14, img_size=518, layer_scale=1e-5)
    if ffn == 'swiglu':  # as the advice names them
        options.update(swiglu_mlp=True, mlp_ratio=170 / 64)
    if registers:
        hub['register_tokens'] = torch.randn(1, 4, 64, generator=torch.Generator().manual_seed(1))
        options.update(reg_tokens=4, no_embed_class=True)
    images = torch.randn(1, 3, *image_hw, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        class_token, maps = dinov2_forward(reference, hub, images)
    classifier = ViT(SMALL, out_type='cls_token', **options).eval()
    with mmengine_log_in(caplog):
        classifier.load_state_dict(adapt_checkpoint(classifier, hub))
    assert ('scale factor offset by 0.1' in caplog.text) is not registers
    with torch.no_grad():
        assert (classifier(images)[0] - class_token).abs().max() <= \
            RELATIVE_TOLERANCE * class_token.abs().max()
    dense = ViT(SMALL, pyramid=False, out_indices=(0, 1, 2, 3), **options).eval()
    dense.load_state_dict(adapt_checkpoint(dense, hub))
    assert_block_maps_match(dense, maps, images)
    if not registers and image_hw != (518, 518):
        timm_kernel = ViT(SMALL, pyramid=False, out_indices=(0,), pos_antialias=True,
                          **options).eval()
        timm_kernel.load_state_dict(adapt_checkpoint(timm_kernel, hub))
        with torch.no_grad():
            assert (timm_kernel(images)[0] - maps[0]).abs().max() > \
                100 * RELATIVE_TOLERANCE * maps[0].abs().max()


def test_dinov3_hub_file_loads_as_timm_converts_it():
    """The official DINOv3 layout (``storage_tokens``, ``ls1.gamma``, a fused qkv bias with
    its key part masked, the rotary periods, ``mask_token``) computes what timm computes
    from it after timm's own conversion."""
    import timm
    from timm.models.eva import checkpoint_filter_fn
    reference = timm.create_model('vit_small_patch16_dinov3_qkvb', num_classes=0,
                                  **SMALL_TIMM).eval()
    timm_layout = perturbed(reference.state_dict(), .05)
    hub = {}
    for key, value in timm_layout.items():
        if key.endswith('.attn.q_bias'):
            attn = key[:-len('.q_bias')]
            hub[f'{attn}.qkv.bias'] = torch.cat(
                [value, torch.randn_like(value), timm_layout[f'{attn}.v_bias']])
            hub[f'{attn}.qkv.bias_mask'] = torch.cat(
                [torch.ones_like(value), torch.zeros_like(value), torch.ones_like(value)])
        elif not key.endswith('.attn.v_bias'):
            key = key.replace('reg_token', 'storage_tokens').replace('gamma_1', 'ls1.gamma')
            hub[key.replace('gamma_2', 'ls2.gamma')] = value
    hub.update({'mask_token': torch.zeros(1, 64), 'rope_embed.periods': torch.ones(8)})
    reference.load_state_dict(checkpoint_filter_fn(dict(hub), reference))
    options = dict(table_options('vit_small_patch16_dinov3'), qkv_bias=True)
    images = torch.randn(2, 3, 96, 160)
    dense = ViT(SMALL, pyramid=False, out_indices=(0, 1, 2, 3), **options).eval()
    dense.load_state_dict(adapt_checkpoint(dense, hub))
    assert_block_maps_match(dense, reference.forward_intermediates(
        images, indices=[0, 1, 2, 3], norm=False, output_fmt='NCHW', intermediates_only=True),
        images)


def test_dinov3_7b_hub_layout_is_advised_its_swiglu_then_loads_as_timm_converts_it(caplog):
    """DINOv3 7B's hub layout (timm 1.0.31's ``vit_7b_patch16_dinov3`` at a small width): no
    qkv bias, a SwiGLU FFN of hidden width 2 x the width (``w1`` gate, ``w2``, ``w3``), the
    local crops' class norm ``local_cls_norm`` (training only), storage tokens. A DINOv3 ViT
    without SwiGLU refuses it, advising the FFN; with the advice it loads, the local norm
    left out (logged), and every block's map is timm's after timm's conversion."""
    import timm
    from timm.models.eva import checkpoint_filter_fn
    reference = timm.create_model('vit_7b_patch16_dinov3', num_classes=0, **SMALL_TIMM).eval()
    timm_layout = perturbed(reference.state_dict(), .05)
    assert 'blocks.0.mlp.fc1_g.weight' in timm_layout and \
        timm_layout['blocks.0.mlp.fc2.weight'].shape == (64, 128)
    generator = torch.Generator().manual_seed(3)
    hub = dinov3_hub_layout(timm_layout, (1 + .1 * torch.randn(64, generator=generator),
                                          .1 * torch.randn(64, generator=generator)))
    hub.update({'mask_token': torch.zeros(1, 64), 'rope_embed.periods': torch.ones(8)})
    reference.load_state_dict(checkpoint_filter_fn(dict(hub), reference))
    options = dict(table_options('vit_small_patch16_dinov3'), pyramid=False,
                   out_indices=(0, 1, 2, 3))
    with pytest.raises(ValueError, match=r"to load it: arch_overrides=dict\(swiglu_mlp=True, "
                                         r"mlp_ratio=2.0\)"):
        adapt_checkpoint(ViT(SMALL, **options), hub)
    dense = ViT(SMALL, swiglu_mlp=True, mlp_ratio=2., **options).eval()
    with mmengine_log_in(caplog):
        dense.load_state_dict(adapt_checkpoint(dense, hub))
    assert 'local_cls_norm' in caplog.text
    images = torch.randn(2, 3, 96, 160)
    assert_block_maps_match(dense, reference.forward_intermediates(
        images, indices=[0, 1, 2, 3], norm=False, output_fmt='NCHW', intermediates_only=True),
        images)


@pytest.mark.parametrize('out_type', ['cls_token', 'avg_featmap', 'featmap'])
def test_dinov3_untied_norms_load_as_dinov3_reads_them(out_type, caplog):
    """DINOv3 L SAT-493M's and 7B's hub files normalise the class token by ``cls_norm`` and
    the patches by ``norm`` (``local_cls_norm``: the local crops' in training, left out): the
    class token read by a classifier is DINOv3's ``cls_norm(x)[:, 0]``, the pooled patches
    and the blocks' maps are timm's with ``norm``."""
    import timm
    reference = timm.create_model('vit_small_patch16_dinov3', num_classes=0, global_pool='avg',
                                  **SMALL_TIMM).eval()
    timm_layout = perturbed(reference.state_dict(), .05)
    generator = torch.Generator().manual_seed(3)
    hub = {key.replace('reg_token', 'storage_tokens').replace('gamma_1', 'ls1.gamma')
              .replace('gamma_2', 'ls2.gamma'): value for key, value in timm_layout.items()}
    for norm in ('cls_norm', 'local_cls_norm'):
        hub.update({f'{norm}.weight': 1 + .1 * torch.randn(64, generator=generator),
                    f'{norm}.bias': .1 * torch.randn(64, generator=generator)})
    reference.load_state_dict(timm_layout)
    images = torch.randn(1, 3, 96, 160)
    ours = ViT(SMALL, out_type=out_type, pyramid=False, out_indices=(0, 1, 2, 3),
               **table_options('vit_small_patch16_dinov3')).eval()
    with mmengine_log_in(caplog):
        ours.load_state_dict(adapt_checkpoint(ours, hub))
    assert 'untied norms' in caplog.text and 'local_cls_norm' in caplog.text
    with torch.no_grad():
        if out_type == 'featmap':
            expected = reference.forward_intermediates(images, indices=[0, 1, 2, 3], norm=False,
                                                       output_fmt='NCHW',
                                                       intermediates_only=True)
            assert_block_maps_match(ours, expected, images)
            return
        if out_type == 'cls_token':
            reference.norm.load_state_dict({'weight': hub['cls_norm.weight'],
                                            'bias': hub['cls_norm.bias']})
            expected = reference.forward_features(images)[:, 0]
        else:
            expected = reference.forward_head(reference.forward_features(images),
                                              pre_logits=True)
        assert (ours(images)[0] - expected).abs().max() <= \
            RELATIVE_TOLERANCE * expected.abs().max()


@pytest.mark.parametrize('image_hw', [(224, 224), (192, 256)])
def test_sam_image_encoder_loads_into_the_vitdet_layout(image_hw):
    """SAM's image encoder as released (``image_encoder.``: a 4-D position table, ``mlp.lin``,
    relative position tables in windowed and global blocks; its neck, prompt encoder and
    mask decoder left out) is ViTDet's layout without class token: the blocks compute what
    timm's SAM ViT computes from the same file after timm's conversion."""
    import timm
    from timm.layers import resample_abs_pos_embed_nhwc
    from timm.models.vision_transformer_sam import checkpoint_filter_fn
    reference = timm.create_model('samvit_base_patch16', num_classes=0, img_size=224,
                                  window_size=4, global_attn_indexes=[1, 3],
                                  **SMALL_TIMM).eval()
    timm_layout = perturbed(reference.state_dict(), .05)
    released = {f'image_encoder.{key.replace("mlp.fc", "mlp.lin")}': value
                for key, value in timm_layout.items()}
    released.update({'prompt_encoder.point_embeddings.0.weight': torch.zeros(1, 256),
                     'mask_decoder.iou_token.weight': torch.zeros(1, 256)})
    reference.load_state_dict(checkpoint_filter_fn(dict(released), reference))
    ours = ViT(SMALL, img_size=224, class_token=False, window_size=4,
               window_block_indexes=[0, 2], use_rel_pos=True, pyramid=False,
               out_indices=(0, 1, 2, 3)).eval()
    ours.load_state_dict(adapt_checkpoint(ours, released))
    images = torch.randn(2, 3, *image_hw)
    with torch.no_grad():
        x = reference.patch_embed(images)
        x = x + resample_abs_pos_embed_nhwc(reference.pos_embed, x.shape[1:3])
        maps = []
        for block in reference.blocks:
            x = block(x)
            maps.append(x.permute(0, 3, 1, 2))
    assert_block_maps_match(ours, maps, images)


def test_deit_distilled_loads_its_distillation_token_as_a_register():
    """DeiT-distilled's distillation token is a prefix token with a position row, as a
    register of ``reg_tokens=1``: the class token (through the final norm) and every block's
    map are timm's."""
    import timm
    reference = timm.create_model('deit_tiny_distilled_patch16_224', num_classes=0,
                                  dynamic_img_size=True, **SMALL_TIMM).eval()
    state_dict = perturbed(reference.state_dict(), .05)
    reference.load_state_dict(state_dict)
    images = torch.randn(2, 3, 160, 224)
    classifier = ViT(SMALL, out_type='cls_token', reg_tokens=1).eval()
    classifier.load_state_dict(adapt_checkpoint(classifier, state_dict))
    with torch.no_grad():
        expected = reference.forward_features(images)[:, 0]
        assert (classifier(images)[0] - expected).abs().max() <= \
            RELATIVE_TOLERANCE * expected.abs().max()
    dense = ViT(SMALL, pyramid=False, out_indices=(0, 1, 2, 3), reg_tokens=1).eval()
    dense.load_state_dict(adapt_checkpoint(dense, state_dict))
    assert_block_maps_match(dense, reference.forward_intermediates(
        images, indices=[0, 1, 2, 3], norm=False, output_fmt='NCHW', intermediates_only=True),
        images)


@pytest.mark.parametrize('timm_name', ['beit_base_patch16_224', 'beit_large_patch16_224'])
def test_beit_computes_what_timm_computes(timm_name):
    result = compare_with_timm('vit', SMALL, timm_name, num_classes=10, perturbation=.05,
                               timm_kwargs=SMALL_TIMM, **table_options(timm_name))
    assert result['logit_rel_diff'] <= RELATIVE_TOLERANCE
    assert result['feature_rel_diff'] <= RELATIVE_TOLERANCE
    assert result['pyramid_rel_diff'] <= RELATIVE_TOLERANCE


@pytest.mark.parametrize('img_size', [224, (192, 288)])
def test_beit_tables_are_resampled_as_beit_does(img_size):
    """BEiT's relative tables for a 14 x 14 grid at a 12 x 18 input: timm resamples them
    when building the model for that size (``checkpoint_filter_fn``); ours resamples them in
    the forward pass of a model of the checkpoint's size, or when loading into a model of
    the input's size, with the same kernel."""
    import timm
    from timm.models.beit import checkpoint_filter_fn
    state_dict = perturbed(timm.create_model('beit_base_patch16_224', num_classes=0,
                                             **SMALL_TIMM).state_dict(), .05)
    reference = timm.create_model('beit_base_patch16_224', num_classes=0, img_size=(192, 288),
                                  **SMALL_TIMM).eval()
    reference.load_state_dict(checkpoint_filter_fn(dict(state_dict), reference))
    ours = ViT(SMALL, img_size=img_size, pyramid=False, out_indices=(0, 1, 2, 3),
               **table_options('beit_base_patch16_224')).eval()
    ours.load_state_dict(adapt_checkpoint(ours, state_dict))
    images = torch.randn(2, 3, 192, 288)
    assert_block_maps_match(ours, reference.forward_intermediates(
        images, indices=[0, 1, 2, 3], norm=False, output_fmt='NCHW', intermediates_only=True),
        images)


def test_beit_pretraining_table_is_shared_by_every_block():
    """BEiT's pretraining checkpoints hold one shared table: each block gets a copy."""
    import timm
    state_dict = timm.create_model('beit_base_patch16_224', num_classes=0,
                                   **SMALL_TIMM).state_dict()
    shared = torch.randn_like(state_dict['blocks.0.attn.relative_position_bias_table'])
    for key in [k for k in state_dict if 'relative_position_bias_table' in k]:
        del state_dict[key]
    state_dict['rel_pos_bias.relative_position_bias_table'] = shared
    model = ViT(SMALL, pyramid=False, **table_options('beit_base_patch16_224'))
    adapted = adapt_checkpoint(model, state_dict)
    for block in range(SMALL['num_layers']):
        assert torch.equal(adapted[f'blocks.{block}.attn.relative_position_bias.table'], shared)
    assert 'blocks.0.attn.relative_position_bias.table' in model.no_weight_decay()


def test_beit_v2_pretraining_file_leaves_out_its_class_token_head(caplog):
    """BEiT v2's pretraining file: one shared relative table, the MIM head and mask token,
    and the class-token pretraining head (``cls_pt_layers`` blocks, ``cls_pt_norm``,
    ``cls_pt_lm_head``), which the backbone's blocks do not feed: left out with a log line
    naming them; every block's map is timm's with the shared table in each block."""
    import timm
    reference = timm.create_model('beit_base_patch16_224', num_classes=0,
                                  **SMALL_TIMM).eval()
    timm_layout = perturbed(reference.state_dict(), .05)
    shared = torch.randn_like(timm_layout['blocks.0.attn.relative_position_bias_table'])
    pretraining = {key: value for key, value in timm_layout.items()
                   if 'relative_position_bias_table' not in key}
    for key in [k for k in timm_layout if 'relative_position_bias_table' in k]:
        timm_layout[key] = shared
    reference.load_state_dict(timm_layout)
    pretraining['rel_pos_bias.relative_position_bias_table'] = shared
    pretraining.update({key.replace('blocks.3.', 'cls_pt_layers.0.'): value.clone()
                        for key, value in pretraining.items() if key.startswith('blocks.3.')})
    pretraining.update({'cls_pt_norm.weight': torch.ones(64), 'cls_pt_norm.bias': torch.zeros(64),
                        'cls_pt_lm_head.weight': torch.zeros(8, 64), 'lm_head.weight':
                        torch.zeros(8, 64), 'mask_token': torch.zeros(1, 1, 64)})
    dense = ViT(SMALL, pyramid=False, out_indices=(0, 1, 2, 3),
                **table_options('beit_base_patch16_224')).eval()
    with mmengine_log_in(caplog):
        dense.load_state_dict(adapt_checkpoint(dense, pretraining))
    # the class-token head's 18 tensors (a block's 15, a norm's 2, a linear map), the MIM
    # head's map and the mask token
    assert 'leaves out 20 checkpoint tensors' in caplog.text and 'cls_pt_layers.0.' in caplog.text
    images = torch.randn(1, 3, 224, 224)
    assert_block_maps_match(dense, reference.forward_intermediates(
        images, indices=[0, 1, 2, 3], norm=False, output_fmt='NCHW', intermediates_only=True),
        images)


def test_deit3_official_parallel_file_loads_as_timms_parallel_blocks():
    """The official DeiT III parallel ViT (``Layer_scale_init_Block_paralx2``: ``norm11``,
    ``attn1``, ``gamma_1_1``, ``norm21``, ``mlp1``, ``gamma_2_1`` beside the first branch's
    modules; its table without the class row) loads with ``num_parallel=2,
    no_embed_class=True``: the class token and every block's map are timm's
    parallel blocks' (which compute what the official blocks compute)."""
    import timm
    reference = timm.create_model('vit_small_patch16_18x2_224', num_classes=0,
                                  no_embed_class=True, dynamic_img_size=True,
                                  **SMALL_TIMM).eval()
    timm_layout = perturbed(reference.state_dict(), .05)
    reference.load_state_dict(timm_layout)
    official = {}
    modules = {'attns.0.norm': 'norm1', 'attns.0.attn': 'attn', 'attns.0.ls.gamma': 'gamma_1',
               'attns.1.norm': 'norm11', 'attns.1.attn': 'attn1',
               'attns.1.ls.gamma': 'gamma_1_1', 'ffns.0.norm': 'norm2', 'ffns.0.mlp': 'mlp',
               'ffns.0.ls.gamma': 'gamma_2', 'ffns.1.norm': 'norm21', 'ffns.1.mlp': 'mlp1',
               'ffns.1.ls.gamma': 'gamma_2_1'}
    for key, value in timm_layout.items():
        for timm_name, official_name in modules.items():
            key = key.replace(f'.{timm_name}', f'.{official_name}')
        official[key] = value
    options = dict(table_options('vit_small_patch16_18x2_224'), depth=4, no_embed_class=True)
    images = torch.randn(1, 3, 160, 224)
    assert_file_computes_as_timm(official, options, reference, images)


#: timm's CLIP keys -> OpenAI's (``clip/model.py``'s ``VisionTransformer`` under ``visual.``)
OPENAI_CLIP_NAMES = {'patch_embed.proj.': 'conv1.', 'norm_pre.': 'ln_pre.', 'norm.': 'ln_post.',
                     'blocks.': 'transformer.resblocks.', '.norm1.': '.ln_1.',
                     '.norm2.': '.ln_2.', '.attn.qkv.': '.attn.in_proj_', '.attn.proj.':
                     '.attn.out_proj.', '.mlp.fc1.': '.mlp.c_fc.', '.mlp.fc2.': '.mlp.c_proj.'}


def openai_clip_state_dict(timm_layout: dict) -> dict:
    """OpenAI's CLIP state dict from timm's: the image tower under ``visual.`` (its class
    token and position table without the batch axis, ``in_proj_weight``), its projection, and
    a text tower's tensors."""
    released = {}
    for key, value in timm_layout.items():
        if key == 'cls_token':
            key, value = 'class_embedding', value.reshape(-1)
        elif key == 'pos_embed':
            key, value = 'positional_embedding', value[0]
        for timm_name, openai_name in OPENAI_CLIP_NAMES.items():
            key = key.replace(timm_name, openai_name) if timm_name[0] == '.' or \
                key.startswith(timm_name) else key
        released[f'visual.{key.replace("in_proj_.", "in_proj_")}'] = value
    width = timm_layout['cls_token'].shape[-1]
    released.update({'visual.proj': torch.randn(width, 16), 'logit_scale': torch.ones(()),
                     'token_embedding.weight': torch.randn(10, 32),
                     'positional_embedding': torch.randn(77, 32),
                     'transformer.resblocks.0.attn.in_proj_weight': torch.randn(96, 32),
                     'ln_final.weight': torch.ones(32), 'text_projection': torch.randn(32, 16)})
    return released


@pytest.mark.parametrize('image_hw', [(224, 224), (160, 160), (192, 288)])
def test_openai_clip_state_dict_loads_its_image_tower(image_hw):
    """OpenAI's CLIP state dict (``visual.*``: ``conv1``, ``class_embedding``,
    ``positional_embedding``, ``ln_pre``, ``transformer.resblocks`` of ``in_proj`` /
    ``c_fc`` / ``c_proj``, ``ln_post``) loads with CLIP's options and QuickGELU, its
    projection and text tower left out: the class token and every block's map are timm's
    (timm converts OpenAI's file to these tensors), at the file's size, another square size
    and a non-square one."""
    import timm
    reference = timm.create_model('vit_base_patch16_clip_quickgelu_224', num_classes=0,
                                  dynamic_img_size=True, **SMALL_TIMM).eval()
    timm_layout = perturbed(reference.state_dict(), .05)
    reference.load_state_dict(timm_layout)
    released = openai_clip_state_dict(timm_layout)
    options = table_options('vit_base_patch16_clip_quickgelu_224')
    images = torch.randn(1, 3, *image_hw)
    assert_file_computes_as_timm(released, options, reference, images)


#: timm's EVA-02 keys -> the official release's: B and L (``q_proj``, ``k_proj``, ``v_proj``
#: with q and v biases apart, SwiGLU ``w1``, ``w2``, ``ffn_ln``, ``w3``), Ti and S (a fused
#: ``qkv`` with q and v biases apart, xformers' packed SwiGLU ``w12``, ``w3``)
EVA02_RELEASE_KEYS = {'mlp.fc1_g': 'mlp.w1', 'mlp.fc1_x': 'mlp.w2', 'mlp.fc2': 'mlp.w3',
                      'mlp.norm': 'mlp.ffn_ln', 'mlp.fc1': 'mlp.w12',
                      'attn.q_proj.bias': 'attn.q_bias', 'attn.v_proj.bias': 'attn.v_bias'}


def eva02_release(timm_layout: dict, side: int, pretraining: bool) -> dict:
    """An official EVA-02 file from timm's state dict: fine-tuned (``fc_norm``, a head) or
    masked-image-modelling (``norm``, ``mask_token``, ``lm_head``), its rotary tables for the
    file's ``side`` x ``side`` grid and the 16 x 16 pretraining grid, once for the model and
    once per block, as the official model's state dict holds them."""
    released = {}
    for key, value in timm_layout.items():
        for timm_name, release_name in EVA02_RELEASE_KEYS.items():
            key = key.replace(timm_name + '.', release_name + '.')
        released[key.replace('fc_norm.', 'norm.') if pretraining else key] = value
    cos, sin = eva02_official_rotary_tables(SMALL['embed_dims'] // SMALL['num_heads'], 16, side)
    for prefix in [''] + [f'blocks.{i}.attn.' for i in range(SMALL['num_layers'])]:
        released.update({f'{prefix}rope.freqs_cos': cos, f'{prefix}rope.freqs_sin': sin})
    if pretraining:
        released.update(mask_token=torch.zeros(1, 1, 64), **{'lm_head.weight': torch.zeros(8, 64),
                                                             'lm_head.bias': torch.zeros(8)})
    else:
        released.update({'head.weight': torch.zeros(10, 64), 'head.bias': torch.zeros(10)})
    return released


@pytest.mark.parametrize('pretraining', [False, True])
@pytest.mark.parametrize('timm_name', ['eva02_base_patch14_224', 'eva02_small_patch14_336',
                                       'eva02_large_patch14_448'])
def test_eva02_official_release_computes_what_timm_computes(timm_name, pretraining, caplog):
    """EVA-02's official files (fine-tuned and masked-image-modelling; B / L and Ti / S
    layouts) load with ``ViT.timm_models``' options and the file's ``img_size``: their rotary
    tables are checked against the model's and dropped with a log line, and every block's map
    is timm's, at the file's size, 224 and a non-square size."""
    import timm
    options = table_options(timm_name)
    reference = timm.create_model(timm_name, num_classes=0, dynamic_img_size=True,
                                  **SMALL_TIMM).eval()
    timm_layout = perturbed(reference.state_dict(), .05)
    reference.load_state_dict(timm_layout)
    side = options['img_size'] // 14 if 'img_size' in options else 16
    released = eva02_release(timm_layout, side, pretraining)
    dense = ViT(SMALL, pyramid=False, out_indices=(0, 1, 2, 3), **options).eval()
    with mmengine_log_in(caplog):
        dense.load_state_dict(adapt_checkpoint(dense, released))
    assert 'rotary tables' in caplog.text and 'dropped' in caplog.text
    for image_hw in [(side * 14, side * 14), (224, 224), (196, 280)]:
        images = torch.randn(1, 3, *image_hw)
        assert_block_maps_match(dense, reference.forward_intermediates(
            images, indices=[0, 1, 2, 3], norm=False, output_fmt='NCHW',
            intermediates_only=True), images)


def test_eva02_rotary_grid_is_read_from_the_files_tables():
    """A model built for the file's size without ``ref_feat_shape`` (its reference grid then
    the 24 x 24 of 336 px) is refused, the advice naming the 16 x 16 that EVA-02's tables in
    the file are built for; tables no grid of the model computes are refused, not dropped."""
    import timm
    state_dict = timm.create_model('eva02_small_patch14_336', num_classes=0,
                                   **SMALL_TIMM).state_dict()
    released = eva02_release(state_dict, 24, pretraining=False)
    options = dict(table_options('eva02_small_patch14_336'), ref_feat_shape=None)
    with pytest.raises(ValueError, match=r'to load it: ref_feat_shape=\(16, 16\) \(the '
                                         r'reference grid of the checkpoint\'s EVA-02 rotary'):
        adapt_checkpoint(ViT(SMALL, pyramid=False, **options), released)
    adapt_checkpoint(ViT(SMALL, pyramid=False, **dict(options, ref_feat_shape=(16, 16))), 
        released)
    released['blocks.1.attn.rope.freqs_sin'] = released['blocks.1.attn.rope.freqs_sin'] + 1e-3
    with pytest.raises(ValueError, match=r'unexpected: (.|\n)*rope.freqs_'):
        adapt_checkpoint(ViT(SMALL, pyramid=False, **table_options('eva02_small_patch14_336')), 
            released)


def test_patch_projection_is_resampled_only_where_asked():
    """EVA-02's detectors take its 14-px kernels at 16 px: ``resample_patch_embed=True``
    resamples them (timm's kernel); without it the other kernel size is refused."""
    import timm
    from timm.layers import resample_patch_embed
    state_dict = timm.create_model('eva02_base_patch14_224', num_classes=0,
                                   **SMALL_TIMM).state_dict()
    options = dict(table_options('eva02_base_patch14_224'), patch_size=16,
                   ref_feat_shape=(16, 16))
    with pytest.raises(ValueError, match='patch_embed.proj.weight'):
        adapt_checkpoint(ViT(SMALL, pyramid=False, **options), state_dict)
    model = ViT(SMALL, pyramid=False, resample_patch_embed=True, **options)
    adapted = adapt_checkpoint(model, state_dict)
    assert torch.equal(adapted['patch_embed.proj.weight'], resample_patch_embed(
        state_dict['patch_embed.proj.weight'], [16, 16]))


@pytest.mark.parametrize('timm_name', ['samvit_base_patch16', 'samvit_large_patch16'])
def test_sam_sizes_compute_what_timm_computes(timm_name):
    """SAM B / L as ViT's table builds them (windows in all but the global blocks, relative
    positions, no class token), at a small width and depth: every block's map is timm's."""
    options = table_options(timm_name)
    assert options['window_size'] == 14 and not options['class_token']
    options.update(img_size=224, window_size=4, window_block_indexes=(0, 2))
    result = compare_with_timm('vit', SMALL, timm_name, num_classes=10, image_hw=(192, 256),
                               perturbation=.05, **options,
                               timm_kwargs=dict(SMALL_TIMM, img_size=224, window_size=4,
                                                global_attn_indexes=[1, 3]))
    assert result['logit_rel_diff'] is None  # its head reads SAM's neck, which ViT leaves out
    assert result['feature_rel_diff'] <= RELATIVE_TOLERANCE
    assert result['pyramid_rel_diff'] <= RELATIVE_TOLERANCE
