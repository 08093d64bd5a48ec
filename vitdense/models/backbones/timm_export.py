"""Backbones trained here handed to timm: a vitdense checkpoint as the state dict of the
family's timm model, checked by timm's own strict load.

The key mapping is data on each family (``timm_export_rules``, ``split_for_timm``; see
:meth:`CheckpointAdaptation.export_to_timm`). What timm's model has and the checkpoint may
lack is decided here: a classifier's head is written as timm's ``head`` (else the model is
timm's ``num_classes=0``, headless); a dense model's classification stage (final norm,
class-attention blocks, CaiT's and XCiT's class token) is not trained, so the export refuses
unless ``fill_missing`` takes those tensors from timm's initialisation of the model.
"""
import re
from typing import Optional

import timm

from .base import ColumnarBackbone
from .checkpoint_adaptation import SHARED_CHECKPOINT_RULES, rename_key

#: mmpretrain's linear classifier head (``LinearClsHead``) -> timm's ``head``
HEAD_PREFIX = 'head.fc.'
#: the classification stage (our names), which a dense model does not build
CLASSIFICATION_STAGE = r'^(norm\.|cls_token$|cls_blocks\.)'


def split_checkpoint(checkpoint: dict) -> tuple[dict, dict]:
    """The backbone tensors and the classifier head (in timm's names) of a checkpoint: a plain
    backbone state dict, or a whole model's (an mmengine checkpoint with ``meta`` and
    ``state_dict``, a classifier's or a detector's) whose backbone is under ``backbone.``."""
    state_dict = checkpoint.get('state_dict', checkpoint)
    if not isinstance(state_dict, dict) or not state_dict:
        raise ValueError('the checkpoint holds no state dict (a dict of tensors, or one under '
                         "'state_dict')")
    if not any(key.startswith('backbone.') for key in state_dict):
        return dict(state_dict), {}
    backbone = {key[len('backbone.'):]: value for key, value in state_dict.items()
                if key.startswith('backbone.')}
    head = {f'head.{key[len(HEAD_PREFIX):]}': value for key, value in state_dict.items()
            if key.startswith(HEAD_PREFIX)}
    return backbone, head


def timm_model_name(family: type[ColumnarBackbone], arch: str, **options) -> str:
    """The timm model of ``family``'s ``timm_models`` table built as ``family(arch,
    **options)`` (options at the constructor's defaults may be left out)."""
    defaults = dict(patch_size=16, img_size=224)
    wanted = {**defaults, **options}
    for name, table_options, timm_name in family.timm_models:
        if name == arch and {**defaults, **table_options} == wanted and timm_name:
            return timm_name
    known = ', '.join(f'{name} {opts or ""}'.strip() for name, opts, timm_name
                      in family.timm_models if timm_name)
    raise ValueError(f'{family.__name__}(arch={arch!r}, {options}) is no timm model: name one '
                     f'(--timm-model, with --timm-kwargs for a custom arch); timm models of '
                     f'the family: {known}')


def to_timm(family: type[ColumnarBackbone], checkpoint: dict, timm_model: str,
            timm_kwargs: Optional[dict] = None,
            fill_missing: bool = False) -> tuple[dict, list[str]]:
    """The state dict of ``timm.create_model(timm_model, num_classes=..., **timm_kwargs)``
    holding the backbone (and classifier head, if any) of ``checkpoint``, loaded by timm
    strictly before it is returned; also the keys filled from timm's initialisation.

    Raises ValueError when timm's model has no place for a tensor of the checkpoint (an option
    timm lacks: window attention, relative positions, the hMLP stem) or, unless
    ``fill_missing``, when the checkpoint lacks tensors of timm's model (a dense model's
    classification stage), naming them.
    """
    backbone, head = split_checkpoint(checkpoint)
    exported = {**family.export_to_timm(backbone), **head}
    num_classes = head['head.weight'].shape[0] if 'head.weight' in head else 0
    model = timm.create_model(timm_model, pretrained=False, num_classes=num_classes,
                              **(timm_kwargs or {}))
    expected = model.state_dict()
    unexpected = [key for key in exported if key not in expected]
    missing = [key for key in expected if key not in exported]
    if unexpected:
        raise ValueError(
            f'{timm_model} has no tensor for {len(unexpected)} of the checkpoint '
            f'({", ".join(unexpected[:6])}): the backbone is of another arch (name the timm '
            f'model and its options) or uses an option timm lacks (window attention, '
            f'relative positions, the hMLP stem)')
    trunk = [key for key in missing if not re.match(CLASSIFICATION_STAGE, rename_key(
        key, SHARED_CHECKPOINT_RULES + family.checkpoint_rules))]
    if trunk:
        raise ValueError(
            f'the checkpoint lacks {len(trunk)} tensors of {timm_model}\'s trunk '
            f'({", ".join(trunk[:6])}): it is of another arch (name the timm model and its '
            f'options)')
    if missing and not fill_missing:
        raise ValueError(
            f'the checkpoint lacks {len(missing)} tensors of {timm_model} '
            f'({", ".join(missing[:6])}): a dense model has no trained classification stage; '
            f'fill_missing=True (--fill-missing) takes them from timm\'s initialisation, '
            f'so that timm\'s classification features are not the trained ones')
    exported.update({key: expected[key] for key in missing})
    try:
        model.load_state_dict(exported, strict=True)
    except RuntimeError as error:
        mismatches = [line.strip() for line in str(error).splitlines()[1:]]
        raise ValueError(f'{timm_model} (options {timm_kwargs or {}}) does not load the export, '
                         f'another arch (name the timm model and its options): '
                         f'{len(mismatches)} tensors differ\n  ' + '\n  '.join(mismatches[:6])
                         ) from None
    return exported, missing

