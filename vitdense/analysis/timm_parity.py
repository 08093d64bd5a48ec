"""timm as the numerical reference: every named variant of the registered families beside
the timm model it reproduces, and a side-by-side comparison (parameters, logits, block
outputs) on the same weights. Behind ``tools/analysis_tools/backbone_parity.py`` and the
backbone tests."""
from typing import Optional

import torch
import torch.nn.functional as F

from vitdense.models import backbone_families

from .complexity import count_parameters

#: (family, arch, our extra kwargs, timm model name or None where timm has no such model)
REFERENCE_MODELS: list[tuple[str, str, dict, Optional[str]]] = [
    (family, arch, options, timm_name)
    for family, cls in backbone_families().items()
    for arch, options, timm_name in cls.timm_models]


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

    cls = backbone_families()[family]
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
    ours.load_state_dict(ours.adapt_checkpoint(state_dict))
    size = image_hw or tuple(reference.pretrained_cfg['input_size'][1:])
    images = torch.randn(2, 3, *size)
    logits = F.linear(ours(images)[0], reference.head.weight, reference.head.bias)
    result['logit_diff'] = (logits - reference(images)).abs().max().item()

    dense = cls(arch, out_type='featmap', pyramid=False, **kwargs).eval()
    dense.load_state_dict(dense.adapt_checkpoint(state_dict))
    expected = reference.forward_intermediates(images, indices=list(dense.out_indices),
                                               norm=False, output_fmt='NCHW',
                                               intermediates_only=True)
    result['feature_diff'] = max((a - b).abs().max().item()
                                 for a, b in zip(dense(images), expected))
    return result
