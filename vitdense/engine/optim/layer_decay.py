"""Optimizer wrapper constructor for columnar backbones inside detectors, segmentors, classifiers.

Recipes differ in which parameters train without weight decay, so a config names its rule:

- ``'custom_keys'``: mmengine's paramwise options only. The official XCiT dense configs
  (``detection/configs``, ``semantic_segmentation/configs`` of facebookresearch/xcit, after
  Swin) give ``custom_keys={'norm': dict(decay_mult=0.)}``: the LayerNorms alone (every name
  containing ``norm``); biases, BatchNorms, LayerScale, temperatures, the position
  projection, necks and heads all decay.
- ``'timm'``: every one-dimensional parameter anywhere in the model plus the backbone's
  ``no_weight_decay()`` names (position encodings, class token, LayerScale, temperatures,
  gates): timm's optimizer factory, which the DeiT / CaiT / XCiT / ConViT ImageNet code uses.

Fine-tuning recipes of ViT-like models also scale the learning rate down layer by layer
towards the input (layer-wise lr decay, BEiT / MAE style) through the backbone's
``get_layer_depth()``.

mmengine's constructor makes one parameter group per tensor (198 for a ViT-B detector, 485
for CaiT-S24), and an optimizer steps group by group: a foreach or fused AdamW launches its
kernels once per group. This constructor joins the groups whose options are all equal (one
per learning rate and weight decay: with layer decay, one per depth and decay at most), and
loads the optimizer state of checkpoints saved with one group per tensor onto those groups.
"""
from __future__ import annotations

from collections import Counter
from functools import partial
from typing import Any

import torch
from mmengine.logging import print_log
from mmengine.optim import DefaultOptimWrapperConstructor, OptimWrapper
from torch import nn
from torch.optim import Optimizer

from vitdense.registry import OPTIM_WRAPPER_CONSTRUCTORS

WEIGHT_DECAY_RULES = ('timm', 'custom_keys')
#: what mmengine copies from ``custom_keys`` into a group besides the options it sets: the
#: multipliers already applied to ``lr`` and ``weight_decay``, which no optimizer reads
MULTIPLIERS = ('lr_mult', 'decay_mult')


@OPTIM_WRAPPER_CONSTRUCTORS.register_module()
class LayerDecayOptimWrapperConstructor(DefaultOptimWrapperConstructor):
    """mmengine's default constructor plus no-decay names and layer-wise lr decay.

    ``paramwise_cfg`` takes every option of ``DefaultOptimWrapperConstructor`` and:

    - ``weight_decay_rule``: ``'timm'`` (default) or ``'custom_keys'`` (see the module
      docstring). Under ``'timm'``, ``flat_decay_mult`` defaults to 0 (one-dimensional
      parameters take no weight decay anywhere in the model) and the parameters the backbone
      names in ``no_weight_decay()`` take none either; ``'custom_keys'`` adds nothing to
      mmengine's options;
    - ``layer_decay_rate`` (default 1.0, off): a backbone parameter at layer id ``i`` of
      ``n`` (``backbone.get_layer_depth``) gets ``lr * rate ** (n - 1 - i)``; necks and heads,
      which are trained from scratch, keep the full learning rate.

    The backbone is ``model.backbone`` (mmdet, mmseg, mmpretrain models) or the model itself.
    The per-tensor groups are then merged where every option is equal
    (:func:`merge_equal_groups`); the optimizer loads state saved in either layout
    (:func:`load_per_tensor_state`).
    """

    def __init__(self, optim_wrapper_cfg: dict, paramwise_cfg: dict | None = None):
        paramwise_cfg = dict(paramwise_cfg or {})
        self.layer_decay_rate = float(paramwise_cfg.pop('layer_decay_rate', 1.0))
        self.weight_decay_rule = paramwise_cfg.pop('weight_decay_rule', 'timm')
        if self.weight_decay_rule not in WEIGHT_DECAY_RULES:
            raise ValueError(f'paramwise_cfg.weight_decay_rule must be one of '
                             f'{WEIGHT_DECAY_RULES}, got {self.weight_decay_rule!r}')
        if self.weight_decay_rule == 'timm':
            paramwise_cfg.setdefault('flat_decay_mult', 0.0)
        super().__init__(optim_wrapper_cfg, paramwise_cfg)
        self._layout: list[list[int]] | None = None

    def __call__(self, model: nn.Module) -> OptimWrapper:
        """The wrapper of merged groups, its optimizer also loading per-tensor state."""
        self._layout = None
        optim_wrapper = super().__call__(model)
        if self._layout is not None:
            optim_wrapper.optimizer.register_load_state_dict_pre_hook(
                partial(load_per_tensor_state, self._layout))
        return optim_wrapper

    def add_params(self, params: list[dict], module: nn.Module, prefix: str = '',
                   is_dcn_module: int | float | None = None) -> None:
        """Default per-parameter groups, then, at the top level, the backbone's rules
        applied and the groups of equal options merged."""
        super().add_params(params, module, prefix, is_dcn_module)
        if not prefix:
            self._apply_backbone_rules(params, module)
            merged, self._layout = merge_equal_groups(params, self.optimizer_cfg)
            print_log(f'{type(self).__name__}: {len(params)} parameter tensors in '
                      f'{len(merged)} groups of equal options', logger='current')
            params[:] = merged

    def _apply_backbone_rules(self, params: list[dict], model: nn.Module) -> None:
        backbone, prefix = ((model.backbone, 'backbone.') if hasattr(model, 'backbone')
                            else (model, ''))
        if self.layer_decay_rate != 1.0 and not hasattr(backbone, 'get_layer_depth'):
            raise TypeError(f'layer_decay_rate={self.layer_decay_rate} needs a backbone with '
                            f'get_layer_depth(); {type(backbone).__name__} has none')
        no_decay = (set(backbone.no_weight_decay())
                    if self.weight_decay_rule == 'timm' and hasattr(backbone, 'no_weight_decay')
                    else set())
        names = {id(param): name for name, param in model.named_parameters()}
        scales: Counter = Counter()
        for group in params:
            name = names[id(group['params'][0])]
            if not name.startswith(prefix):
                continue
            local = name[len(prefix):]
            if self.base_wd is not None and any(
                    local == key or local.startswith(key + '.') for key in no_decay):
                group['weight_decay'] = 0.0
            if self.layer_decay_rate != 1.0:
                layer_id, num_layers = backbone.get_layer_depth(name, prefix)
                scale = self.layer_decay_rate ** (num_layers - 1 - layer_id)
                group['lr'] = group.get('lr', self.base_lr) * scale
                scales[round(scale, 6)] += 1
        no_decay_count = sum(group.get('weight_decay') == 0.0 for group in params)
        print_log(f'{type(self).__name__}: {no_decay_count}/{len(params)} parameter tensors '
                  f'without weight decay; backbone lr scales {dict(sorted(scales.items()))}',
                  logger='current')


def _frozen(value: Any) -> Any:
    """``value`` made hashable and comparable by value (lists, tuples, tensors)."""
    if isinstance(value, torch.Tensor):
        return ('tensor', value.dtype, tuple(value.shape), tuple(value.flatten().tolist()))
    if isinstance(value, (list, tuple)):
        return tuple(_frozen(item) for item in value)
    return value


def _options(group: dict, defaults: dict) -> tuple:
    """A group's options other than its parameters and :data:`MULTIPLIERS`, those it omits
    read from ``defaults`` (the optimizer's configuration) where it sets them."""
    keys = (set(group) | set(defaults)) - {'params', 'type', *MULTIPLIERS}
    return tuple(sorted((key, _frozen(group.get(key, defaults.get(key)))) for key in keys))


def merge_equal_groups(groups: list[dict], defaults: dict
                       ) -> tuple[list[dict], list[list[int]]]:
    """``groups`` with those of equal options joined, in the order each option set first
    appears (the first group keeps its place: mmengine logs its learning rate), without
    :data:`MULTIPLIERS`; and for each joined group the positions of its parameters among
    all of ``groups``' parameters in order: what :func:`load_per_tensor_state` maps saved
    state by."""
    merged: dict[tuple, dict] = {}
    layout: dict[tuple, list[int]] = {}
    position = 0
    for group in groups:
        key = _options(group, defaults)
        if key not in merged:
            merged[key] = {k: v for k, v in group.items() if k not in MULTIPLIERS}
            merged[key]['params'] = []
            layout[key] = []
        merged[key]['params'] += list(group['params'])
        layout[key] += range(position, position + len(group['params']))
        position += len(group['params'])
    return list(merged.values()), list(layout.values())


def load_per_tensor_state(layout: list[list[int]], optimizer: Optimizer,
                          state_dict: dict) -> dict:
    """Optimizer load pre-hook: a state dict saved with one group per parameter (before
    groups were merged) rewritten to ``optimizer``'s merged groups, each parameter's state
    moved to its place (``layout``: :func:`merge_equal_groups`'); a state dict of the merged
    layout is returned as it is. Exact or it raises: the saved groups that are merged here
    must hold equal options (:data:`MULTIPLIERS` aside), and each saved state tensor the
    shape of its parameter."""
    saved = state_dict['param_groups']
    if len(saved) == len(optimizer.param_groups):
        return state_dict
    per_tensor = sum(len(positions) for positions in layout)
    if len(saved) != per_tensor or any(len(group['params']) != 1 for group in saved):
        raise ValueError(
            f'the optimizer state to load has {len(saved)} parameter groups; this optimizer '
            f'has {len(optimizer.param_groups)} (merged from {per_tensor} parameters, one '
            f'group each in older checkpoints): it was saved for another model or '
            f'paramwise_cfg; resume with the config it was trained with')
    params = [param for group in optimizer.param_groups for param in group['params']]
    groups, state, index = [], {}, 0
    def options_of(group: dict) -> dict:
        return {key: value for key, value in group.items()
                if key not in ('params', *MULTIPLIERS)}

    for positions in layout:
        options = options_of(saved[positions[0]])
        ids = []
        for position in positions:
            theirs = options_of(saved[position])
            if _frozen(sorted(theirs.items())) != _frozen(sorted(options.items())):
                raise ValueError(
                    f'saved parameter groups {positions[0]} and {position} are merged here but '
                    f'hold different options ({options} against {theirs}): the checkpoint was '
                    f'saved with another paramwise_cfg; resume with the config it was trained '
                    f'with')
            entry = state_dict['state'].get(saved[position]['params'][0])
            if entry is not None:
                for name, value in entry.items():
                    if torch.is_tensor(value) and value.dim() and \
                            value.shape != params[index].shape:
                        raise ValueError(
                            f'saved optimizer state {name!r} of parameter {position} has shape '
                            f'{tuple(value.shape)}, the parameter {tuple(params[index].shape)}: '
                            f'the checkpoint is of another model')
                state[index] = entry
            ids.append(index)
            index += 1
        groups.append(dict(options, params=ids))
    return dict(state_dict, state=state, param_groups=groups)
