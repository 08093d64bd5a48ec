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
"""
from __future__ import annotations

from collections import Counter

from mmengine.logging import print_log
from mmengine.optim import DefaultOptimWrapperConstructor
from torch import nn

from vitdense.registry import OPTIM_WRAPPER_CONSTRUCTORS

WEIGHT_DECAY_RULES = ('timm', 'custom_keys')


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

    def add_params(self, params: list[dict], module: nn.Module, prefix: str = '',
                   is_dcn_module: int | float | None = None) -> None:
        """Default per-parameter groups, then the backbone's rules applied at the top level."""
        super().add_params(params, module, prefix, is_dcn_module)
        if not prefix:
            self._apply_backbone_rules(params, module)

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
