"""timm as the numerical reference: which timm model matches each of our archs, and a
side-by-side comparison (parameters, logits, block outputs) on the same weights."""
from typing import Optional

import torch
import torch.nn.functional as F

from .backbones import CaiT, ColumnarBackbone, ConViT, ViT, XCiT

FAMILIES: dict[str, type[ColumnarBackbone]] = {
    'vit': ViT, 'cait': CaiT, 'xcit': XCiT, 'convit': ConViT}

#: (family, arch, our extra kwargs) -> timm model name; None where timm has no such model
REFERENCE_MODELS: list[tuple[str, str, dict, Optional[str]]] = [
    ('vit', 'tiny', {}, 'vit_tiny_patch16_224'),
    ('vit', 'small', {}, 'vit_small_patch16_224'),
    ('vit', 'base', {}, 'vit_base_patch16_224'),
    ('vit', 'large', {}, 'vit_large_patch16_224'),
    ('vit', 'huge', dict(patch_size=14), 'vit_huge_patch14_224'),
    ('vit', 'small', dict(patch_size=8), 'vit_small_patch8_224'),
    ('vit', 'base', dict(patch_size=32), 'vit_base_patch32_224'),
    ('vit', 'small', dict(depth=18, num_parallel=2, layer_scale=1e-5),
     'vit_small_patch16_18x2_224'),
    ('vit', 'small', dict(depth=36, layer_scale=1e-5), 'vit_small_patch16_36x1_224'),
    ('vit', 'base', dict(depth=18, num_parallel=2, layer_scale=1e-5),
     'vit_base_patch16_18x2_224'),
    ('vit', 'small', dict(stem='hmlp'), None),
    ('cait', 'xxs24', {}, 'cait_xxs24_224'),
    ('cait', 'xxs36', {}, 'cait_xxs36_224'),
    ('cait', 'xs24', dict(img_size=384), 'cait_xs24_384'),
    ('cait', 'xs36', {}, None),
    ('cait', 's24', {}, 'cait_s24_224'),
    ('cait', 's36', dict(img_size=384), 'cait_s36_384'),
    ('cait', 's48', {}, None),
    ('cait', 'm24', {}, None),
    ('cait', 'm36', dict(img_size=384), 'cait_m36_384'),
    ('cait', 'm48', dict(img_size=448), 'cait_m48_448'),
    *[('xcit', arch, dict(patch_size=p), f'xcit_{arch}_p{p}_224')
      for arch in XCiT.arch_zoo for p in (16, 8)],
    ('convit', 'tiny', {}, 'convit_tiny'),
    ('convit', 'small', {}, 'convit_small'),
    ('convit', 'base', {}, 'convit_base'),
    ('convit', 'tiny_plus', {}, None),
    ('convit', 'small_plus', {}, None),
    ('convit', 'base_plus', {}, None),
]


def count_parameters(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


@torch.no_grad()
def compare_with_timm(family: str, arch: str, timm_name: Optional[str], num_classes: int = 1000,
                      image_hw: Optional[tuple[int, int]] = None, seed: int = 0,
                      **kwargs) -> dict:
    """Build our backbone (classification and dense, ``pyramid=False``) and, if given, the
    timm model; load timm's randomly initialised weights into ours and compare.

    Returns parameter counts (ours counted with a linear head of ``num_classes``), the max
    abs logit difference and the max abs difference of the ``out_indices`` block outputs
    against timm's ``forward_intermediates`` (NCHW, no norm); None where not applicable.
    """
    import timm

    cls = FAMILIES[family]
    torch.manual_seed(seed)
    ours = cls(arch, out_type='cls_token', **kwargs).eval()
    head_params = ours.embed_dims * num_classes + num_classes
    result = dict(family=family, arch=arch, options=kwargs, timm=timm_name,
                  params_ours=count_parameters(ours) + head_params, params_timm=None,
                  logit_diff=None, feature_diff=None)
    if timm_name is None:
        return result
    options = dict(dynamic_img_size=True) if image_hw and family == 'vit' else {}
    reference = timm.create_model(timm_name, pretrained=False, num_classes=num_classes,
                                  **options).eval()
    result['params_timm'] = count_parameters(reference)
    state_dict = reference.state_dict()
    ours.load_state_dict(state_dict, strict=False)
    size = image_hw or tuple(reference.pretrained_cfg['input_size'][1:])
    images = torch.randn(2, 3, *size)
    logits = F.linear(ours(images)[0], reference.head.weight, reference.head.bias)
    result['logit_diff'] = (logits - reference(images)).abs().max().item()

    dense = cls(arch, out_type='featmap', pyramid=False, **kwargs).eval()
    dense.load_state_dict(state_dict, strict=False)
    expected = reference.forward_intermediates(images, indices=list(dense.out_indices),
                                               norm=False, output_fmt='NCHW',
                                               intermediates_only=True)
    result['feature_diff'] = max((a - b).abs().max().item()
                                 for a, b in zip(dense(images), expected))
    return result
