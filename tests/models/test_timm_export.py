"""Backbones handed back to timm: a perturbed vitdense model -> timm state dict -> timm's strict
load -> the same features -> back through ``Pretrained`` loading, exactly, for every family."""
from dataclasses import replace

import pytest
import timm
import torch

from vitdense.models import CaiT, ConViT, ViT, XCiT
from vitdense.models.backbones.checkpoint_keys import Rename
from vitdense.models.backbones.timm_export import (split_checkpoint, timm_arguments,
                                                   timm_model_of, to_timm)

from common import TINY_ARCH, TINY_CONVIT_ARCH

IMG_SIZE = 64
TIMM_TINY = dict(embed_dim=32, depth=4, num_heads=2, img_size=IMG_SIZE)
# family, its options, the timm model and timm's options for the same shape; a tensor the
# family's mapping writes in its own way, where an error of 0.1 % must show in the features
CASES = {
    'vit': (ViT, dict(layer_scale=1e-5), 'vit_tiny_patch16_224',
            dict(TIMM_TINY, init_values=1e-5), 'blocks.2.ls1.gamma'),
    'vit-parallel': (ViT, dict(layer_scale=1e-5, num_parallel=2), 'vit_small_patch16_18x2_224',
                     TIMM_TINY, 'blocks.2.attns.1.ls.gamma'),
    'cait': (CaiT, {}, 'cait_xxs24_224', dict(TIMM_TINY, init_values=1e-5),
             'blocks.3.gamma_1'),
    # tokens_norm given: a timm XCiT of no released size loads back only with it chosen
    'xcit': (XCiT, dict(tokens_norm=True), 'xcit_nano_12_p16_224',
             dict(TIMM_TINY, eta=1.0, tokens_norm=True),
             'blocks.2.attn.temperature'),
    'convit': (ConViT, dict(arch=TINY_CONVIT_ARCH), 'convit_tiny',
               # timm's ConViT takes embed_dim per head
               dict(TIMM_TINY, embed_dim=8, num_heads=4, local_up_to_layer=2),
               'blocks.1.attn.v.weight'),
}
OUT_INDICES = (1, 3)


def _options(options: dict, **kwargs) -> dict:
    """The constructor options of :func:`_perturbed`'s model."""
    return {'arch': TINY_ARCH, 'img_size': IMG_SIZE, **options, **kwargs}


def _perturbed(family: type, options: dict, **kwargs) -> torch.nn.Module:
    """A tiny model whose every tensor matters: LayerScale at the scale of the residual (a
    trained model's, not 1e-5), talking-heads maps mixing the heads at unit scale (at their
    near-zero initialisation the attention is near uniform), temperatures and gates moved off
    their initialisation, BN statistics not (0, 1)."""
    torch.manual_seed(0)
    model = family(**_options(options, **kwargs))
    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            if name.endswith(('running_var', '.gamma')):
                tensor.copy_(torch.rand_like(tensor) + 0.5)
            elif tensor.is_floating_point():
                tensor.add_(torch.randn_like(tensor) * (1. if '.mix_' in name else .1))
    return model.eval()


def _relative(ours: torch.Tensor, theirs: torch.Tensor) -> float:
    return ((ours - theirs).abs().max() / theirs.abs().max()).item()


def _timm_model(name: str, kwargs: dict, state_dict: dict) -> torch.nn.Module:
    model = timm.create_model(name, pretrained=False, num_classes=0, **kwargs)
    model.load_state_dict(state_dict, strict=True)
    return model.eval()


def _feature_difference(ours: torch.nn.Module, theirs: torch.nn.Module) -> float:
    """The largest relative difference of the class features (timm's pre-logits)."""
    images = torch.randn(2, 3, IMG_SIZE, IMG_SIZE, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        return _relative(ours(images)[0],
                         theirs.forward_head(theirs.forward_features(images), pre_logits=True))


@pytest.mark.parametrize('case', CASES)
def test_round_trip_to_timm_and_back_is_exact(case, tmp_path):
    family, options, timm_name, timm_kwargs, _ = CASES[case]
    ours = _perturbed(family, options, out_type='cls_token')
    exported, filled, _, _ = to_timm(family, ours.state_dict(), timm_name, timm_kwargs,
                                     options=_options(options, out_type='cls_token'))
    assert filled == []
    theirs = _timm_model(timm_name, timm_kwargs, exported)
    assert _feature_difference(ours, theirs) <= 1e-5
    path = tmp_path / 'timm.pth'
    torch.save(theirs.state_dict(), path)
    back = family(options.get('arch', TINY_ARCH), img_size=IMG_SIZE, out_type='cls_token',
                  init_cfg=dict(type='Pretrained', checkpoint=str(path)),
                  **{k: v for k, v in options.items() if k != 'arch'})
    back.init_weights()
    assert back.state_dict().keys() == ours.state_dict().keys()
    for key, value in ours.state_dict().items():
        assert torch.equal(back.state_dict()[key], value), key


@pytest.mark.parametrize('case', CASES)
def test_dense_maps_equal_timms_intermediates(case):
    family, options, timm_name, timm_kwargs, _ = CASES[case]
    dense = _perturbed(family, options, pyramid=False, out_indices=OUT_INDICES)
    exported, filled, _, _ = to_timm(
        family, dense.state_dict(), timm_name, timm_kwargs, fill_missing=True,
        options=_options(options, pyramid=False, out_indices=OUT_INDICES))
    assert filled and all(k.startswith(('norm.', 'cls_token', 'blocks_token_only.',
                                        'cls_attn_blocks.')) for k in filled)
    theirs = _timm_model(timm_name, timm_kwargs, exported)
    images = torch.randn(2, 3, IMG_SIZE, IMG_SIZE)
    with torch.no_grad():
        reference = theirs.forward_intermediates(images, indices=list(OUT_INDICES),
                                                 intermediates_only=True)
        for ours, expected in zip(dense(images), reference, strict=True):
            assert _relative(ours, expected) <= 1e-5


@pytest.mark.parametrize('case', CASES)
def test_an_error_of_one_tensor_fails_the_feature_check(case):
    family, options, timm_name, timm_kwargs, tensor = CASES[case]
    ours = _perturbed(family, options, out_type='cls_token')
    exported = to_timm(family, ours.state_dict(), timm_name, timm_kwargs,
                       options=_options(options, out_type='cls_token')).state_dict
    exported[tensor] = exported[tensor] * 1.001
    assert _feature_difference(ours, _timm_model(timm_name, timm_kwargs, exported)) > 1e-5


def test_a_key_table_that_is_not_one_to_one_is_refused_on_export(monkeypatch):
    """LayerScale renamed crosswise: the export writes gamma_2 for ls1, which the shared
    table reads back as ls2."""
    swapped = (Rename('.gamma_2$', '.ls1.gamma$'), Rename('.gamma_1$', '.ls2.gamma$'))
    layout = CaiT.checkpoint_layout
    monkeypatch.setattr(CaiT, 'checkpoint_layout', replace(
        layout, keys=replace(layout.keys, keys=layout.keys.keys[:3] + swapped)))
    model = _perturbed(CaiT, {}, out_type='cls_token')
    with pytest.raises(ValueError, match=r'CaiT: the timm export does not load back exactly '
                                         r'for 12 tensors \(blocks\.0\.ls1\.gamma'):
        CaiT.checkpoint_layout.export_to_timm(model.state_dict())


def test_a_classifiers_head_is_written_as_timms_head():
    ours = _perturbed(CaiT, {}, out_type='cls_token')
    head = torch.nn.Linear(32, 5)
    checkpoint = dict(meta=dict(epoch=3), state_dict={
        **{f'backbone.{k}': v for k, v in ours.state_dict().items()},
        'head.fc.weight': head.weight, 'head.fc.bias': head.bias,
        'data_preprocessor.mean': torch.zeros(3)})
    exported = to_timm(CaiT, checkpoint, 'cait_xxs24_224', dict(TIMM_TINY, init_values=1e-5),
                       options=_options({}, out_type='cls_token')).state_dict
    assert torch.equal(exported['head.weight'], head.weight)
    theirs = timm.create_model('cait_xxs24_224', num_classes=5,
                               **dict(TIMM_TINY, init_values=1e-5)).eval()
    theirs.load_state_dict(exported, strict=True)
    images = torch.randn(1, 3, IMG_SIZE, IMG_SIZE)
    with torch.no_grad():
        assert _relative(head(ours(images)[0]), theirs(images)) <= 1e-5


def test_a_dense_model_without_fill_missing_options_timm_lacks_and_other_archs_are_refused():
    dense = _perturbed(XCiT, {})
    with pytest.raises(ValueError, match=r'lacks 39 tensors of xcit_nano_12_p16_224 \(cls_token'
                                         r'.*fill_missing=True \(--fill-missing\)'):
        to_timm(XCiT, dense.state_dict(), options=_options({}))
    windowed = dict(use_rel_pos=True, dense_class_token=False)
    with pytest.raises(ValueError, match=r"timm.create_model\('vit_tiny_patch16_224', .*\) has "
                                         r'no tensor for 8 of the checkpoint \(blocks\.0\.attn'
                                         r'\.rel_pos'):
        to_timm(ViT, _perturbed(ViT, windowed).state_dict(), options=_options(windowed))
    classifier = dict(out_type='cls_token')
    tiny = _perturbed(ViT, classifier).state_dict()
    with pytest.raises(ValueError, match=r"lacks 96 tensors of the trunk of timm.create_model"
                                         r"\('vit_tiny_patch16_224', .*depth=12.*another arch"):
        to_timm(ViT, tiny, timm_kwargs=dict(depth=12), options=_options(classifier))
    with pytest.raises(ValueError, match=r'embed_dim=64.*does not load the export, another '
                                         r'arch(.|\n)*size mismatch for cls_token'):
        to_timm(ViT, tiny, timm_kwargs=dict(embed_dim=64), options=_options(classifier))
    with pytest.raises(ValueError, match=r"holds no config \(meta\['cfg'\]\): give the "
                                         r"backbone's options"):
        to_timm(ViT, tiny)
    with pytest.raises(ValueError, match=r"is not the checkpoint's backbone"):
        to_timm(ViT, tiny, options=_options(classifier, depth=3))


# family, the backbone's options that change its forward but not its tensors, and timm's
# keyword left at timm's default (what an export that checks tensors alone wrote)
FORWARD_OPTIONS = {
    'vit-avg-featmap': (ViT, dict(out_type='avg_featmap'), dict(global_pool='token')),
    'vit-norm-eps': (ViT, dict(out_type='cls_token', norm_eps=1e-5), dict(norm_layer=None)),
    'vit-heads': (ViT, dict(arch=dict(TINY_ARCH, num_heads=4), out_type='cls_token'),
                  dict(num_heads=2)),
    'vit-quick-gelu': (ViT, dict(out_type='cls_token', act_layer='quick_gelu'),
                       dict(act_layer='gelu')),
    'vit-fc-norm-dense': (ViT, dict(pyramid=False, out_indices=(1, 3), norm_eps=1e-5),
                          dict(norm_layer=None)),
    'xcit-tokens-norm': (XCiT, dict(arch=dict(TINY_ARCH, tokens_norm=False),
                                    out_type='cls_token'), dict(tokens_norm=True)),
    'xcit-heads': (XCiT, dict(arch=dict(TINY_ARCH, num_heads=4), out_type='cls_token'),
                   dict(num_heads=2)),
    'xcit-norm-eps': (XCiT, dict(out_type='cls_token', norm_eps=1e-5), dict(norm_layer=None)),
    'cait-heads': (CaiT, dict(arch=dict(TINY_ARCH, num_heads=4), out_type='cls_token'),
                   dict(num_heads=2)),
    'cait-norm-eps': (CaiT, dict(out_type='cls_token', norm_eps=1e-5), dict(norm_layer=None)),
    'convit-norm-eps': (ConViT, dict(arch=TINY_CONVIT_ARCH, out_type='cls_token',
                                     norm_eps=1e-5), dict(norm_layer=None)),
}


def _small_embeddings_(model: torch.nn.Module) -> torch.nn.Module:
    """Token embeddings scaled down, so that a LayerNorm's eps is not negligible beside
    their variance (as in trained models' first blocks)."""
    with torch.no_grad():
        for name, tensor in model.named_parameters():
            if name.startswith(('patch_embed.', 'pos_embed.', 'cls_token')):
                tensor.mul_(1e-3)
    return model


@pytest.mark.parametrize('case', FORWARD_OPTIONS)
def test_an_option_that_changes_the_forward_is_written_into_timms_call_or_refused(case):
    """The call written from the backbone's options computes its features (≤ 1e-5); the
    same export under the call without that option is refused: by the feature check where it
    loads strictly in timm, by the strict load where the option has tensors of its own."""
    family, options, timm_default = FORWARD_OPTIONS[case]
    model = _small_embeddings_(_perturbed(family, options))
    export = to_timm(family, model.state_dict(), options=_options(options), fill_missing=True)
    assert export.difference <= 1e-5
    assert all(f'{key}=' in export.call for key in timm_default)
    refused = r'loads the export but computes other features than the backbone: .* differ by'
    if family in (XCiT, CaiT) and 'num_heads' in timm_default:  # the heads' own tensors
        refused = r'does not load the export, another arch'
    with pytest.raises(ValueError, match=refused):
        to_timm(family, model.state_dict(), timm_kwargs=timm_default, options=_options(options),
                fill_missing=True)


def test_the_call_is_written_from_the_checkpoints_own_config(tmp_path):
    """An mmengine checkpoint keeps its config (``meta['cfg']``): the backbone's options come
    from it, and the printed call builds the model that loads the export."""
    options = _options(dict(out_type='avg_featmap', norm_eps=1e-5))
    model = _small_embeddings_(_perturbed(ViT, options))
    cfg = f"model = dict(type='ImageClassifier', backbone=dict(type='vitdense.ViT', " \
          f"**{options!r}))"
    checkpoint = dict(meta=dict(cfg=cfg), state_dict={
        f'backbone.{k}': v for k, v in model.state_dict().items()})
    export = to_timm(ViT, checkpoint)
    assert export.call.startswith("timm.create_model('vit_tiny_patch16_224', num_classes=0, "
                                  "embed_dim=32, depth=4, num_heads=2")
    assert "global_pool='avg'" in export.call and 'eps=1e-05' in export.call
    import functools  # noqa: F401 (the call's norm_layer)
    theirs = eval(export.call)
    theirs.load_state_dict(export.state_dict)
    assert _feature_difference(model, theirs) <= 1e-5
    assert timm_arguments(model)['fc_norm'] is False


def test_the_timm_model_is_the_family_tables_entry_with_the_backbones_block_options():
    with torch.device('meta'):
        assert timm_model_of(CaiT('xxs24')) == 'cait_xxs24_224'
        assert timm_model_of(ViT('small', depth=18, num_parallel=2)) == \
            'vit_small_patch16_18x2_224'


def test_a_plain_state_dict_is_the_backbone():
    backbone, head = split_checkpoint({'blocks.0.norm1.weight': torch.ones(2)})
    assert list(backbone) == ['blocks.0.norm1.weight'] and head == {}
    with pytest.raises(ValueError, match='holds no state dict'):
        split_checkpoint({'state_dict': {}})


# ViT's options of other sources that timm's VisionTransformer computes: the call written
# from the backbone's options matches its forward
EXPORTED_SOURCE_OPTIONS = {
    'qk-norm': dict(qk_norm=True),
    'quick-gelu': dict(act_layer='quick_gelu'),
    'pre-norm': dict(pre_norm=True),  # CLIP: its patch bias moved into the position table
    'no-class-token-registers': dict(class_token=False, reg_tokens=4),
    'distillation-token': dict(reg_tokens=1),  # DeiT-distilled's, with its position row
}
# ... and those it has no counterpart for: refused, naming the option
REFUSED_SOURCE_OPTIONS = {
    'rope-eva02': (dict(rope='eva02'), "rope='eva02'"),
    'rope-dinov3': (dict(rope='dinov3', pos_embed='none'), "rope='dinov3'"),
    'swiglu': (dict(swiglu_mlp=True), 'swiglu_mlp=True'),
    'rel-pos-bias': (dict(use_rel_pos_bias=True, pos_embed='none'), 'use_rel_pos_bias=True'),
    'res-post-norm': (dict(res_post_norm=True), 'res_post_norm=True'),
}


@pytest.mark.parametrize('case', EXPORTED_SOURCE_OPTIONS)
@pytest.mark.parametrize('dense', [False, True], ids=['classifier', 'dense'])
def test_a_source_option_timm_computes_is_exported_with_the_same_forward(case, dense):
    """The classifier's features (checked again here with the printed call) or the dense
    blocks' maps equal timm's, ≤ 1e-5."""
    options = EXPORTED_SOURCE_OPTIONS[case]
    mode = dict(pyramid=False, out_indices=OUT_INDICES) if dense else dict(
        out_type='cls_token' if options.get('class_token', True) else 'avg_featmap')
    model = _small_embeddings_(_perturbed(ViT, {**options, **mode}))
    export = to_timm(ViT, model.state_dict(), options=_options({**options, **mode}),
                     fill_missing=dense)
    assert export.difference <= 1e-5
    if not dense:
        import functools  # noqa: F401 (the call's norm_layer, if any)
        theirs = eval(export.call)
        theirs.load_state_dict(export.state_dict, strict=True)
        assert _feature_difference(model, theirs.eval()) <= 1e-5


@pytest.mark.parametrize('case', REFUSED_SOURCE_OPTIONS)
def test_a_source_option_timm_lacks_is_refused_by_name(case):
    options, named = REFUSED_SOURCE_OPTIONS[case]
    model = _perturbed(ViT, options, out_type='avg_featmap')
    with pytest.raises(ValueError, match=rf'ViT with {named} has no export to timm'):
        to_timm(ViT, model.state_dict(), options=_options(options, out_type='avg_featmap'))


def test_a_pre_norm_patch_bias_without_position_table_is_refused():
    options = dict(pre_norm=True, pos_embed='none', out_type='avg_featmap')
    model = _perturbed(ViT, options)
    with pytest.raises(ValueError, match=r'has no patch bias \(pre_norm=True\) and the '
                                         r'backbone no position table'):
        to_timm(ViT, model.state_dict(), options=_options(options))
