"""timm as the numerical reference: every named variant of the registered families beside
the timm model it reproduces, and a side-by-side comparison (parameters, logits, block
outputs) on the same weights. Behind ``tools/analysis_tools/backbone_parity.py`` and the
backbone tests."""
from typing import Optional

import torch
import torch.nn.functional as F

from vitdense.models import adapt_checkpoint, backbone_families

from .complexity import count_parameters

#: (family, arch, our extra kwargs, timm model name or None where timm has no such model)
REFERENCE_MODELS: list[tuple[str, str, dict, Optional[str]]] = [
    (family, arch, options, timm_name)
    for family, cls in backbone_families().items()
    for arch, options, timm_name in cls.timm_models]


def timm_readout(reference: torch.nn.Module) -> dict:
    """Our classification options for what a timm model's head reads: the class token
    (``global_pool='token'``) or the averaged patch tokens, normalised before pooling or
    after (``fc_norm``); None for a head we do not build (SigLIP's attention pooling, SAM's
    neck)."""
    if getattr(reference, 'neck', None) is not None:  # SAM's head pools its neck's maps
        return None
    pool = getattr(reference, 'global_pool', 'token')
    if pool == 'token':
        return dict(out_type='cls_token')
    if pool == 'avg':
        fc_norm = getattr(reference, 'fc_norm', None)
        return dict(out_type='avg_featmap', fc_norm=isinstance(fc_norm, torch.nn.LayerNorm))
    return None


def perturbed(state_dict: dict, std: float, seed: int = 0) -> dict:
    """``state_dict`` with Gaussian noise of ``std`` on every floating tensor: a random
    initialisation leaves biases and norms at 0 and 1, which would hide a misplaced one."""
    generator = torch.Generator().manual_seed(seed)
    return {key: value + std * torch.randn(value.shape, generator=generator, dtype=value.dtype)
            if value.is_floating_point() else value for key, value in state_dict.items()}


def _relative(ours: torch.Tensor, reference: torch.Tensor) -> float:
    return ((ours - reference).abs().max() / reference.abs().max()).item()


@torch.no_grad()
def compare_with_timm(family: str, arch, timm_name: Optional[str], num_classes: int = 1000,
                      image_hw: Optional[tuple[int, int]] = None, seed: int = 0,
                      timm_kwargs: Optional[dict] = None, perturbation: float = 0.,
                      **kwargs) -> dict:
    """Build our backbone (classification and dense, ``pyramid=False`` and with the
    pyramid) and, if given, the timm model (``timm_kwargs``: e.g. a small depth and width);
    load timm's randomly initialised weights (plus noise of std ``perturbation``) into ours
    and compare.

    Returns parameter counts (ours counted with a linear head of ``num_classes``), the max
    abs logit difference (the head reading what timm's head reads, :func:`timm_readout`) and
    the max abs difference of the ``out_indices`` block outputs against timm's
    ``forward_intermediates`` (NCHW, no norm), each also relative to the largest reference
    value (``*_rel_diff``), and the pyramid's levels against the same pyramid applied to
    timm's block outputs (``pyramid_rel_diff``, where the pyramid takes the patch size);
    None where not applicable.
    """
    import timm

    cls = backbone_families()[family]
    torch.manual_seed(seed)
    result = dict(family=family, arch=arch, options=kwargs, timm=timm_name, params_ours=None,
                  params_timm=None, logit_diff=None, feature_diff=None, logit_rel_diff=None,
                  feature_rel_diff=None, pyramid_rel_diff=None)
    if timm_name is None:
        # a model without class token is read by pooling (same parameters)
        ours = cls(arch, out_type='cls_token' if kwargs.get('class_token', True)
                   else 'avg_featmap', **kwargs)
        result['params_ours'] = count_parameters(ours) + ours.embed_dims * num_classes + \
            num_classes
        return result
    options = dict(dynamic_img_size=True) if image_hw and family == 'vit' else {}
    try:
        reference = timm.create_model(timm_name, pretrained=False, num_classes=num_classes,
                                      **{**options, **(timm_kwargs or {})}).eval()
    except TypeError:  # a model taking any size without the option (SAM's)
        reference = timm.create_model(timm_name, pretrained=False, num_classes=num_classes,
                                      **(timm_kwargs or {})).eval()
    result['params_timm'] = count_parameters(reference)
    state_dict = perturbed(reference.state_dict(), perturbation, seed) if perturbation else \
        reference.state_dict()
    reference.load_state_dict(state_dict)
    size = image_hw or tuple(reference.pretrained_cfg['input_size'][1:])
    images = torch.randn(2, 3, *size)
    readout = timm_readout(reference)
    if readout is not None:
        ours = cls(arch, **readout, **kwargs).eval()
        result['params_ours'] = count_parameters(ours) + ours.embed_dims * num_classes + \
            num_classes
        ours.load_state_dict(adapt_checkpoint(ours, state_dict))
        logits = F.linear(ours(images)[0], reference.head.weight, reference.head.bias)
        expected = reference(images)
        result['logit_diff'] = (logits - expected).abs().max().item()
        result['logit_rel_diff'] = _relative(logits, expected)

    dense = cls(arch, out_type='featmap', pyramid=False, **kwargs).eval()
    dense.load_state_dict(adapt_checkpoint(dense, state_dict))
    expected = reference.forward_intermediates(images, indices=list(dense.out_indices),
                                               norm=False, output_fmt='NCHW',
                                               intermediates_only=True)
    maps = dense(images)
    result['feature_diff'] = max((a - b).abs().max().item() for a, b in zip(maps, expected))
    result['feature_rel_diff'] = max(_relative(a, b) for a, b in zip(maps, expected))
    patch = dense.patch_size
    if len(dense.out_indices) == 4 and not patch & (patch - 1) and 4 <= patch <= 32:
        pyramid = cls(arch, out_type='featmap', **kwargs).eval()
        pyramid.load_state_dict(adapt_checkpoint(pyramid, state_dict), strict=False)
        result['pyramid_rel_diff'] = max(_relative(a, b) for a, b in zip(
            pyramid(images), pyramid.pyramid(list(expected), size)))
    return result
