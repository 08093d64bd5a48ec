"""Backbones trained here handed to timm: a vitdense checkpoint as the state dict of the
family's timm model, loaded by timm strictly and checked by its forward.

The key mapping is the family's key table read backward (its ``checkpoint_layout``'s
``keys``, which loading reads forward; see :meth:`CheckpointLayout.export_to_timm`). The
keywords of the timm model's constructor are data too (the layout's ``timm_arguments``):
:func:`timm_arguments` writes the full
``timm.create_model(...)`` call from the backbone's options (the checkpoint's own config, which
mmengine saves in ``meta['cfg']``, or options given). The backbone and timm's model then run on
one input, and the export is refused when their features differ (:func:`check_same_features`):
an option timm's call does not express never passes as an export that loads.

Options timm's model has no counterpart for (the family's ``timm_inexpressible``: ViT's
rotary positions, SwiGLU, relative position bias) are refused by name before any export is
written. A patch bias, which timm's pre-norm models (CLIP) leave out, is moved into the patch
rows of the position table, which adds to the same tokens.

What timm's model has and the checkpoint may lack is decided here: a classifier's head is
written as timm's ``head`` (else the model is timm's ``num_classes=0``, headless); a dense
model's classification stage (final norm, class-attention blocks, CaiT's and XCiT's class
token) is not trained, so the export refuses unless ``fill_missing`` takes those tensors from
timm's initialisation of the model.
"""
import functools
import re
from typing import Any, NamedTuple, Optional

import timm
import torch
import torch.nn as nn
from mmengine.config import Config

from ..layers.blocks import NORM_EPS
from .base import ColumnarBackbone
from .checkpoint_layout import NOT_IN_TIMM

#: mmpretrain's linear classifier head (``LinearClsHead``) -> timm's ``head``
HEAD_PREFIX = 'head.fc.'
#: the class token (our name), part of the classification stage beside the family's
#: ``classification_keys``, which a dense model does not build
CLASS_TOKEN = r'^cls_token$'
#: the patch projection's bias, which timm's pre-norm models (CLIP) leave out
PATCH_BIAS = 'patch_embed.proj.bias'
#: settings every family has (arch keys, else model attributes) -> timm's keywords
SHARED_TIMM_ARGUMENTS = dict(embed_dims='embed_dim', num_layers='depth',
                             num_heads='num_heads', mlp_ratio='mlp_ratio', qkv_bias='qkv_bias',
                             patch_size='patch_size')
#: timm's pooling for our classification outputs
TIMM_GLOBAL_POOL = dict(cls_token='token', avg_featmap='avg')
#: the largest relative difference of features an export may have to its backbone
#: (float32 rounding of the same computation)
FEATURE_TOLERANCE = 1e-5


class TimmNormLayer(functools.partial):
    """``functools.partial(torch.nn.LayerNorm, eps=...)``, written as the Python that makes it,
    for the printed ``timm.create_model(...)`` call."""

    def __repr__(self) -> str:
        return f'functools.partial(torch.nn.LayerNorm, eps={self.keywords["eps"]!r})'


def backbone_options(checkpoint: dict) -> Optional[dict]:
    """The backbone's constructor options in the config an mmengine checkpoint saved
    (``meta['cfg']``: ``model.backbone``, or ``model`` itself for a backbone config), with
    ``type`` and initialisation left out; None without one."""
    text = (checkpoint.get('meta') or {}).get('cfg')
    if not isinstance(text, str):
        return None
    model = Config.fromstring(text, '.py').get('model', {})
    backbone = model.get('backbone', model)
    return {key: value for key, value in backbone.to_dict().items()
            if key not in ('type', 'init_cfg', 'pretrained')}


def timm_arguments(model: ColumnarBackbone) -> dict:
    """The keywords of ``timm.create_model`` for the family's timm model computing what
    ``model`` computes: shapes, the family's ``timm_arguments``, the pooling of its
    classification output, the LayerNorm eps where it is not timm's 1e-6."""
    names = {**SHARED_TIMM_ARGUMENTS, **model.checkpoint_layout.timm_arguments}
    arguments = {timm_name: model.arch[ours] if ours in model.arch else getattr(model, ours)
                 for ours, timm_name in names.items()
                 if ours in model.arch or hasattr(model, ours)}
    if model.checkpoint_layout.timm_embed_dim_per_head:
        arguments['embed_dim'] //= model.num_heads
    arguments['img_size'] = tuple(side * model.patch_size for side in model.pretrain_grid)
    if model.out_type in TIMM_GLOBAL_POOL:
        arguments['global_pool'] = TIMM_GLOBAL_POOL[model.out_type]
    if model.norm_eps != NORM_EPS:
        arguments['norm_layer'] = TimmNormLayer(nn.LayerNorm, eps=model.norm_eps)
    return arguments


def create_model_call(timm_model: str, num_classes: int, arguments: dict) -> str:
    """``timm.create_model(...)`` as Python that builds the model."""
    written = ''.join(f', {key}={value!r}' for key, value in arguments.items())
    return f'timm.create_model({timm_model!r}, num_classes={num_classes}{written})'


def _relative_difference(ours: torch.Tensor, theirs: torch.Tensor) -> float:
    return ((ours - theirs).abs().max() / theirs.abs().max().clamp_min(1e-12)).item()


def check_same_features(backbone: ColumnarBackbone, timm_model: nn.Module, call: str) -> float:
    """Run ``backbone`` and timm's model on one seeded input at the backbone's pretraining
    size: the classification features (timm's pre-logits) of a classifier, the blocks' maps
    of a dense model without pyramid (timm's ``forward_intermediates`` of its
    ``out_indices``). Returns the largest relative difference; raises ValueError above
    ``FEATURE_TOLERANCE``."""
    height, width = (side * backbone.patch_size for side in backbone.pretrain_grid)
    images = torch.randn(2, backbone.in_channels, height, width,
                         generator=torch.Generator().manual_seed(0))
    backbone, timm_model = backbone.eval(), timm_model.eval()
    with torch.no_grad():
        if backbone.dense:
            ours = backbone(images)
            theirs = timm_model.forward_intermediates(
                images, indices=list(backbone.out_indices), intermediates_only=True)
            what = 'the trunk blocks\' maps'
        else:
            ours = backbone(images)
            theirs = [timm_model.forward_head(timm_model.forward_features(images),
                                              pre_logits=True)]
            what = f'the {backbone.out_type} features'
        difference = max(_relative_difference(a, b) for a, b in zip(ours, theirs, strict=True))
    if not difference <= FEATURE_TOLERANCE:
        raise ValueError(
            f'{call} loads the export but computes other features than the backbone: '
            f'{what} differ by {difference:.1e} (relative, > {FEATURE_TOLERANCE:.0e}). The '
            f'backbone has an option this call does not express (or timm lacks), or the '
            f'timm options given contradict it; compare them with '
            f'timm_export.timm_arguments(backbone)')
    return difference


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


def _setting(model: ColumnarBackbone, name: str) -> Any:
    return model.arch[name] if name in model.arch else getattr(model, name, None)


def check_expressible(model: ColumnarBackbone) -> None:
    """Raises ValueError naming the options of ``model`` that the family's timm model has
    no counterpart for (``timm_inexpressible``), before any export is written."""
    inexpressible = model.checkpoint_layout.timm_inexpressible
    differing = {name: _setting(model, name) for name, value in inexpressible.items()
                 if _setting(model, name) != value}
    if differing:
        written = ', '.join(f'{name}={value!r}' for name, value in differing.items())
        computed = ', '.join(f'{name}={inexpressible[name]!r}' for name in differing)
        raise ValueError(f'{type(model).__name__} with {written} has no export to timm: the '
                         f'timm model of its export has no such option (it computes '
                         f'{computed})')


def fold_patch_bias(exported: dict, model: ColumnarBackbone, call: str) -> None:
    """For a timm model without patch bias (``pre_norm``: CLIP), the bias of ``exported``
    moved into the patch rows of its position table: both are added to every patch token
    before any other operation, so the tokens are the same. Raises ValueError when the table
    is absent and the bias is not zero."""
    bias = exported.pop(PATCH_BIAS)
    if 'pos_embed' in exported:
        table = exported['pos_embed'].clone()
        patches = model.pretrain_grid[0] * model.pretrain_grid[1]
        table[:, -patches:] += bias
        exported['pos_embed'] = table
    elif bias.any():
        raise ValueError(f'{call} has no patch bias (pre_norm=True) and the backbone no '
                         f'position table to take it: the export would drop a trained bias')


def timm_model_of(model: ColumnarBackbone) -> str:
    """The timm model of the family's ``timm_models`` table whose block options (all but
    the sizes, which :func:`timm_arguments` sets) are most of ``model``'s."""
    sizes = ('depth', 'layer_scale', 'patch_size', 'img_size')
    matching = [(sum(k not in sizes for k in options), timm_name)
                for _, options, timm_name in model.timm_models if timm_name and all(
                    _setting(model, k) == v for k, v in options.items() if k not in sizes)]
    if not matching:
        raise ValueError(f'{type(model).__name__}: no timm model of its timm_models table has '
                         f'its options; name one (--timm-model)')
    return max(matching, key=lambda match: match[0])[1]


class TimmExport(NamedTuple):
    """An export: timm's state dict, the keys taken from timm's initialisation, the
    ``timm.create_model(...)`` call that loads it, and the largest relative difference of
    the two models' features."""
    state_dict: dict
    filled: list[str]
    call: str
    difference: float


def built_backbone(family: type[ColumnarBackbone], options: dict,
                   backbone: dict) -> ColumnarBackbone:
    """``family(**options)`` holding the checkpoint's ``backbone`` tensors; refused unless
    they load exactly and timm's model has a counterpart for every option."""
    model = family(**options)
    try:
        model.load_state_dict(backbone)
    except RuntimeError as error:
        raise ValueError(f'{family.__name__}({options}) is not the checkpoint\'s backbone: '
                         f'{str(error).splitlines()[0]}') from None
    check_expressible(model)
    return model


def missing_from_export(exported: dict, expected: dict, family: type[ColumnarBackbone],
                        timm_model: str, call: str, fill_missing: bool) -> list[str]:
    """The keys of timm's model (``expected``) the export lacks, those of the classification
    stage only, with ``fill_missing``; refused where timm's model has no place for a tensor
    of the export, or where the export lacks one of the trunk."""
    unexpected = [key for key in exported if key not in expected]
    missing = [key for key in expected if key not in exported]
    if unexpected:
        raise ValueError(
            f'{call} has no tensor for {len(unexpected)} of the checkpoint '
            f'({", ".join(unexpected[:6])}): the backbone uses an option timm lacks (window '
            f'attention, relative positions, the hMLP stem) or is of another timm model '
            f'(name it)')
    classification_stage = f'{CLASS_TOKEN}|{family.checkpoint_layout.classification_keys}'
    table = family.checkpoint_layout.table()
    trunk = [key for key in missing
             if not re.match(classification_stage, table.key_to_ours(key))]
    if trunk:
        raise ValueError(
            f'the checkpoint lacks {len(trunk)} tensors of the trunk of {call} '
            f'({", ".join(trunk[:6])}): the timm options given are of another arch')
    if missing and not fill_missing:
        raise ValueError(
            f'the checkpoint lacks {len(missing)} tensors of {timm_model} '
            f'({", ".join(missing[:6])}): a dense model has no trained classification stage; '
            f'fill_missing=True (--fill-missing) takes them from timm\'s initialisation, '
            f'so that timm\'s classification features are not the trained ones')
    return missing


def load_export(theirs: nn.Module, exported: dict, call: str) -> None:
    """``exported`` loaded into timm's model strictly; a shape mismatch names another arch."""
    try:
        theirs.load_state_dict(exported, strict=True)
    except RuntimeError as error:
        mismatches = [line.strip() for line in str(error).splitlines()[1:]]
        raise ValueError(f'{call} does not load the export, another arch (name the timm '
                         f'options): {len(mismatches)} tensors differ\n  '
                         + '\n  '.join(mismatches[:6])) from None


def to_timm(family: type[ColumnarBackbone], checkpoint: dict,
            timm_model: Optional[str] = None, timm_kwargs: Optional[dict] = None,
            fill_missing: bool = False, options: Optional[dict] = None) -> TimmExport:
    """The state dict of the family's timm model holding the backbone (and classifier head,
    if any) of ``checkpoint``, loaded by timm strictly and computing the backbone's features.

    ``options``: the backbone's constructor options (default: the checkpoint's config, see
    :func:`backbone_options`). The call is ``timm.create_model(timm_model, num_classes=...,
    **timm_arguments(backbone), **timm_kwargs)``, ``timm_model`` by default from the family's
    table (:func:`timm_model_of`). Raises ValueError when the options are unknown or do not
    build the checkpoint's backbone, when they include one timm's model has no counterpart
    for (:func:`check_expressible`), when timm's model has no place for a tensor of the
    checkpoint (an option timm lacks: window attention, relative positions, the hMLP stem),
    unless ``fill_missing`` when the checkpoint lacks tensors of timm's model (a dense model's
    classification stage), and when the two models' features differ
    (:func:`check_same_features`).
    """
    backbone, head = split_checkpoint(checkpoint)
    options = options if options is not None else backbone_options(checkpoint)
    if options is None:
        raise ValueError("the checkpoint holds no config (meta['cfg']): give the backbone's "
                         "options (--options), so that the export is built and checked as "
                         "the backbone computes")
    options = {**options, 'init_cfg': None}
    model = built_backbone(family, options, backbone)
    timm_model = timm_model or timm_model_of(model)
    arguments = {**timm_arguments(model), **(timm_kwargs or {})}
    exported = {**family.checkpoint_layout.export_to_timm(backbone), **head}
    num_classes = head['head.weight'].shape[0] if 'head.weight' in head else 0
    call = create_model_call(timm_model, num_classes, arguments)
    theirs = timm.create_model(timm_model, pretrained=False, num_classes=num_classes,
                               **arguments)
    expected = theirs.state_dict()
    if PATCH_BIAS in exported and PATCH_BIAS not in expected:
        fold_patch_bias(exported, model, call)
    missing = missing_from_export(exported, expected, family, timm_model, call, fill_missing)
    exported.update({key: expected[key] for key in missing})
    load_export(theirs, exported, call)
    if model.dense:  # the blocks' maps, which timm's forward_intermediates gives
        model = family(**{**options, 'pyramid': False, 'pyramid_levels': None,
                          'out_indices': tuple(range(model.num_layers))})
        model.load_state_dict({k: v for k, v in backbone.items()
                               if not re.match(NOT_IN_TIMM, k)})
    difference = check_same_features(model, theirs, call)
    return TimmExport(exported, missing, call, difference)
