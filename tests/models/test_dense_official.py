"""The backbone as the official XCiT dense code runs it: SyncBatchNorm in the stem and LPI,
and the official forward on inputs that are not multiples of 32 (padding='stem'), checked
against an independent forward: timm's XCiT trunk plus the official pyramid written out
with torch.nn.functional."""
import pytest
import timm.models.xcit
import torch
import torch.nn.functional as F
from torch import nn

from vitdense.models import ViT, XCiT, adapt_checkpoint

from common import TINY_ARCH


def _official_pyramid(features: list, pyramid: nn.Module, patch_size: int) -> list:
    """fpn1..fpn4 of ``detection/backbone/xcit.py``: exact 2×2 transposed convs (BN + GELU
    between two of them) up, identity, and floor-mode max pooling down."""
    def up(x, conv):
        return F.conv_transpose2d(x, conv.weight, conv.bias, stride=2)

    def bn(x, norm):
        return F.batch_norm(x, norm.running_mean, norm.running_var, norm.weight, norm.bias,
                            eps=norm.eps)

    if patch_size == 16:
        fpn1 = pyramid.fpn1
        return [up(F.gelu(bn(up(features[0], fpn1[0]), fpn1[1])), fpn1[3]),
                up(features[1], pyramid.fpn2[0]), features[2], F.max_pool2d(features[3], 2)]
    return [up(features[0], pyramid.fpn1[0]), features[1], F.max_pool2d(features[2], 2),
            F.max_pool2d(features[3], 4)]


def _randomise_batch_norms(model: nn.Module) -> None:
    for module in model.modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            module.running_mean.uniform_(-.5, .5)
            module.running_var.uniform_(.5, 2.)
            module.weight.data.uniform_(.5, 1.5)
            module.bias.data.uniform_(-.5, .5)


@pytest.mark.parametrize('patch_size', [16, 8])
@pytest.mark.parametrize('image_hw', [(64, 85), (72, 107), (64, 64)])
def test_stem_padding_is_the_official_forward(patch_size, image_hw):
    """(64, 85) is ADE20k's 512 × 683 whole-image test size scaled by 1/8."""
    torch.manual_seed(0)
    reference = timm.models.xcit.Xcit(
        patch_size=patch_size, embed_dim=TINY_ARCH['embed_dims'], depth=TINY_ARCH['num_layers'],
        num_heads=TINY_ARCH['num_heads'], eta=1.0, tokens_norm=True).eval()
    ours = XCiT(TINY_ARCH, patch_size=patch_size, out_indices=(0, 1, 2, 3), padding='stem').eval()
    with torch.no_grad():
        _randomise_batch_norms(reference)
        _randomise_batch_norms(ours.pyramid)
        for param in ours.pyramid.parameters():
            param.normal_(0, .1)
    ours.load_state_dict(adapt_checkpoint(ours, reference.state_dict()), strict=False)
    images = torch.randn(2, 3, *image_hw)
    with torch.no_grad():
        trunk = reference.forward_intermediates(images, indices=[0, 1, 2, 3], norm=False,
                                                output_fmt='NCHW', intermediates_only=True)
        expected = _official_pyramid(trunk, ours.pyramid, patch_size)
        outputs = ours(images)
    for out, want in zip(outputs, expected):
        assert out.shape == want.shape
        torch.testing.assert_close(out, want, atol=1e-4, rtol=0)


def test_stem_and_image_padding_on_ade20k_whole_images():
    """512 × 683 with 16 × 16 patches: the stem rounds every halving up (683 -> 342 -> 171
    -> 86 -> 43 columns); official levels are 172 and 21 columns wide, ours (image padding,
    cropped to the image) 171 and 22. Both agree where the input is a multiple of 32."""
    torch.manual_seed(0)
    small = dict(embed_dims=16, num_layers=4, num_heads=2)
    image = torch.randn(1, 3, 512, 683)
    official = XCiT(small, out_indices=(0, 1, 2, 3), padding='stem').eval()
    cropped = XCiT(small, out_indices=(0, 1, 2, 3)).eval()
    cropped.load_state_dict(official.state_dict())
    with torch.no_grad():
        widths = [f.shape[-1] for f in official(image)], [f.shape[-1] for f in cropped(image)]
        assert widths == ([172, 86, 43, 21], [171, 86, 43, 22])
        aligned = image[..., :672]
        for a, b in zip(official(aligned), cropped(aligned)):
            torch.testing.assert_close(a, b)


def test_stem_padding_needs_a_stem_that_pads():
    with pytest.raises(ValueError, match="padding='stem' needs a patch embedding.*PatchEmbed"):
        ViT('small', padding='stem')
    with pytest.raises(ValueError, match="unknown padding 'same'"):
        XCiT(TINY_ARCH, padding='same')


def test_sync_bn_in_the_stem_and_lpi():
    """norm_cfg=SyncBN makes every BatchNorm of the stem and the blocks a SyncBatchNorm (the
    official dense code's statistics over all GPUs), with the same parameters and output."""
    torch.manual_seed(0)
    plain = XCiT(TINY_ARCH, out_indices=(0, 1, 2, 3)).eval()
    synced = XCiT(TINY_ARCH, out_indices=(0, 1, 2, 3), norm_cfg=dict(type='SyncBN')).eval()
    synced.load_state_dict(plain.state_dict())
    batch_norms = [m for m in synced.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    in_trunk = [m for name, m in synced.named_modules() if not name.startswith('pyramid')
                and isinstance(m, nn.modules.batchnorm._BatchNorm)]
    assert len(in_trunk) == 4 + TINY_ARCH['num_layers']  # 4 stem convs, one per LPI
    assert all(isinstance(m, nn.SyncBatchNorm) for m in in_trunk)
    assert not any(isinstance(m, nn.SyncBatchNorm) for m in plain.modules())
    assert len(batch_norms) == len(in_trunk) + 1  # the pyramid's own (pyramid_norm_cfg)
    images = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        for a, b in zip(plain(images), synced(images)):
            torch.testing.assert_close(a, b)
    with pytest.raises(ValueError, match="norm_cfg .* type in \\['BN', 'SyncBN'\\].*GN"):
        XCiT(TINY_ARCH, norm_cfg=dict(type='GN', num_groups=2))
