"""What training does to and reads from a columnar backbone: its frozen stages, each
parameter's layer id for layer-wise learning-rate decay and the parameters trained without
weight decay (what the optimizer constructors read)."""
import re
from typing import Optional, Sequence

import torch.nn as nn
from torch.nn.modules.batchnorm import _BatchNorm

#: parameters before the first block, layer id 0 (the class token where it joins there)
EMBEDDING_PARAMETERS = ('patch_embed', 'pos_embed', 'reg_token', 'norm_pre')


def layer_depth(name: str, num_layers: int, class_token_layer: int) -> tuple[int, int]:
    """The layer id of parameter ``name`` and the number of ids: the embeddings 0, block i
    i + 1, the rest (class-attention stage, norms) the last."""
    num_ids = num_layers + 2
    if name.startswith(EMBEDDING_PARAMETERS) or (name == 'cls_token' and
                                                 class_token_layer == 0):
        return 0, num_ids
    if name.startswith('blocks.'):
        return int(name.split('.')[1]) + 1, num_ids
    return num_ids - 1, num_ids


def no_weight_decay_pattern(family_names: tuple[str, ...]) -> re.Pattern:
    """The names of parameters trained without weight decay: position encodings, class
    token, registers, LayerScale gammas, relative position tables (as Li et al. 2022) and
    the parameters whose last part is one of ``family_names``."""
    names = '|'.join(('gamma',) + family_names)
    return re.compile(rf'^(cls_token|reg_token|pos_embed\..*|.*\.({names})|.*\.rel_pos\..*)$')


def freeze(modules: Sequence[Optional[nn.Module]],
           tokens: Sequence[Optional[nn.Parameter]]) -> None:
    """``modules`` in eval mode, their parameters and ``tokens`` without gradients (those
    not None)."""
    for module in modules:
        if module is not None:
            module.eval()
            module.requires_grad_(False)
    for token in tokens:
        if token is not None:
            token.requires_grad = False


class TrainingModes:
    """A columnar backbone's training-side methods (a base of ``ColumnarBackbone``): frozen
    stages and ``norm_eval`` kept through ``train()``, and the layer ids and weight-decay
    exclusions the optimizer constructors read."""

    def _freeze_stages(self) -> None:
        """The embeddings and the first ``frozen_stages`` blocks frozen, and the class token
        once they reach ``class_token_layer``."""
        if self.frozen_stages >= 0:
            class_token = self.cls_token if self.frozen_stages >= self.class_token_layer else None
            freeze([self.patch_embed, self.pos_embed, self.norm_pre,
                    *self.blocks[:self.frozen_stages]], [self.reg_token, class_token])

    def train(self, mode: bool = True) -> 'TrainingModes':
        super().train(mode)
        self._freeze_stages()
        if mode and self.peft is not None:
            self.peft.keep_frozen_statistics(self)
        if mode and self.norm_eval:
            for module in self.modules():
                if isinstance(module, _BatchNorm):
                    module.eval()
        return self

    def get_layer_depth(self, param_name: str, prefix: str = '') -> tuple[int, int]:
        """Layer id for layer-wise lr decay: embeddings 0, block i -> i + 1, the rest last
        (:func:`layer_depth`)."""
        if not param_name.startswith(prefix):
            return self.num_layers + 1, self.num_layers + 2
        return layer_depth(param_name[len(prefix):], self.num_layers, self.class_token_layer)

    def no_weight_decay(self) -> set[str]:
        """Parameters trained without weight decay (:func:`no_weight_decay_pattern`,
        with the family's ``no_weight_decay_names``)."""
        keep = no_weight_decay_pattern(self.no_weight_decay_names)
        return {name for name, _ in self.named_parameters() if keep.match(name)}
