"""Loading official releases and timm state dicts through ``init_cfg``."""
import pytest
import timm
import torch

from vitdense.models import CaiT, ViT, XCiT, adapt_checkpoint

from common import TINY_ARCH


def _official_xcit(state_dict: dict) -> dict:
    """The layout of the official XCiT release: ``pos_embeder`` and one qkv map in class
    attention, wrapped in a ``model`` key."""
    official = {}
    for key, value in state_dict.items():
        official[key.replace('pos_embed.', 'pos_embeder.')] = value
    for i in range(2):
        for param in ('weight', 'bias'):
            parts = [official.pop(f'cls_attn_blocks.{i}.attn.{p}.{param}') for p in 'qkv']
            official[f'cls_attn_blocks.{i}.attn.qkv.{param}'] = torch.cat(parts)
    return {'model': official}


@pytest.fixture(scope='module')
def xcit_reference():
    torch.manual_seed(0)
    return timm.create_model('xcit_nano_12_p16_224', pretrained=False).eval()


def _pretrained(cls, arch, path, **kwargs):
    model = cls(arch, init_cfg=dict(type='Pretrained', checkpoint=str(path)), **kwargs)
    model.init_weights()
    return model.eval()


def test_official_xcit_release_loads_for_classification_and_dense(tmp_path, xcit_reference):
    path = tmp_path / 'xcit_nano_12_p16_224.pth'
    torch.save(_official_xcit(xcit_reference.state_dict()), path)
    images = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        expected = xcit_reference.forward_head(xcit_reference.forward_features(images),
                                               pre_logits=True)
        classifier = _pretrained(XCiT, 'nano_12', path, out_type='cls_token')
        assert (classifier(images)[0] - expected).abs().max() < 1e-4
        dense = _pretrained(XCiT, 'nano_12', path, pyramid=False)
        reference_maps = xcit_reference.forward_intermediates(
            images, indices=[3, 5, 7, 11], intermediates_only=True)
        for ours, theirs in zip(dense(images), reference_maps):
            assert (ours - theirs).abs().max() < 1e-4


def test_timm_checkpoint_with_other_resolution_is_resampled(tmp_path):
    torch.manual_seed(0)
    reference = timm.create_model('vit_tiny_patch16_224', pretrained=False)
    path = tmp_path / 'vit_tiny.pth'
    torch.save(reference.state_dict(), path)
    model = _pretrained(ViT, 'tiny', path, img_size=384, out_type='cls_token')
    assert model.pos_embed.weight.shape == (1, 1 + 24 * 24, 192)
    assert torch.equal(model.pos_embed.weight[0, 0], reference.pos_embed[0, 0])
    assert torch.equal(model.blocks[3].attn.qkv.weight, reference.blocks[3].attn.qkv.weight)


def test_official_cait_release_loads(tmp_path):
    torch.manual_seed(0)
    reference = timm.create_model('cait_xxs24_224', pretrained=False).eval()
    path = tmp_path / 'XXS24_224.pth'
    torch.save({'model': reference.state_dict()}, path)
    model = _pretrained(CaiT, 'xxs24', path, out_type='cls_token')
    images = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        logits = torch.nn.functional.linear(model(images)[0], reference.head.weight,
                                            reference.head.bias)
        assert (logits - reference(images)).abs().max() < 1e-4


def test_checkpoint_of_another_size_is_refused(tmp_path, xcit_reference):
    path = tmp_path / 'nano.pth'
    torch.save(xcit_reference.state_dict(), path)
    with pytest.raises(ValueError, match=r'checkpoint does not match XCiT\(arch=tiny_12, .*'
                                         r'with other shapes(.|\n)*patch_embed.proj.0.0.weight: '
                                         r'checkpoint \(16, 3, 3, 3\) vs model \(24, 3, 3, 3\)'):
        _pretrained(XCiT, 'tiny_12', path)


def test_checkpoint_of_another_family_is_refused(tmp_path, xcit_reference):
    path = tmp_path / 'xcit_as_cait.pth'
    torch.save(xcit_reference.state_dict(), path)
    with pytest.raises(ValueError, match=r'checkpoint does not match CaiT(.|\n)*'
                                         r'missing: patch_embed.proj.weight'):
        _pretrained(CaiT, dict(embed_dims=128, num_layers=12, num_heads=4), path)


def test_offline_converter_writes_a_classifier_checkpoint(tmp_path, xcit_reference):
    import subprocess
    import sys
    src, dst = tmp_path / 'official.pth', tmp_path / 'converted.pth'
    torch.save(_official_xcit(xcit_reference.state_dict()), src)
    subprocess.run([sys.executable, 'tools/model_converters/timm_to_vitdense.py', 'xcit',
                    str(src), str(dst), '--arch', 'nano_12', '--classifier'], check=True)
    converted = torch.load(dst, weights_only=True)['state_dict']
    assert torch.equal(converted['head.fc.weight'], xcit_reference.head.weight)
    assert torch.equal(converted['backbone.cls_blocks.1.attn.q.weight'],
                       xcit_reference.cls_attn_blocks[1].attn.q.weight)
    model = XCiT('nano_12', out_type='cls_token')
    model.load_state_dict({k[len('backbone.'):]: v for k, v in converted.items()
                           if k.startswith('backbone.')}, strict=True)


def test_a_vit_names_its_arch_and_adapt_checkpoint_honours_strict(xcit_reference):
    """The error names ViT's arch also where ViT's own options (depth) change it; another
    architecture is refused with strict=True and passed on for torch to report with
    strict=False."""
    with pytest.raises(ValueError, match=r'checkpoint does not match ViT\(arch=small, '
                                         r'embed_dims=384, num_layers=6'):
        adapt_checkpoint(ViT('small', depth=6), 
            {'patch_embed.proj.weight': torch.zeros(1, 3, 16, 16)})
    cait = CaiT(dict(embed_dims=128, num_layers=12, num_heads=4))
    foreign = xcit_reference.state_dict()
    with pytest.raises(ValueError, match=r'checkpoint does not match CaiT\(arch=custom'):
        adapt_checkpoint(cait, foreign)
    result = cait.load_state_dict(adapt_checkpoint(cait, foreign, strict=False), strict=False)
    assert 'patch_embed.proj.weight' in result.missing_keys
    assert 'pos_embed.token_projection.weight' in result.unexpected_keys


def test_load_state_dict_is_torchs_and_takes_our_layout_only(xcit_reference):
    """Official and timm layouts go through adapt_checkpoint explicitly; torch's loader
    reports their keys instead of converting them behind the caller's back."""
    ours = XCiT('nano_12', out_type='cls_token')
    timm_layout = xcit_reference.state_dict()
    with pytest.raises(RuntimeError, match='Unexpected key'):
        ours.load_state_dict(timm_layout)
    ours.load_state_dict(adapt_checkpoint(ours, timm_layout))
    torch.testing.assert_close(ours.cls_blocks[1].attn.q.weight,
                               xcit_reference.cls_attn_blocks[1].attn.q.weight)


def test_official_layer_scale_and_position_names_convert_for_every_family():
    """DeiT III's ViT with LayerScale (the "Three things" recipes) saves gamma_1 / gamma_2
    and a bare pos_embed tensor, as CaiT does: the shared rules map them for ViT too."""
    torch.manual_seed(0)
    ours = ViT(TINY_ARCH, layer_scale=1e-5,
               out_type='cls_token')
    official = {k.replace('.ls1.gamma', '.gamma_1').replace('.ls2.gamma', '.gamma_2')
                .replace('pos_embed.weight', 'pos_embed'): v
                for k, v in ours.state_dict().items()}
    assert 'blocks.3.gamma_2' in official and 'pos_embed' in official
    adapted = adapt_checkpoint(ours, official)
    assert adapted.keys() == ours.state_dict().keys()
    for key, value in ours.state_dict().items():
        assert torch.equal(adapted[key], value)


def test_xcit_class_attention_norm_is_the_released_variants_or_chosen(tmp_path):
    """Whether XCiT's class-attention blocks normalise all tokens (``tokens_norm``) no tensor
    shows: a released size (nano: False, every other: True) tells it, and a classifier built
    otherwise without choosing it is refused, naming it; a file of no released size (timm's
    class default is False, ours True) needs it chosen. Loaded as named, the class token
    equals timm's at the file's size, 224 and a non-square size."""
    from common import assert_features_match, max_relative_diff, perturb_
    torch.manual_seed(0)
    nano = perturb_(timm.create_model('xcit_nano_12_p16_224', pretrained=False)).eval()
    custom = perturb_(timm.create_model('xcit_nano_12_p16_224', pretrained=False,
                                        embed_dim=32, depth=4, num_heads=2)).eval()
    for name, reference in (('nano', nano), ('custom', custom)):
        torch.save(reference.state_dict(), tmp_path / f'{name}.pth')
    nano_size = dict(embed_dims=128, num_layers=12, num_heads=4)
    with pytest.raises(ValueError, match=r'to load it: tokens_norm=False \('):
        _pretrained(XCiT, nano_size, tmp_path / 'nano.pth', out_type='cls_token')
    with pytest.raises(ValueError, match=r'to load it: tokens_norm=False or tokens_norm=True'):
        _pretrained(XCiT, TINY_ARCH, tmp_path / 'custom.pth', out_type='cls_token')
    dense = _pretrained(XCiT, TINY_ARCH, tmp_path / 'custom.pth', pyramid=False)
    loaded = [(nano, _pretrained(XCiT, 'nano_12', tmp_path / 'nano.pth', out_type='cls_token')),
              (nano, _pretrained(XCiT, nano_size, tmp_path / 'nano.pth', out_type='cls_token',
                                 tokens_norm=False)),
              (custom, _pretrained(XCiT, TINY_ARCH, tmp_path / 'custom.pth',
                                   out_type='cls_token', tokens_norm=False))]
    other = _pretrained(XCiT, 'nano_12', tmp_path / 'nano.pth', out_type='cls_token',
                        tokens_norm=True)
    with torch.no_grad():
        for image_hw in ((224, 224), (160, 256)):
            images = torch.randn(2, 3, *image_hw)
            for reference, ours in loaded:
                expected = reference.forward_head(reference.forward_features(images),
                                                  pre_logits=True)
                assert_features_match(ours(images), [expected])
            expected = nano.forward_head(nano.forward_features(images), pre_logits=True)
            off = max_relative_diff(other(images)[0], expected)
            print(f'tokens_norm=True at {image_hw}: {off:.1e}')
            assert off > 1e-3
        assert len(dense(images)) == 4  # a dense model builds no class attention
