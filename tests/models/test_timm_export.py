"""Backbones handed back to timm: a perturbed vitdense model -> timm state dict -> timm's strict
load -> the same features -> back through ``Pretrained`` loading, exactly, for every family."""
import pytest
import timm
import torch

from vitdense.models import CaiT, ConViT, ViT, XCiT
from vitdense.models.backbones.timm_export import split_checkpoint, timm_model_name, to_timm

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
    'xcit': (XCiT, {}, 'xcit_nano_12_p16_224', dict(TIMM_TINY, eta=1.0, tokens_norm=True),
             'blocks.2.attn.temperature'),
    'convit': (ConViT, dict(arch=TINY_CONVIT_ARCH), 'convit_tiny',
               # timm's ConViT takes embed_dim per head
               dict(TIMM_TINY, embed_dim=8, num_heads=4, local_up_to_layer=2),
               'blocks.1.attn.v.weight'),
}
OUT_INDICES = (1, 3)


def _perturbed(family: type, options: dict, **kwargs) -> torch.nn.Module:
    """A tiny model whose every tensor matters: LayerScale at the scale of the residual (a
    trained model's, not 1e-5), talking-heads maps mixing the heads at unit scale (at their
    near-zero initialisation the attention is near uniform), temperatures and gates moved off
    their initialisation, BN statistics not (0, 1)."""
    options = {'arch': TINY_ARCH, **options}
    torch.manual_seed(0)
    model = family(options.pop('arch'), img_size=IMG_SIZE, **options, **kwargs)
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
    exported, filled = to_timm(family, ours.state_dict(), timm_name, timm_kwargs)
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
    exported, filled = to_timm(family, dense.state_dict(), timm_name, timm_kwargs,
                               fill_missing=True)
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
    exported, _ = to_timm(family, ours.state_dict(), timm_name, timm_kwargs)
    exported[tensor] = exported[tensor] * 1.001
    assert _feature_difference(ours, _timm_model(timm_name, timm_kwargs, exported)) > 1e-5


def test_export_rules_that_do_not_invert_the_loading_rules_are_refused(monkeypatch):
    swapped = ((r'\.ls1\.gamma$', '.gamma_2'), (r'\.ls2\.gamma$', '.gamma_1'))
    monkeypatch.setattr(CaiT, 'timm_export_rules', CaiT.timm_export_rules[:3] + swapped)
    model = _perturbed(CaiT, {}, out_type='cls_token')
    with pytest.raises(ValueError, match=r'CaiT: the timm export does not load back exactly '
                                         r'for 12 tensors \(blocks\.0\.ls1\.gamma'):
        CaiT.export_to_timm(model.state_dict())


def test_a_classifiers_head_is_written_as_timms_head():
    ours = _perturbed(CaiT, {}, out_type='cls_token')
    head = torch.nn.Linear(32, 5)
    checkpoint = dict(meta=dict(epoch=3), state_dict={
        **{f'backbone.{k}': v for k, v in ours.state_dict().items()},
        'head.fc.weight': head.weight, 'head.fc.bias': head.bias,
        'data_preprocessor.mean': torch.zeros(3)})
    exported, _ = to_timm(CaiT, checkpoint, 'cait_xxs24_224', dict(TIMM_TINY, init_values=1e-5))
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
        to_timm(XCiT, dense.state_dict(), 'xcit_nano_12_p16_224',
                dict(TIMM_TINY, tokens_norm=True))
    windowed = _perturbed(ViT, {}, use_rel_pos=True, dense_class_token=False)
    with pytest.raises(ValueError, match=r'vit_tiny_patch16_224 has no tensor for 8 of the '
                                         r'checkpoint \(blocks\.0\.attn\.rel_pos'):
        to_timm(ViT, windowed.state_dict(), 'vit_tiny_patch16_224', TIMM_TINY)
    tiny = _perturbed(ViT, {}, out_type='cls_token').state_dict()
    with pytest.raises(ValueError, match=r"lacks 96 tensors of vit_tiny_patch16_224's trunk "
                                         r'\(blocks\.4\.norm1\.weight.*another arch'):
        to_timm(ViT, tiny, 'vit_tiny_patch16_224', dict(img_size=IMG_SIZE))
    with pytest.raises(ValueError, match=r"vit_tiny_patch16_224 \(options \{'depth': 4\}\) "
                                         r'does not load the export, another arch(.|\n)*'
                                         r'size mismatch for cls_token'):
        to_timm(ViT, tiny, 'vit_tiny_patch16_224', dict(depth=4))


def test_timm_model_names_come_from_the_family_table():
    assert timm_model_name(CaiT, 'xxs24') == 'cait_xxs24_224'
    assert timm_model_name(XCiT, 'small_12', patch_size=8) == 'xcit_small_12_p8_224'
    with pytest.raises(ValueError, match=r"ConViT\(arch='tiny_plus', \{\}\) is no timm model"):
        timm_model_name(ConViT, 'tiny_plus')


def test_a_plain_state_dict_is_the_backbone():
    backbone, head = split_checkpoint({'blocks.0.norm1.weight': torch.ones(2)})
    assert list(backbone) == ['blocks.0.norm1.weight'] and head == {}
    with pytest.raises(ValueError, match='holds no state dict'):
        split_checkpoint({'state_dict': {}})
