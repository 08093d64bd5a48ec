"""What training does to and reads from a columnar backbone: its frozen stages, each
parameter's layer id for layer-wise learning-rate decay and the parameters trained without
weight decay (what the optimizer constructors read)."""
import re
from typing import Optional, Sequence

import torch.nn as nn

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
