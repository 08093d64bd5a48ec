"""Loading is exact or refused: every tensor the model builds comes from the checkpoint and
every checkpoint tensor is used, or the load raises naming what the checkpoint is and the
option that would load it."""
import ast
import re
from typing import Optional

import pytest
import torch
from timm.models.vision_transformer import VisionTransformer

from vitdense.models import CaiT, ConViT, ViT, XCiT, adapt_checkpoint
from vitdense.models.backbones.checkpoint_diagnosis import forward_refusal

from common import (TINY_ARCH, TINY_BACKBONES, TINY_CONVIT_ARCH, assert_features_match,
                    dinov3_hub_layout, eva02_official_rotary_tables, perturb_)

FAMILIES = dict(vit=ViT, cait=CaiT, xcit=XCiT, convit=ConViT)


def _pretrained(cls, arch, path, prefix=None, truncate=None, **kwargs):
    init_cfg = dict(type='Pretrained', checkpoint=str(path), prefix=prefix)
    if truncate is not None:
        init_cfg['truncate'] = truncate
    model = cls(arch, init_cfg=init_cfg, **kwargs)
    model.init_weights()
    return model.eval()


def _timm_vit(**options) -> VisionTransformer:
    """A tiny timm ViT (the layout of DINOv2, DeiT III, MAE by ``options``), perturbed."""
    torch.manual_seed(0)
    return perturb_(VisionTransformer(img_size=64, patch_size=16, embed_dim=32, depth=4,
                                      num_heads=2, num_classes=10, **options))


def _dense_reference(reference: VisionTransformer, images: torch.Tensor) -> list:
    return reference.forward_intermediates(images, indices=[0, 1, 2, 3], norm=False,
                                           output_fmt='NCHW', intermediates_only=True)


def test_layer_scale_checkpoint_needs_layer_scale_then_loads_exactly(tmp_path):
    """DINOv2's layout (LayerScale) into a ViT built without it was a silent partial load."""
    reference = _timm_vit(init_values=1e-5)
    path = tmp_path / 'dinov2_like.pth'
    torch.save(reference.state_dict(), path)
    with pytest.raises(ValueError, match=r'dinov2_like.pth: checkpoint does not match ViT'
                                         r'(.|\n)*checkpoint: ViT, depth 4, width 32, with '
                                         r'LayerScale(.|\n)*to load it: layer_scale=1e-5'):
        _pretrained(ViT, TINY_ARCH, path, img_size=64, pyramid=False)
    ours = _pretrained(ViT, TINY_ARCH, path, img_size=64, pyramid=False,
                       out_indices=(0, 1, 2, 3), layer_scale=1.)
    images = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        assert_features_match(ours(images), _dense_reference(reference, images))


def test_a_deeper_or_shallower_checkpoint_names_the_arch_and_truncation():
    """CaiT XXS24 into XXS36 and XCiT T12 into T24 left the extra blocks random."""
    with torch.device('meta'):
        cait24, cait36 = CaiT('xxs24'), CaiT('xxs36')
        xcit12, xcit24 = XCiT('tiny_12'), XCiT('tiny_24')
    with pytest.raises(ValueError, match=r"216 missing(.|\n)*checkpoint: CaiT, depth 24, "
                                         r"width 192(.|\n)*to load it: arch='xxs24'"):
        adapt_checkpoint(cait36, cait24.state_dict())
    with pytest.raises(ValueError, match=r"to load it: arch='xxs36'; or load its first 24 "
                                         r"blocks: init_cfg=dict\(type='Pretrained', ..., "
                                         r"truncate=True\)"):
        adapt_checkpoint(cait24, cait36.state_dict())
    with pytest.raises(ValueError, match=r"324 missing(.|\n)*to load it: arch='tiny_12'"):
        adapt_checkpoint(xcit24, xcit12.state_dict())


def test_a_shallower_vit_is_refused_and_truncation_is_explicit(tmp_path):
    torch.manual_seed(0)
    six, twelve = ViT(TINY_ARCH, depth=6), ViT(TINY_ARCH, depth=12)
    path = tmp_path / 'vit6.pth'
    torch.save(six.state_dict(), path)
    with pytest.raises(ValueError, match=r'0 unexpected(.|\n)*to load it: depth=6\n'):
        _pretrained(ViT, TINY_ARCH, path, depth=12)
    path = tmp_path / 'vit12.pth'
    torch.save(twelve.state_dict(), path)
    with pytest.raises(ValueError, match=r'to load it: depth=12; or load its first 6 blocks'):
        _pretrained(ViT, TINY_ARCH, path, depth=6)
    truncated = _pretrained(ViT, TINY_ARCH, path, depth=6, truncate=True)
    for key, value in truncated.state_dict().items():
        assert key.startswith('pyramid.') or torch.equal(value, twelve.state_dict()[key]), key


def test_a_cait_checkpoint_is_refused_by_a_vitdet_layout_vit():
    """ViTDet's ViT (no class token in the trunk) dropped CaiT's talking heads and
    LayerScale as unexpected."""
    cait = CaiT(TINY_ARCH, out_type='cls_token')
    vitdet = ViT(TINY_ARCH, dense_class_token=False, window_size=2, use_rel_pos=True)
    with pytest.raises(ValueError, match=r"checkpoint: CaiT, depth 4(.|\n)*to load it: a CaiT "
                                         r"backbone \(type='vitdense.CaiT'\)"):
        adapt_checkpoint(vitdet, cait.state_dict())


def test_mae_fine_tuned_layout_needs_fc_norm_then_loads_exactly(tmp_path):
    """timm's ``global_pool='avg'`` with ``fc_norm`` normalises the averaged tokens: its
    ``fc_norm`` was dropped without a word."""
    reference = _timm_vit(global_pool='avg', fc_norm=True)
    path = tmp_path / 'mae_finetuned.pth'
    torch.save(reference.state_dict(), path)
    with pytest.raises(ValueError, match=r"fc_norm after pooling(.|\n)*to load it: out_type="
                                         r"'avg_featmap', fc_norm=True"):
        _pretrained(ViT, TINY_ARCH, path, img_size=64, out_type='avg_featmap')
    with pytest.raises(ValueError, match=r"fc_norm normalises averaged tokens"):
        ViT(TINY_ARCH, out_type='cls_token', fc_norm=True)
    ours = _pretrained(ViT, TINY_ARCH, path, img_size=64, out_type='avg_featmap',
                       fc_norm=True)
    images = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        expected = reference.forward_head(reference.forward_features(images), pre_logits=True)
        assert_features_match(ours(images), [expected])
        dense = _pretrained(ViT, TINY_ARCH, path, img_size=64, pyramid=False,
                            out_indices=(0, 1, 2, 3))
        assert_features_match(dense(images), _dense_reference(reference, images))


@pytest.mark.parametrize('family', FAMILIES)
def test_a_missing_trunk_tensor_or_an_extra_block_is_refused(family):
    """No silent partial load: one trunk tensor removed, or one block more than the
    model has, raises for every family."""
    torch.manual_seed(0)
    cfg = {k: v for k, v in TINY_BACKBONES[family].items() if k != 'type'}
    model = FAMILIES[family](**cfg, out_type='cls_token')
    complete = model.state_dict()
    assert adapt_checkpoint(model, dict(complete)).keys() == complete.keys()
    removed = dict(complete)
    del removed['blocks.1.mlp.fc1.weight']
    with pytest.raises(ValueError, match=r'1 missing, 0 unexpected(.|\n)*no option of '
                                         r'(.|\n)*missing: blocks.1.mlp.fc1.weight'):
        adapt_checkpoint(model, removed)
    depth = model.num_layers
    extra = dict(complete, **{re.sub(r'^blocks\.\d+\.', f'blocks.{depth}.', k): v
                              for k, v in complete.items() if k.startswith(f'blocks.{depth - 1}.')})
    with pytest.raises(ValueError, match=rf'0 missing, \d+ unexpected(.|\n)*depth {depth + 1}'
                                         rf'(.|\n)*unexpected: blocks.{depth}.'):
        adapt_checkpoint(model, extra)


# ---------------------------------------------------------------- advice that loads
ADVICE = re.compile(r'to load it: (.*)')
PRETRAINED_KEY = re.compile(r"init_cfg=dict\(type='Pretrained', \.\.\., (\w+)=(.+?)\)")


def apply_advice(message: str, options: dict, init_cfg: dict) -> tuple[dict, dict]:
    """The constructor options and ``Pretrained`` entry after each option of the error's
    "to load it:" line, applied as written (the first of alternatives joined by ' or ';
    the items that start with 'or', and the explanation in parentheses, left out); ``arch_overrides`` merged with those given."""
    options, init_cfg = dict(options), dict(init_cfg)
    for item in ADVICE.search(message).group(1).split('; '):
        if item.startswith('or '):  # an alternative to the option before
            continue
        written = item.split(' or ')[0]
        key = PRETRAINED_KEY.match(written)
        if key:
            init_cfg[key.group(1)] = ast.literal_eval(key.group(2))
            options.pop('pretrained', None)  # mmseg's model-level option: None, as advised
            continue
        for name, value in eval(f'dict({re.sub(r" [(].*[)]$", "", written)})').items():
            options[name] = ({**options.get(name, {}), **value} if name == 'arch_overrides'
                             else value)
    return options, init_cfg


def _timm_source(cls_name: str = 'VisionTransformer', **options) -> torch.nn.Module:
    import timm.models
    cls = dict(VisionTransformer=VisionTransformer,
               Distilled=timm.models.deit.VisionTransformerDistilled,
               Cait=timm.models.cait.Cait, Xcit=timm.models.xcit.Xcit,
               ConVit=timm.models.convit.ConVit)[cls_name]
    torch.manual_seed(0)
    shape = dict(img_size=64, patch_size=16, embed_dim=32, depth=4, num_heads=2,
                 num_classes=10)
    if cls_name == 'ConVit':  # timm's ConViT takes embed_dim per head
        shape.update(embed_dim=8, num_heads=4)
    return perturb_(cls(**{**shape, **options}))


def _mmpretrain_source(backbone_type: str = 'VisionTransformer', **options) -> dict:
    """A whole mmpretrain ImageClassifier's state dict."""
    from mmpretrain.models import ImageClassifier
    torch.manual_seed(0)
    arch = dict(embed_dims=32, num_layers=4, num_heads=2, feedforward_channels=128)
    backbone = dict(type=backbone_type, arch=arch, **{'img_size': 64, 'patch_size': 16,
                                                      **options})
    head = dict(type='VisionTransformerClsHead', num_classes=10, in_channels=32)
    return perturb_(ImageClassifier(backbone=backbone, head=head)).state_dict()


def _mmseg_source() -> dict:
    """A whole mmseg EncoderDecoder's state dict: its ViT under ``backbone.``."""
    from mmseg.models.backbones import VisionTransformer as MMSegViT
    torch.manual_seed(0)
    vit = perturb_(MMSegViT(img_size=64, embed_dims=32, num_layers=4, num_heads=2))
    return {**{f'backbone.{k}': v for k, v in vit.state_dict().items()},
            'decode_head.conv_seg.weight': torch.randn(10, 32, 1, 1)}


def _ours_source(**options) -> dict:
    """Our own detector's checkpoint: ``backbone.``, ``neck.``, ``rpn_head.``."""
    torch.manual_seed(0)
    vit = perturb_(ViT(TINY_ARCH, img_size=64, **DENSE, **options))
    return {**{f'backbone.{k}': v for k, v in vit.state_dict().items()},
            'neck.lateral_convs.0.conv.weight': torch.randn(8, 32, 1, 1),
            'rpn_head.rpn_cls.weight': torch.randn(3, 8, 1, 1)}


def _dinov2_hub_source() -> dict:
    """The official DINOv2 hub layout with registers: ``register_tokens`` (without position
    rows), a table with the class token's row, ``mask_token``."""
    state_dict = _timm_source(patch_size=14, img_size=56, init_values=1e-5).state_dict()
    generator = torch.Generator().manual_seed(1)
    return dict(state_dict, register_tokens=torch.randn(1, 4, 32, generator=generator),
                mask_token=torch.randn(1, 32, generator=generator))


def _dinov2_giant_hub_source() -> dict:
    """The official DINOv2-g hub layout: xformers' packed SwiGLU (``mlp.w12``, ``mlp.w3``),
    LayerScale ``ls1.gamma``, the class row in the table, ``mask_token``."""
    state_dict = _timm_published('vit_giant_patch14_dinov2', img_size=56).state_dict()
    generator = torch.Generator().manual_seed(1)
    return dict({key.replace('mlp.fc1.', 'mlp.w12.').replace('mlp.fc2.', 'mlp.w3.'): value
                 for key, value in state_dict.items()},
                mask_token=torch.randn(1, 32, generator=generator))


def _dinov3_7b_hub_source() -> dict:
    """DINOv3 7B's hub layout (timm's ``vit_7b_patch16_dinov3``): storage tokens,
    ``ls1.gamma``, SwiGLU ``w1`` / ``w2`` / ``w3``, the local crops' ``local_cls_norm``."""
    return dinov3_hub_layout(_timm_published('vit_7b_patch16_dinov3', img_size=64).state_dict(),
                             (torch.ones(32), torch.zeros(32)))


def _eva02_official_source() -> dict:
    """EVA-02 S's official fine-tuned layout at 84 px (fused ``qkv`` with ``q_bias`` /
    ``v_bias``, xformers' packed SwiGLU ``w12`` / ``w3``), pretrained on a 4 x 4 grid: its
    rotary tables, once for the model and once per block, show that grid."""
    state_dict = _timm_published('eva02_small_patch14_336', img_size=84,
                                 ref_feat_shape=(4, 4)).state_dict()
    released = {key.replace('mlp.fc1.', 'mlp.w12.').replace('mlp.fc2.', 'mlp.w3.'): value
                for key, value in state_dict.items()}
    cos, sin = eva02_official_rotary_tables(16, 4, 6)
    for prefix in [''] + [f'blocks.{i}.attn.' for i in range(4)]:
        released.update({f'{prefix}rope.freqs_cos': cos, f'{prefix}rope.freqs_sin': sin})
    return released


def _timm_published(name: str, **options) -> torch.nn.Module:
    """A tiny perturbed timm model of a published source's architecture (``name``)."""
    import timm
    torch.manual_seed(0)
    return perturb_(timm.create_model(name, embed_dim=32, depth=4, num_heads=2,
                                      num_classes=10, **options))


CLS, DENSE = dict(out_type='cls_token'), dict(pyramid=False, out_indices=(0, 1, 2, 3))
AVG = dict(out_type='avg_featmap')
# name: (the checkpoint's state dict, family, options of the model that refuses it, the
# options its advice must name)
ADVICE_CASES = {
    **{f'timm-layer-scale-{m}': (lambda: _timm_source(init_values=1e-5), ViT, mode,
                                 ['layer_scale=']) for m, mode in (('cls', CLS), ('dense', DENSE))},
    **{f'timm-deit3-{m}': (lambda: _timm_source(init_values=1e-5, no_embed_class=True), ViT,
                           mode, ['layer_scale=', 'no_embed_class=True'])
       for m, mode in (('cls', CLS), ('dense', DENSE))},
    **{f'timm-dinov2-reg4-{m}': (
        lambda: _timm_source(patch_size=14, img_size=56, init_values=1e-5,
                             no_embed_class=True, reg_tokens=4), ViT, dict(mode, img_size=56),
        ['patch_size=14', 'layer_scale=', 'reg_tokens=4', 'no_embed_class=True'])
       for m, mode in (('cls', CLS), ('dense', DENSE))},
    **{f'dinov2-hub-reg4-{m}': (_dinov2_hub_source, ViT, dict(mode, img_size=56),
                                ['patch_size=14', 'layer_scale=', 'reg_tokens=4',
                                 'no_embed_class=True'])
       for m, mode in (('cls', CLS), ('dense', DENSE))},
    **{f'timm-no-qkv-bias-{m}': (lambda: _timm_source(qkv_bias=False), ViT, mode,
                                 ['qkv_bias=False']) for m, mode in (('cls', CLS), ('dense', DENSE))},
    **{f'timm-patch8-{m}': (lambda: _timm_source(patch_size=8), ViT, mode, ['patch_size=8'])
       for m, mode in (('cls', CLS), ('dense', DENSE))},
    'timm-deeper-dense': (lambda: _timm_source(depth=6), ViT, DENSE, ['depth=6']),
    'timm-shallower-cls': (lambda: _timm_source(depth=3), ViT, CLS, ['depth=3']),
    'timm-no-class-token-dense': (lambda: _timm_source(class_token=False, global_pool='avg'),
                                  ViT, DENSE, ['dense_class_token=False']),
    'timm-no-class-token-cls': (lambda: _timm_source(class_token=False, global_pool='avg'),
                                ViT, CLS, ["class_token=False, out_type='avg_featmap'"]),
    'timm-mae-fine-tuned-cls': (lambda: _timm_source(global_pool='avg', fc_norm=True), ViT,
                                CLS, ["out_type='avg_featmap', fc_norm=True"]),
    'timm-cait-one-class-layer': (lambda: _timm_source('Cait', depth_token_only=1), CaiT,
                                  CLS, ['num_cls_layers=1']),
    'timm-cait-no-qkv-bias-dense': (lambda: _timm_source('Cait', qkv_bias=False), CaiT, DENSE,
                                    ['qkv_bias=False']),
    'timm-xcit-one-class-layer': (lambda: _timm_source('Xcit', cls_attn_layers=1), XCiT, CLS,
                                  ['num_cls_layers=1']),
    'timm-convit-local-layers-cls': (lambda: _timm_source('ConVit', local_up_to_layer=1),
                                     ConViT, dict(CLS, arch=TINY_CONVIT_ARCH),
                                     ['num_local_layers=1']),
    'timm-convit-qkv-bias-dense': (lambda: _timm_source('ConVit', local_up_to_layer=2,
                                                        qkv_bias=True),
                                   ConViT, dict(DENSE, arch=TINY_CONVIT_ARCH),
                                   ['qkv_bias=True']),
    **{f'mmpretrain-vit-whole-{m}': (_mmpretrain_source, ViT, mode, ["prefix='backbone.'"])
       for m, mode in (('cls', CLS), ('dense', DENSE))},
    'mmpretrain-deit3-whole-cls': (lambda: _mmpretrain_source('DeiT3'), ViT, CLS,
                                   ["prefix='backbone.'", 'layer_scale=',
                                    'no_embed_class=True']),
    'mmpretrain-vit-no-qkv-bias-whole-dense': (
        lambda: _mmpretrain_source(qkv_bias=False), ViT, DENSE,
        ["prefix='backbone.'", 'qkv_bias=False']),
    'mmpretrain-mae-fine-tuned-cls': (
        lambda: _mmpretrain_source(final_norm=False, out_type='avg_featmap'), ViT,
        dict(CLS, init_cfg=dict(prefix='backbone.')),
        ["out_type='avg_featmap', fc_norm=True"]),
    'mmpretrain-vit-patch8-whole-cls': (
        lambda: _mmpretrain_source(patch_size=8), ViT, CLS,
        ["prefix='backbone.'", 'patch_size=8']),
    'mmseg-encoder-decoder-dense': (_mmseg_source, ViT, dict(DENSE, norm_eps=1e-5),
                                    ["prefix='backbone.'"]),
    'mmseg-model-level-pretrained-dense': (_mmseg_source, ViT,
                                           dict(DENSE, norm_eps=1e-5, pretrained=True),
                                           ["prefix='backbone.'"]),
    'ours-detector-dense': (_ours_source, ViT, DENSE, ["prefix='backbone.'"]),
    'ours-layer-scale-detector-dense': (lambda: _ours_source(layer_scale=.1), ViT, DENSE,
                                        ["prefix='backbone.'", 'layer_scale=']),
    # the sources of ViT's options, into a plain ViT; trained at their own size (EVA-02's
    # rotary reference grid the model's, as the published 224-px models' 16 x 16), read by
    # the class token (DINOv3: timm's default pools the patches, which no tensor shows)
    **{f'timm-eva02-small-{m}': (
        lambda: _timm_published('eva02_small_patch14_224', img_size=56, ref_feat_shape=(4, 4)),
        ViT, dict(mode, img_size=56),
        ['patch_size=14', 'swiglu_mlp=True', 'mlp_ratio=2.65625', "rope='eva02'"] + extra)
       for m, mode, extra in (('cls', CLS, ["out_type='avg_featmap', fc_norm=True"]),
                              ('dense', DENSE, []))},
    'timm-eva02-base-dense': (
        lambda: _timm_published('eva02_base_patch14_224', img_size=56, ref_feat_shape=(4, 4)),
        ViT, dict(DENSE, img_size=56), ['swiglu_mlp=True', "rope='eva02'", 'scale_mlp=True']),
    **{f'timm-dinov3-{m}': (
        lambda: _timm_published('vit_small_patch16_dinov3', img_size=64, global_pool='token'),
        ViT, mode, ['layer_scale=', 'reg_tokens=4', 'qkv_bias=False', "pos_embed='none'",
                    "rope='dinov3'", 'norm_eps=1e-05'])
       for m, mode in (('cls', CLS), ('dense', DENSE))},
    **{f'timm-clip-{m}': (lambda: _timm_published('vit_base_patch16_clip_224', img_size=64),
                          ViT, mode, ['pre_norm=True', 'norm_eps=1e-05'])
       for m, mode in (('cls', CLS), ('dense', DENSE))},
    **{f'timm-beit-{m}': (lambda: _timm_published('beit_base_patch16_224', img_size=64), ViT,
                          mode, ['layer_scale=', 'use_rel_pos_bias=True', "pos_embed='none'"])
       for m, mode in (('cls', CLS), ('dense', DENSE))},
    'timm-siglip-dense': (lambda: _timm_published('vit_base_patch16_siglip_224', img_size=64),
                          ViT, DENSE, ['dense_class_token=False']),
    # timm's res-post-norm ViT: no class token, no qkv bias, norms after its branches,
    # which the order of its keys shows
    **{f'timm-rpn-{m}': (
        lambda: _timm_published('vit_base_patch16_rpn_224', img_size=64), ViT, mode,
        ['qkv_bias=False', 'res_post_norm=True'] + extra)
       for m, mode, extra in (('cls', CLS, ["class_token=False, out_type='avg_featmap'",
                                            'fc_norm=True']),
                              ('dense', DENSE, ['dense_class_token=False']))},
    # its tensors with their keys sorted (as safetensors writes them): the block kind,
    # which no tensor shows, named as a choice
    'timm-rpn-sorted-dense': (
        lambda: dict(sorted(_timm_published('vit_base_patch16_rpn_224', img_size=64)
                            .state_dict().items())), ViT, DENSE,
        ['qkv_bias=False', 'dense_class_token=False',
         'res_post_norm=True or res_post_norm=False']),
    # the other sources whose refusal advises: DeiT-distilled (read as a state dict: its
    # classifier averages two tokens), OpenAI's CLIP (QuickGELU, which no tensor shows: the
    # load alone is checked), a hidden width whose ratio truncates, deeper and shallower
    # CaiT and XCiT trunks (timm's XCiT: tokens_norm=False), the official hub files of
    # DINOv2-g (fused SwiGLU) and DINOv3 7B (SwiGLU, local_cls_norm), read as state dicts
    'timm-deit-distilled-cls': (lambda: _timm_source('Distilled').state_dict(), ViT, CLS,
                                ['reg_tokens=1']),
    'timm-openai-clip-dense': (
        lambda: _timm_published('vit_base_patch16_clip_quickgelu_224', img_size=64)
        .state_dict(), ViT, DENSE, ['pre_norm=True', "act_layer='quick_gelu'"]),
    'timm-mlp-hidden-115-cls': (
        lambda: _timm_source(embed_dim=112, depth=1, mlp_ratio=(115 + 1e-9) / 112), ViT,
        dict(CLS, arch=dict(embed_dims=112, num_layers=1, num_heads=2)), ['mlp_ratio=']),
    'timm-cait-deeper-cls': (lambda: _timm_source('Cait', depth=6), CaiT, CLS, ['depth=6']),
    'timm-xcit-shallower-cls': (lambda: _timm_source('Xcit', depth=3), XCiT,
                                dict(CLS, tokens_norm=False), ['depth=3']),
    'dinov2-hub-giant-layout-dense': (_dinov2_giant_hub_source, ViT, dict(DENSE, img_size=56),
                                      ['patch_size=14', 'layer_scale=', 'swiglu_mlp=True']),
    'dinov3-7b-hub-layout-cls': (_dinov3_7b_hub_source, ViT, CLS,
                                 ['layer_scale=', 'reg_tokens=4', 'qkv_bias=False',
                                  'swiglu_mlp=True', 'mlp_ratio=2.0', "rope='dinov3'"]),
    # an official EVA-02 file above its pretraining size: the rotary reference grid, which
    # its rotary tables show, is named with the options its tensors and layout imply
    'eva02-official-above-pretraining-size-dense': (
        _eva02_official_source, ViT, dict(DENSE, img_size=84),
        ['patch_size=14', 'swiglu_mlp=True', "rope='eva02'", 'ref_feat_shape=(4, 4)']),
}


@pytest.mark.parametrize('case', ADVICE_CASES)
def test_every_refusal_names_every_option_and_its_advice_applied_as_written_loads(
        case, tmp_path):
    """Sources (timm, mmpretrain, mmseg, ours; classifier and dense) x options that differ:
    the load is refused, the "to load it:" line names each differing option, and building the
    model with the advice as written loads the checkpoint strictly: every model tensor from
    the checkpoint, every checkpoint tensor used."""
    source, family, options, named = ADVICE_CASES[case]
    checkpoint = source()
    state_dict = checkpoint if isinstance(checkpoint, dict) else checkpoint.state_dict()
    path = tmp_path / f'{case}.pth'
    torch.save(state_dict, path)
    options = {'arch': TINY_ARCH, 'img_size': 64, **options}
    init_cfg = dict(type='Pretrained', checkpoint=str(path), **options.pop('init_cfg', {}))
    if options.get('pretrained'):
        options['pretrained'], init_cfg = str(path), None

    def build(options: dict, init_cfg: Optional[dict]) -> torch.nn.Module:
        options = dict(options)
        model = family(options.pop('arch'), init_cfg=init_cfg, **options)
        model.init_weights()
        return model.eval()

    with pytest.raises(ValueError) as refused:
        build(options, init_cfg)
    advice = ADVICE.search(str(refused.value)).group(1)
    for option in named:
        assert option in advice, (option, str(refused.value))
    options, init_cfg = apply_advice(str(refused.value), options,
                                     init_cfg or dict(type='Pretrained', checkpoint=str(path)))
    model = build(options, init_cfg)
    if isinstance(checkpoint, torch.nn.Module):
        images = torch.randn(2, 3, options['img_size'], options['img_size'])
        with torch.no_grad():
            if model.out_type != 'featmap':
                expected = [checkpoint.forward_head(checkpoint.forward_features(images),
                                                    pre_logits=True)]
            else:
                expected = _dense_reference(checkpoint, images)
            assert_features_match(model(images), expected)


def test_a_distilled_deit_loads_its_distillation_token_as_a_register(tmp_path):
    """DeiT distilled's table has two prefix rows, for its class and distillation tokens: the
    distillation token is a register with a position row, and the advice names
    ``reg_tokens=1``, which loads it."""
    path = tmp_path / 'deit_distilled.pth'
    torch.save(_timm_source('Distilled').state_dict(), path)
    with pytest.raises(ValueError, match=r'to load it: reg_tokens=1'):
        _pretrained(ViT, TINY_ARCH, path, img_size=64, out_type='cls_token')
    model = _pretrained(ViT, TINY_ARCH, path, img_size=64, out_type='cls_token', reg_tokens=1)
    assert model.reg_token.shape == (1, 1, TINY_ARCH['embed_dims'])


def test_openai_clip_advice_names_the_activation_no_tensor_shows(tmp_path):
    """OpenAI's CLIP weights have OpenCLIP's tensors but QuickGELU: the advice loads them and
    names ``act_layer='quick_gelu'``, with which the maps are timm's; without it they are
    not (the activation is a choice the checkpoint cannot make)."""
    source = _timm_published('vit_base_patch16_clip_quickgelu_224', img_size=64)
    path = tmp_path / 'clip_openai.pth'
    torch.save(source.state_dict(), path)
    with pytest.raises(ValueError, match=r"to load it: pre_norm=True, norm_eps=1e-05 \(.*"
                                         r"act_layer='quick_gelu'") as refused:
        _pretrained(ViT, TINY_ARCH, path, img_size=64, **DENSE)
    options, _ = apply_advice(str(refused.value), DENSE, {})
    images = torch.randn(2, 3, 64, 64)
    expected = _dense_reference(source, images)
    with torch.no_grad():
        assert_features_match(_pretrained(ViT, TINY_ARCH, path, img_size=64,
                                          act_layer='quick_gelu', **options)(images), expected)
        with pytest.raises(AssertionError):
            assert_features_match(_pretrained(ViT, TINY_ARCH, path, img_size=64,
                                              **options)(images), expected)


def test_a_mechanism_no_option_builds_is_refused_by_name(tmp_path):
    """The rope-mixed ViT's learned frequencies were dropped as a pretraining tensor: it is
    refused, naming what no option builds, and no option is advised."""
    mixed = tmp_path / 'rope_mixed.pth'
    torch.save(_timm_published('vit_small_patch16_rope_mixed_224', img_size=64).state_dict(),
               mixed)
    with pytest.raises(ValueError, match=r'no option of ViT loads it: the checkpoint has '
                                         r'learned rotary frequencies(.|\n)*unexpected: '
                                         r'rope.freqs'):
        _pretrained(ViT, TINY_ARCH, mixed, img_size=64, pos_embed='none', rope='eva02',
                    layer_scale=1e-5, **DENSE)


def test_the_order_of_a_files_keys_tells_res_post_norm_blocks(tmp_path):
    """timm's res-post-norm ViT has a plain ViT's tensors, its blocks' keys saved ``attn``
    before ``norm1``: a pre-norm model refuses it, advising ``res_post_norm=True``, and a
    res-post-norm model refuses a pre-norm file, advising ``res_post_norm=False``, and loads
    its own; a file whose keys are sorted shows no order and loads into the kind chosen."""
    options = dict(img_size=64, qkv_bias=False, dense_class_token=False, **DENSE)
    rpn = _timm_published('vit_base_patch16_rpn_224', img_size=64).state_dict()
    plain = _timm_source(qkv_bias=False, class_token=False, global_pool='avg').state_dict()
    for state_dict, ours, advice in ((rpn, False, 'res_post_norm=True'),
                                     (plain, True, 'res_post_norm=False')):
        path = tmp_path / f'{advice}.pth'
        torch.save(state_dict, path)
        with pytest.raises(ValueError, match=rf'to load it: {advice} \(the file\'s blocks '
                                             rf'normalise the (outputs|inputs) of attention'):
            _pretrained(ViT, TINY_ARCH, path, res_post_norm=ours, **options)
        path = tmp_path / f'sorted-{advice}.pth'
        torch.save(dict(sorted(state_dict.items())), path)
        _pretrained(ViT, TINY_ARCH, path, res_post_norm=ours, **options)
    ours = ViT(TINY_ARCH, res_post_norm=True, **options)
    assert adapt_checkpoint(ours, ours.state_dict()).keys() == ours.state_dict().keys()


def test_a_sorted_res_post_norm_file_is_refused_until_the_block_kind_is_chosen(tmp_path):
    """safetensors sorts a file's keys: timm's res-post-norm tensors (no class token, no qkv
    bias or LayerScale) then show no block kind, and a model not given ``res_post_norm``
    refuses them, naming it; the advice applied as written computes timm's maps at the
    file's size and a non-square one. A plain timm ViT's safetensors file (class token, qkv
    bias) and a sorted file into a model given the kind load without it."""
    from safetensors.torch import save_file
    rpn = _timm_published('vit_base_patch16_rpn_224', img_size=64, dynamic_img_size=True)
    path = tmp_path / 'rpn.safetensors'
    save_file(rpn.state_dict(), path)
    options = dict(img_size=64, qkv_bias=False, dense_class_token=False, **DENSE)
    with pytest.raises(ValueError, match=r'to load it: res_post_norm=True or res_post_norm='
                                         r'False \(whether the blocks normalise the outputs '
                                         r'or the inputs') as refused:
        _pretrained(ViT, TINY_ARCH, path, **options)
    advised, _ = apply_advice(str(refused.value), options, {})
    assert advised['res_post_norm'] is True
    model = _pretrained(ViT, TINY_ARCH, path, **advised)
    for size in ((64, 64), (48, 80)):
        images = torch.randn(2, 3, *size)
        with torch.no_grad():
            assert_features_match(model(images), _dense_reference(rpn, images))
    _pretrained(ViT, TINY_ARCH, path, res_post_norm=False, **options)
    plain = tmp_path / 'plain.safetensors'
    save_file(_timm_source().state_dict(), plain)
    _pretrained(ViT, TINY_ARCH, plain, img_size=64, **DENSE)


def test_an_advice_that_does_not_load_is_not_printed(tmp_path):
    """The advice is checked before it is printed: a LayerScale checkpoint with a tensor no
    option builds is refused without advising ``layer_scale`` (with which it would still be
    refused), naming that tensor."""
    state_dict = _timm_source(init_values=1e-5).state_dict()
    state_dict['blocks.0.attn.talking.weight'] = torch.zeros(2, 2)
    path = tmp_path / 'unknown.pth'
    torch.save(state_dict, path)
    with pytest.raises(ValueError, match=r"to load it: no option of ViT loads it: the options "
                                         r"its tensors imply \(layer_scale=1e-5 .*\) leave it "
                                         r"refused; tensors no option builds: "
                                         r"blocks.0.attn.talking.weight\n"):
        _pretrained(ViT, TINY_ARCH, path, img_size=64, **CLS)


@pytest.mark.parametrize('broken', ['silenced', 'not-finite'])
def test_an_advice_whose_model_does_not_compute_with_the_file_is_not_printed(
        broken, tmp_path):
    """Before it is printed, the advised model is built with the file's tensors and run on a
    small image: a LayerScale file whose first attention branch is scaled to zero loads into
    it exactly, but that branch's tensors have no effect, and a file with a NaN computes no
    finite output; each is refused without the advice, naming what fails."""
    state_dict = _timm_source(init_values=1e-5).state_dict()
    if broken == 'silenced':
        state_dict['blocks.0.ls1.gamma'] = torch.zeros(32)
        failure = (r'6 of its tensors have no effect on the forward: blocks.0.attn.proj.bias, '
                   r'blocks.0.attn.proj.weight, blocks.0.attn.qkv.bias, '
                   r'blocks.0.attn.qkv.weight, blocks.0.norm1.bias, blocks.0.norm1.weight\n')
    else:
        state_dict['blocks.2.mlp.fc1.weight'][0, 0] = float('nan')
        failure = r'its forward is not finite\n'
    path = tmp_path / f'{broken}.pth'
    torch.save(state_dict, path)
    with pytest.raises(ValueError, match=r"to load it: no option of ViT loads it: the options "
                                         r"its tensors imply \(layer_scale=1e-5 .*\) load it, "
                                         r"but " + failure):
        _pretrained(ViT, TINY_ARCH, path, img_size=64, **CLS)


@pytest.mark.parametrize('family', FAMILIES)
@pytest.mark.parametrize('dtype', [torch.bfloat16, torch.float16])
def test_the_advice_check_computes_on_a_half_precision_files_own_tensors(family, dtype):
    """A 16-bit file (a 7B model's: 14 GB in bfloat16) is checked in bfloat16 on its own
    tensors, not on a float32 copy twice their size: every family's model takes them
    without a copy (bfloat16) and computes with all of them; a file whose branch is
    silenced is still named."""
    options = dict(arch=TINY_BACKBONES[family]['arch'], img_size=64, **DENSE)
    torch.manual_seed(0)
    saved = {k: v.to(dtype) if v.is_floating_point() else v for k, v in
             perturb_(FAMILIES[family](**options)).state_dict().items()}
    with torch.device('meta'):
        model = FAMILIES[family](**options)
    assert forward_refusal(model, saved) is None
    taken = model.state_dict()
    for key, tensor in saved.items():
        if dtype == torch.bfloat16 and tensor.is_floating_point():
            assert taken[key].data_ptr() == tensor.data_ptr(), key
    silenced = {k: torch.zeros_like(v) if k.startswith('blocks.1.mlp.fc2.') else v
                for k, v in saved.items()}
    with torch.device('meta'):
        model = FAMILIES[family](**options)
    assert re.match(r'\d+ of its tensors have no effect on the forward: .*blocks\.1\.mlp\.fc1',
                    forward_refusal(model, silenced))


def test_an_mlp_width_whose_ratio_truncates_is_advised_a_ratio_that_builds_it(tmp_path):
    """Width 112, hidden 115: 115 / 112 times 112 is 114.99... and ``int`` of it 114, so the
    advised ``mlp_ratio`` is the next float up, which builds 115 and loads."""
    torch.manual_seed(0)
    source = perturb_(VisionTransformer(img_size=64, patch_size=16, embed_dim=112, depth=1,
                                        num_heads=2, num_classes=10,
                                        mlp_ratio=(115 + 1e-9) / 112))
    assert source.blocks[0].mlp.fc1.out_features == 115
    assert int(112 * (115 / 112)) == 114
    path = tmp_path / 'hidden-115.pth'
    torch.save(source.state_dict(), path)
    options = dict(arch=dict(embed_dims=112, num_layers=1, num_heads=2), img_size=64, **CLS)
    with pytest.raises(ValueError) as refused:
        _pretrained(ViT, path=path, **options)
    assert 'mlp_ratio=' in ADVICE.search(str(refused.value)).group(1)
    options, init_cfg = apply_advice(str(refused.value), options,
                                     dict(type='Pretrained', checkpoint=str(path)))
    model = ViT(options.pop('arch'), init_cfg=init_cfg, **options)
    model.init_weights()
    images = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        assert_features_match(model.eval()(images), [source.forward_head(
            source.forward_features(images), pre_logits=True)])
