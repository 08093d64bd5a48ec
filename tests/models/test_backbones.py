"""The four backbones: sizes, parity with timm, dense mode, training modes, bad input."""
import inspect
import pydoc

import pytest
import torch

from vitdense.analysis.timm_parity import compare_with_timm, count_parameters
from vitdense.models import CaiT, ColumnarBackbone, ConViT, ViT, XCiT, backbone_families

from common import (TINY_ARCH, TINY_BACKBONES, TINY_CONVIT_ARCH, arch_reads_while_building,
                    options_missing_from_signature)

TOLERANCE = 1e-4
# small custom archs for shape / training-mode tests
TINY = {ViT: TINY_ARCH, CaiT: TINY_ARCH, XCiT: TINY_ARCH, ConViT: TINY_CONVIT_ARCH}
FAMILIES = list(TINY)


def tiny(cls, **kwargs):
    return cls(TINY[cls], out_indices=[0, 1, 2, 3], **kwargs)


@pytest.mark.parametrize('cls,arch,kwargs,timm_name,paper', [
    (XCiT, 'small_12', {}, 'xcit_small_12_p16_224', 'XCiT Table 1: 26M'),
    (CaiT, 'xxs24', {}, 'cait_xxs24_224', 'CaiT Table 3: 12.0M'),
    (ConViT, 'small', {}, 'convit_small', 'ConViT Table 1: 27M'),
    (ViT, 'small', dict(depth=18, num_parallel=2, layer_scale=1e-5),
     'vit_small_patch16_18x2_224', 'Three things Table 4: ViT-S18x2, its count not printed'),
])
def test_parameter_counts_are_timms(cls, arch, kwargs, timm_name, paper):
    """With a 1000-class linear head, as many parameters as timm's model of the paper
    (both built on the meta device: shapes only); the papers print them rounded (``paper``)."""
    import timm
    with torch.device('meta'):
        model = cls(arch, out_type='cls_token', **kwargs)
        reference = timm.create_model(timm_name, num_classes=1000)
    total = count_parameters(model) + model.embed_dims * 1000 + 1000
    assert total == count_parameters(reference), paper


@pytest.mark.parametrize('family,arch,kwargs,timm_name,image_hw', [
    ('xcit', 'nano_12', {}, 'xcit_nano_12_p16_224', None),
    ('xcit', 'nano_12', dict(patch_size=8), 'xcit_nano_12_p8_224', None),
    ('xcit', 'nano_12', {}, 'xcit_nano_12_p16_224', (160, 256)),
    ('cait', 'xxs24', {}, 'cait_xxs24_224', None),
    ('convit', 'tiny', {}, 'convit_tiny', None),
    ('vit', 'tiny', {}, 'vit_tiny_patch16_224', None),
    ('vit', 'tiny', {}, 'vit_tiny_patch16_224', (160, 256)),
    ('vit', 'small', dict(depth=18, num_parallel=2, layer_scale=1e-5),
     'vit_small_patch16_18x2_224', None),
])
def test_numerical_parity_with_timm(family, arch, kwargs, timm_name, image_hw):
    result = compare_with_timm(family, arch, timm_name, image_hw=image_hw, **kwargs)
    assert result['params_ours'] == result['params_timm']
    assert result['logit_diff'] <= TOLERANCE
    assert result['feature_diff'] <= TOLERANCE


DENSE_CASES = [(16, hw) for hw in [(224, 224), (512, 512), (800, 1216), (333, 517)]] + \
    [(8, hw) for hw in [(224, 224), (333, 517)]]


@pytest.mark.parametrize('cls', FAMILIES)
@pytest.mark.parametrize('patch_size,image_hw', DENSE_CASES)
def test_dense_outputs_have_strides_4_to_32(cls, patch_size, image_hw):
    model = tiny(cls, patch_size=patch_size).eval()
    with torch.no_grad():
        outs = model(torch.randn(1, 3, *image_hw))
    assert [tuple(o.shape) for o in outs] == [
        (1, 32, -(-image_hw[0] // s), -(-image_hw[1] // s)) for s in (4, 8, 16, 32)]


@pytest.mark.parametrize('cls', FAMILIES)
@pytest.mark.parametrize('levels', [(1, 2, 3), (2, 3), (0,)])
def test_pyramid_gives_the_levels_asked_for(cls, levels):
    """3-level necks (DINO's ChannelMapper, RTMDet's CSPNeXtPAFPN) take strides 8-32: the
    chosen levels are those of the full pyramid, from XCiT's blocks for those levels."""
    full = cls(TINY[cls]).eval()
    part = cls(TINY[cls], pyramid_levels=levels).eval()
    assert part.out_indices == tuple(full.out_indices[level] for level in levels)
    assert [name for name, _ in part.pyramid.named_children()] == [
        f'fpn{level + 1}' for level in levels]
    own = part.state_dict()
    part.load_state_dict({k: v for k, v in full.state_dict().items() if k in own})
    image = torch.randn(1, 3, 72, 100)
    with torch.no_grad():
        expected, outs = full(image), part(image)
    assert len(outs) == len(levels)
    for level, out in zip(levels, outs):
        torch.testing.assert_close(out, expected[level], rtol=0, atol=0)


@pytest.mark.parametrize('cls', FAMILIES)
def test_columnar_maps_without_pyramid(cls):
    model = cls(TINY[cls], out_indices=[1, 3], pyramid=False).eval()
    outs = model(torch.randn(2, 3, 100, 70))
    assert [tuple(o.shape) for o in outs] == [(2, 32, 7, 5)] * 2


@pytest.mark.parametrize('cls', FAMILIES)
@pytest.mark.parametrize('pyramid', [True, False])
def test_dense_maps_are_contiguous_nchw(cls, pyramid):
    """Heads that read raw buffers (mmcv's RoIAlign) need standard NCHW maps: the token
    maps are channels-last views, and a Mask R-CNN on them pooled scrambled RoI features."""
    model = tiny(cls, pyramid=pyramid).eval()
    outs = model(torch.randn(2, 3, 96, 80))
    assert all(out.is_contiguous() for out in outs)


@pytest.mark.parametrize('cls,kwargs', [(cls, {}) for cls in FAMILIES] + [
    (ViT, dict(num_parallel=2, layer_scale=0.1))])
@pytest.mark.parametrize('out_type', ['featmap', 'cls_token'])
def test_inference_writing_into_branch_outputs_gives_the_same_bits(cls, kwargs, out_type):
    """Without gradients, residual sums, LayerScale and GELU reuse their sub-block's
    output buffer: every dense map and class token must equal the autograd path's exactly
    (a block overwriting tokens that an earlier map still views would show up here)."""
    model = cls(TINY[cls], out_indices=[0, 1, 2, 3], out_type=out_type, pyramid=False,
                **kwargs).eval()
    for module in model.modules():  # BN / LayerScale at non-trivial values
        if isinstance(module, torch.nn.BatchNorm2d):
            module.running_mean.uniform_(-1, 1)
    image = torch.randn(2, 3, 64, 48)
    with torch.enable_grad():
        reference = model(image)
    assert all(out.requires_grad for out in reference)
    with torch.no_grad():
        inferred = model(image.clone())
    assert all(torch.equal(a, b) for a, b in zip(inferred, reference))


def test_padding_does_not_leak_into_the_valid_region_of_a_cropped_image():
    """An image that is a multiple of the patch size is unaffected by how it was padded."""
    model = tiny(XCiT, pyramid=False).eval()
    image = torch.randn(1, 3, 64, 96)
    assert model(image)[0].shape[-2:] == (4, 6)
    outs = model(torch.randn(1, 3, 65, 96))
    assert outs[0].shape[-2:] == (5, 6)


@pytest.mark.parametrize('cls', FAMILIES)
def test_gradient_reaches_every_parameter(cls):
    # seeded: a block whose branches drop path drops for every image gets no gradient
    torch.manual_seed(0)
    model = tiny(cls, drop_path_rate=0.1).train()
    loss = sum(o.square().mean() for o in model(torch.randn(2, 3, 64, 48)))
    loss.backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or not p.grad.any()]
    assert not missing


@pytest.mark.parametrize('cls', FAMILIES)
@pytest.mark.parametrize('out_type', ['cls_token', 'avg_featmap'])
def test_classification_mode_returns_a_vector(cls, out_type):
    model = cls(TINY[cls], out_type=out_type).eval()
    (feature,) = model(torch.randn(3, 3, 64, 64))
    assert feature.shape == (3, 32)


@pytest.mark.parametrize('cls', FAMILIES)
def test_frozen_stages_keep_embedding_and_first_blocks_fixed(cls):
    model = tiny(cls, frozen_stages=2).train()
    frozen = {n: p.clone() for n, p in model.named_parameters()
              if n.startswith(('patch_embed', 'pos_embed', 'blocks.0.', 'blocks.1.'))}
    assert frozen and all(not model.get_parameter(n).requires_grad for n in frozen)
    assert all(p.requires_grad for n, p in model.named_parameters()
               if n.startswith('blocks.2.'))
    assert not model.patch_embed.training and model.blocks[2].training
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1.)
    sum(o.mean() for o in model(torch.randn(2, 3, 64, 64))).backward()
    optimizer.step()
    assert all(torch.equal(model.get_parameter(n), p) for n, p in frozen.items())


@pytest.mark.parametrize('cls', FAMILIES)
def test_frozen_stages_zero_freezes_the_embeddings_only(cls):
    model = tiny(cls, frozen_stages=0)
    assert not any(p.requires_grad for p in model.patch_embed.parameters())
    assert all(p.requires_grad for p in model.blocks.parameters())
    assert all(p.requires_grad for p in tiny(cls, frozen_stages=-1).parameters())


@pytest.mark.parametrize('cls,frozen_stages,out_type', [
    (ViT, -1, 'featmap'), (ViT, 0, 'featmap'),
    (ConViT, 1, 'featmap'), (ConViT, 2, 'featmap'),
    (CaiT, 3, 'cls_token'), (CaiT, 4, 'cls_token'), (XCiT, 4, 'cls_token'),
])
def test_frozen_stages_freeze_the_class_token_once_they_reach_where_it_joins(
        cls, frozen_stages, out_type):
    """The class token is frozen with the stages before it joins: ViT's at block 0 (with
    the embeddings), ConViT's after its 2 GPSA blocks, CaiT's and XCiT's after the 4-block
    trunk (mmpretrain's XCiT rule); a frozen one keeps its value through a training step."""
    model = tiny(cls, frozen_stages=frozen_stages, out_type=out_type).train()
    frozen = frozen_stages >= model.class_token_layer
    assert model.cls_token.requires_grad is not frozen
    before = model.cls_token.detach().clone()
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1.)
    sum(o.square().mean() for o in model(torch.randn(2, 3, 64, 64))).backward()
    optimizer.step()
    assert torch.equal(model.cls_token, before) is frozen


@pytest.mark.parametrize('cls,out_indices', [(ViT, [0, 3]), (ConViT, [2, 3])])
def test_output_cls_token_pairs_each_map_with_its_blocks_class_token(cls, out_indices):
    """Each dense output is (the map it is without the option, the class token row of the
    block's output), as mmseg's VisionTransformer hands them out."""
    torch.manual_seed(0)
    model = cls(TINY[cls], out_indices=out_indices, pyramid=False,
                output_cls_token=True).eval()
    maps_only = cls(TINY[cls], out_indices=out_indices, pyramid=False).eval()
    maps_only.load_state_dict(model.state_dict())
    block_outputs = {}
    for index in out_indices:
        model.blocks[index].register_forward_hook(
            lambda module, args, output, index=index: block_outputs.update({index: output}))
    image = torch.randn(2, 3, 64, 96)
    with torch.no_grad():
        outputs, expected_maps = model(image), maps_only(image)
    assert len(outputs) == len(out_indices)
    for (feature_map, cls_token), expected, index in zip(outputs, expected_maps, out_indices):
        assert feature_map.shape == (2, 32, 4, 6) and cls_token.shape == (2, 32)
        assert torch.equal(feature_map, expected)
        assert torch.equal(cls_token, block_outputs[index][:, 0])


@pytest.mark.parametrize('cls,kwargs,match', [
    (CaiT, {}, 'dense trunk of CaiT carries no class token'),
    (XCiT, {}, 'dense trunk of XCiT carries no class token'),
    (ViT, dict(dense_class_token=False), 'dense trunk of ViT carries no class token'),
    (ConViT, dict(out_indices=[1, 3]),
     r'ConViT joins before block 2, so block 1 of out_indices \[1, 3\] has none'),
    (ViT, dict(pyramid=True, out_indices=[0, 1, 2, 3]),
     "needs out_type='featmap' and pyramid=False"),
    (ViT, dict(out_type='cls_token'), "needs out_type='featmap' and pyramid=False"),
])
def test_output_cls_token_is_refused_where_a_probed_block_has_no_class_token(
        cls, kwargs, match):
    options = dict(out_indices=[2, 3], pyramid=False, output_cls_token=True)
    with pytest.raises(ValueError, match=match):
        cls(TINY[cls], **{**options, **kwargs})


@pytest.mark.parametrize('cls', FAMILIES)
def test_every_family_takes_depth_and_layer_scale_alike(cls):
    arch = {('depth' if k == 'num_layers' else k): v for k, v in TINY[cls].items()}
    assert cls(arch, out_indices=[0, 1, 2, 3]).num_layers == 4
    model = cls(TINY[cls], depth=5, layer_scale=0.25, out_indices=[0, 1, 2, 4])
    assert len(model.blocks) == 5
    assert torch.all(model.blocks[0].ls1.gamma == 0.25)
    assert torch.equal(cls(dict(TINY[cls], layer_scale=0.25), out_indices=[0, 1, 2, 3])
                       .blocks[0].ls1.gamma, model.blocks[0].ls1.gamma)
    with pytest.raises(KeyError, match='depth and num_layers both given'):
        cls(dict(arch, num_layers=4))
    with pytest.raises(KeyError, match=r"unknown arch settings \['embed_dim'\] in "
                                       r"arch_overrides; allowed: \['embed_dims'"):
        tiny(cls, arch_overrides=dict(embed_dim=64))


def test_norm_eval_keeps_batch_norms_in_eval_mode():
    model = tiny(XCiT, norm_eval=True).train()
    norms = [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert norms and not any(m.training for m in norms)
    assert model.blocks[0].training


@pytest.mark.parametrize('with_cp', [True, 2])
@pytest.mark.parametrize('cls', FAMILIES)
def test_activation_checkpointing_gives_the_same_output_and_gradients(cls, with_cp):
    torch.manual_seed(0)
    plain = tiny(cls, pyramid_norm_cfg=dict(type='GN', num_groups=4)).train()
    checkpointed = tiny(cls, pyramid_norm_cfg=dict(type='GN', num_groups=4), with_cp=with_cp)
    assert checkpointed.checkpointed_blocks == set(range(4 if with_cp is True else with_cp))
    checkpointed.load_state_dict(plain.state_dict())
    checkpointed.train()
    # BatchNorm statistics change in train mode; compare with BN layers in eval mode
    for model in (plain, checkpointed):
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.eval()
    image = torch.randn(2, 3, 64, 64)
    outs = [model(image) for model in (plain, checkpointed)]
    for a, b in zip(*outs):
        assert torch.allclose(a, b, atol=1e-6)
    for model, out in zip((plain, checkpointed), outs):
        sum(o.sum() for o in out).backward()
    for (name, p), q in zip(plain.named_parameters(), checkpointed.parameters()):
        assert torch.allclose(p.grad, q.grad, atol=1e-5), name


def test_layer_depth_and_no_weight_decay():
    model = tiny(ViT, layer_scale=1e-5)
    assert model.get_layer_depth('backbone.patch_embed.proj.weight', 'backbone.') == (0, 6)
    assert model.get_layer_depth('backbone.cls_token', 'backbone.') == (0, 6)
    assert model.get_layer_depth('backbone.blocks.2.attn.qkv.weight', 'backbone.') == (3, 6)
    assert model.get_layer_depth('backbone.pyramid.fpn1.0.weight', 'backbone.') == (5, 6)
    no_decay = model.no_weight_decay()
    assert {'cls_token', 'pos_embed.weight', 'blocks.0.ls1.gamma'} <= no_decay
    assert not any('qkv' in n for n in no_decay)
    assert {'blocks.0.attn.temperature'} <= tiny(XCiT).no_weight_decay()
    assert {'blocks.0.attn.gating'} <= tiny(ConViT).no_weight_decay()


def test_arch_tables_and_custom_dicts():
    assert XCiT.resolve_arch('medium_24')['embed_dims'] == 512
    assert CaiT.resolve_arch('s36')['num_heads'] == 8
    assert CaiT.resolve_arch('xxs36')['layer_scale'] == 1e-6
    assert ConViT.resolve_arch('base_plus')['embed_dims'] == 1024
    assert ConViT.resolve_arch(dict(embed_dims=64, num_layers=3, num_heads=4))[
        'num_local_layers'] == 10
    assert len(ViT('tiny', depth=6).blocks) == 6
    assert XCiT('nano_12').out_indices == (3, 5, 7, 11)
    assert XCiT(dict(TINY[XCiT], num_layers=24)).out_indices == (7, 11, 15, 23)


def test_bad_arguments_name_the_problem():
    with pytest.raises(KeyError, match="unknown XCiT arch 'small_13'"):
        XCiT('small_13')
    with pytest.raises(KeyError, match=r"missing keys \['num_heads'\]"):
        ViT(dict(embed_dims=32, num_layers=2))
    with pytest.raises(IndexError, match='block 12 out of range for 12 blocks'):
        XCiT('nano_12', out_indices=[3, 5, 7, 12])
    with pytest.raises(ValueError, match=r"pyramid's 4 levels \(strides 4/8/16/32"):
        XCiT('nano_12', out_indices=[3, 5])
    with pytest.raises(ValueError, match=r"pyramid's 3 levels \(strides 8/16/32.*got 4"):
        XCiT('nano_12', out_indices=[3, 5, 7, 11], pyramid_levels=(1, 2, 3))
    for levels in [(0, 4), (2, 1), (1, 1), ()]:
        with pytest.raises(ValueError, match=r'increasing, unique indices into the strides'):
            XCiT('nano_12', pyramid_levels=levels)
    with pytest.raises(ValueError, match="pyramid_levels .* but pyramid=False"):
        XCiT('nano_12', out_indices=[11], pyramid=False, pyramid_levels=(1, 2, 3))
    with pytest.raises(ValueError, match='unknown out_type'):
        XCiT('nano_12', out_type='logits')
    with pytest.raises(ValueError, match='power-of-two patch size'):
        ViT('tiny', patch_size=14)
    with pytest.raises(ValueError, match=r'num_local_layers must be in \[0, num_layers\)'):
        ConViT(dict(TINY[ConViT], num_local_layers=4))
    with pytest.raises(ValueError, match='with_cp must be True, False or a number of blocks'):
        tiny(ViT, with_cp=-1)
    with pytest.raises(ValueError, match=r'pretrained=.* and init_cfg=.* both given'):
        tiny(XCiT, pretrained='xcit.pth', init_cfg=dict(type='Pretrained', checkpoint='a.pth'))
    with pytest.raises(TypeError, match='pretrained must be a checkpoint path'):
        tiny(XCiT, pretrained=dict(checkpoint='xcit.pth'))
    model = tiny(ConViT)
    with pytest.raises(ValueError, match=r'images of shape \(B, 3, H, W\), got \(1, 1, 32, 32\)'):
        model(torch.randn(1, 1, 32, 32))


def test_mmseg_pretrained_becomes_the_pretrained_init_cfg(tmp_path):
    """mmseg's EncoderDecoder hands its model-level ``pretrained`` to the backbone, as to
    mmseg's own VisionTransformer: it loads as ``init_cfg`` Pretrained would, with a warning."""
    source = tiny(XCiT)
    torch.save(source.state_dict(), tmp_path / 'xcit.pth')
    with pytest.warns(FutureWarning, match="read as init_cfg=dict\\(type='Pretrained'"):
        model = tiny(XCiT, pretrained=str(tmp_path / 'xcit.pth'))
    assert model.init_cfg == dict(type='Pretrained', checkpoint=str(tmp_path / 'xcit.pth'))
    model.init_weights()
    for name, tensor in source.state_dict().items():
        torch.testing.assert_close(model.state_dict()[name], tensor, rtol=0, atol=0)


@pytest.mark.parametrize('depth', [1, 2, 3])
def test_a_classifier_of_fewer_than_four_blocks_builds_and_a_pyramid_asks_for_levels(depth):
    """The default ``out_indices`` (ends of the four quarters) name each block once: a
    shallow classifier builds; a dense pyramid's four levels need four blocks or fewer
    levels, and the error says so."""
    model = ViT(TINY_ARCH, depth=depth, out_type='cls_token').eval()
    assert model.out_indices == tuple(range(depth))
    with torch.no_grad():
        assert model(torch.randn(1, 3, 32, 32))[0].shape == (1, TINY_ARCH['embed_dims'])
    with pytest.raises(ValueError, match=rf"pyramid's 4 levels .* got {depth}: .*set "
                                         r'pyramid_levels'):
        ViT(TINY_ARCH, depth=depth)
    levels = tuple(range(4 - depth, 4))
    assert ViT(TINY_ARCH, depth=depth, pyramid_levels=levels).out_indices == tuple(range(depth))


@pytest.mark.parametrize('name', sorted(backbone_families()))
def test_the_signature_names_every_option_the_family_reads(name):
    family = backbone_families()[name]
    parameters = inspect.signature(family).parameters
    assert not options_missing_from_signature(family, TINY_BACKBONES[name]['arch'])
    assert not arch_reads_while_building(family, TINY_BACKBONES[name]['arch'])
    # the base's options too, each with a default, none hidden in **kwargs
    assert set(inspect.signature(ColumnarBackbone.__init__).parameters) - {'self'} <= \
        set(parameters)
    assert all(p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.default is not p.empty
               for p in parameters.values())


def test_a_family_whose_options_are_no_keywords_or_read_from_the_arch_dict_is_found():
    # one declared in arch_defaults, one that a variant alone sets and a builder reads back
    # from the settings dict, not its attribute
    class Hidden(XCiT):
        arch_zoo = {'mini': dict(TINY_BACKBONES['xcit']['arch'], read_ratio=2.)}
        arch_defaults = dict(XCiT.arch_defaults, declared_ratio=2.)

        def build_block(self, index: int, drop_path: float):
            assert self.arch['read_ratio'] == self.read_ratio == 2.
            return super().build_block(index, drop_path)

    assert options_missing_from_signature(Hidden, 'mini') == {'declared_ratio', 'read_ratio'}
    assert arch_reads_while_building(Hidden, 'mini') == {'read_ratio'}


def test_help_shows_the_family_options():
    assert 'rope: Optional[str] = None' in pydoc.render_doc(ViT)
    assert 'patch_size: int = 16' in pydoc.render_doc(ViT)
