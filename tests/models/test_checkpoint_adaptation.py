"""Loading is exact or refused: every tensor the model builds comes from the checkpoint and
every checkpoint tensor is used, or the load raises naming what the checkpoint is and the
option that would load it."""
import re

import pytest
import torch
from timm.models.vision_transformer import VisionTransformer

from vitdense.models import CaiT, ConViT, ViT, XCiT

from common import TINY_ARCH, TINY_BACKBONES, assert_features_match, perturb_

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
        cait36.adapt_checkpoint(cait24.state_dict())
    with pytest.raises(ValueError, match=r"to load it: arch='xxs36'; or load its first 24 "
                                         r"blocks: init_cfg=dict\(type='Pretrained', ..., "
                                         r"truncate=True\)"):
        cait24.adapt_checkpoint(cait36.state_dict())
    with pytest.raises(ValueError, match=r"324 missing(.|\n)*to load it: arch='tiny_12'"):
        xcit24.adapt_checkpoint(xcit12.state_dict())


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
        vitdet.adapt_checkpoint(cait.state_dict())


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
    assert model.adapt_checkpoint(dict(complete)).keys() == complete.keys()
    removed = dict(complete)
    del removed['blocks.1.mlp.fc1.weight']
    with pytest.raises(ValueError, match=r'1 missing, 0 unexpected(.|\n)*no option of '
                                         r'(.|\n)*missing: blocks.1.mlp.fc1.weight'):
        model.adapt_checkpoint(removed)
    depth = model.num_layers
    extra = dict(complete, **{re.sub(r'^blocks\.\d+\.', f'blocks.{depth}.', k): v
                              for k, v in complete.items() if k.startswith(f'blocks.{depth - 1}.')})
    with pytest.raises(ValueError, match=rf'0 missing, \d+ unexpected(.|\n)*depth {depth + 1}'
                                         rf'(.|\n)*unexpected: blocks.{depth}.'):
        model.adapt_checkpoint(extra)
