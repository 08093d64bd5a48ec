"""Parameter-efficient fine-tuning of a columnar backbone through Hugging Face ``peft``.

``ColumnarBackbone(peft=dict(type='LoRA', r=16, alpha=32, targets=('qkv', 'proj', 'fc1',
'fc2'), blocks=None))`` wraps the named linear layers of the trunk's blocks in peft's adapter
layers (``peft.inject_adapter_in_model``: LoRA, Hu et al. 2021; DoRA, Liu et al. 2024; LoHa;
LoKr) and freezes every tensor of the backbone that a pretrained checkpoint supplies; the
adapters and what is new in fine-tuning (the multi-layer pyramid, zero-initialised relative
position tables: its checkpoint layout's ``new_in_fine_tuning``) train, and with ``train`` the trunk's
norms or biases too. Necks, heads and ViT-Adapter's own modules are outside the backbone and
train as ever.

A wrapped layer keeps its weights as ``<layer>.base_layer.weight``: a checkpoint in the plain
layout (``<layer>.weight``) loads into it (a load hook renames the keys), so ``Pretrained``
initialisation, ``load_from`` and :func:`merge_adapters`' merged export all read plain keys.

peft imports transformers (seconds): this module is imported only by a backbone built with
``peft``.
"""
import re
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import torch
import torch.nn as nn
from peft import LoHaConfig, LoKrConfig, LoraConfig, PeftType, inject_adapter_in_model
from peft.mapping import PEFT_TYPE_TO_PREFIX_MAPPING
from peft.tuners.tuners_utils import BaseTunerLayer
from torch.nn.modules.batchnorm import _BatchNorm

#: the layers of the trunk a LoRA wraps by default: attention's qkv and output projection,
#: the FFN's two layers (of every family: GPSA's ``qk`` / ``v`` may be added)
DEFAULT_TARGETS = ('qkv', 'proj', 'fc1', 'fc2')
#: what ``train`` may add to the trainable tensors of the frozen trunk
TRAINABLE = ('norms', 'biases')
#: a norm layer's tensors, for ``train=('norms',)``
NORM_TYPES = (nn.LayerNorm, nn.GroupNorm, _BatchNorm)


@dataclass(frozen=True)
class PeftMethod:
    """How a method of the ``peft`` option becomes peft's config: its type and config
    class, the config's names of the rank scaling and dropout, and fixed settings."""
    peft_type: PeftType
    config_class: type
    alpha_name: str
    dropout_name: str
    fixed: dict = field(default_factory=dict)


#: the methods ``peft=dict(type=...)`` takes: peft's tuners of ``nn.Linear`` layers
METHODS: dict[str, PeftMethod] = {
    'LoRA': PeftMethod(PeftType.LORA, LoraConfig, 'lora_alpha', 'lora_dropout'),
    'DoRA': PeftMethod(PeftType.LORA, LoraConfig, 'lora_alpha', 'lora_dropout',
                       dict(use_dora=True)),
    'LoHa': PeftMethod(PeftType.LOHA, LoHaConfig, 'alpha', 'rank_dropout'),
    'LoKr': PeftMethod(PeftType.LOKR, LoKrConfig, 'alpha', 'rank_dropout'),
}
#: an adapter's tensor in a state dict, of any of the methods: ``<layer>.lora_A.<adapter>.
#: weight``, ``<layer>.hada_w1_a.<adapter>``, ...
ADAPTER_KEY = re.compile(r'\.(%s)' % '|'.join(sorted(
    {PEFT_TYPE_TO_PREFIX_MAPPING[method.peft_type] for method in METHODS.values()})))


class PeftTuning:
    """The ``peft`` option of a backbone: checked, applied to its trunk, and what loading
    and freezing need of it afterwards.

    Args:
        type: a method of :data:`METHODS`.
        r: the adapters' rank.
        alpha: the rank scaling (LoRA's update is ``alpha / r · B A``).
        dropout: dropout on the adapters' path (LoRA, DoRA) or of their rank (LoHa, LoKr).
        targets: names of the linear layers to wrap inside each chosen block (the last part
            of their names: ``qkv``, ``proj``, ``fc1``, ``fc2``, GPSA's ``qk`` and ``v``).
        blocks: 0-based trunk blocks that get adapters (None: all).
        train: also train the trunk's ``'norms'`` (LayerNorm, BatchNorm: affine tensors) and
            / or ``'biases'``.
        options: further settings of the method's peft config (e.g. ``use_rslora=True``,
            ``init_lora_weights='pissa'``), passed as given.
    """

    def __init__(self, type: str = 'LoRA', r: int = 16, alpha: float = 32,
                 dropout: float = 0., targets: Sequence[str] = DEFAULT_TARGETS,
                 blocks: Optional[Sequence[int]] = None, train: Sequence[str] = (),
                 **options: Any) -> None:
        if type not in METHODS:
            raise ValueError(f'peft type {type!r} is not one of {list(METHODS)}')
        if isinstance(targets, str) or not targets:
            raise ValueError(f'peft targets must be a non-empty sequence of layer names, e.g. '
                             f'{DEFAULT_TARGETS}, got {targets!r}')
        unknown = sorted(set(train) - set(TRAINABLE))
        if isinstance(train, str) or unknown:
            raise ValueError(f'peft train takes a sequence of {TRAINABLE}, got {train!r}')
        self.method, self.targets, self.train = type, tuple(targets), tuple(train)
        self.blocks = None if blocks is None else tuple(blocks)
        spec = METHODS[type]
        settings = {**spec.fixed, 'r': r, spec.alpha_name: alpha, spec.dropout_name: dropout,
                    **options}
        try:
            self.config = spec.config_class(**settings)
        except TypeError as error:
            raise ValueError(f'peft {type}: {error}; see peft.{spec.config_class.__name__} '
                             f'for its settings') from None
        #: the wrapped layers' names in the backbone (``blocks.3.attn.qkv``), once applied
        self.layer_names: tuple[str, ...] = ()

    def __repr__(self) -> str:
        return (f'PeftTuning({self.method}, targets={self.targets}, blocks={self.blocks}, '
                f'train={self.train})')

    # ------------------------------------------------------------------ building
    def apply(self, backbone: nn.Module, trained: str) -> None:
        """Wrap the target layers of ``backbone.blocks`` and freeze the backbone but the
        adapters, the tensors whose names match ``trained`` (a regex: those new in
        fine-tuning) and the norms or biases of ``train``."""
        num_layers = len(backbone.blocks)
        blocks = range(num_layers) if self.blocks is None else self.blocks
        for index in blocks:
            if not -num_layers <= index < num_layers:
                raise IndexError(f'peft blocks: block {index} out of range for {num_layers} '
                                 f'blocks')
        blocks = sorted({index % num_layers for index in blocks})
        chosen = self._target_layers(backbone.blocks, blocks)
        # a regex: peft matches it in full against the names inside ``blocks``
        self.config.target_modules = '|'.join(re.escape(name) for name in chosen)
        inject_adapter_in_model(self.config, backbone.blocks)
        self.layer_names = tuple(f'blocks.{name}' for name in chosen)
        for layer in self.wrapped_layers(backbone):
            layer.register_load_state_dict_pre_hook(_load_plain_weights)
        self._freeze(backbone, trained)

    def _target_layers(self, blocks: nn.ModuleList, indexes: Sequence[int]) -> list[str]:
        """Names (inside ``blocks``) of the layers to wrap; raises naming the problem when a
        target is in none of the blocks or is not a layer an adapter can wrap."""
        chosen, found = [], set()
        for index in indexes:
            for name, module in blocks[index].named_modules():
                parent, _, last = name.rpartition('.')
                if last not in self.targets:
                    continue
                if type(module) is not nn.Linear:
                    raise ValueError(f'peft target blocks.{index}.{name} is a '
                                     f'{type(module).__name__}; adapters wrap nn.Linear layers '
                                     f'(parallel blocks, num_parallel > 1, have none)')
                owner = blocks[index].get_submodule(parent)
                if last in getattr(owner, 'weights_read_directly', ()):
                    raise ValueError(f'peft target blocks.{index}.{name}: '
                                     f'{type(owner).__name__} reads its weight directly, not '
                                     f'through the layer, so an adapter would be bypassed')
                chosen.append(f'{index}.{name}')
                found.add(last)
        missing = [target for target in self.targets if target not in found]
        if missing:
            names = sorted({name.rpartition('.')[2] for index in indexes
                            for name, module in blocks[index].named_modules()
                            if type(module) is nn.Linear} - {
                name for module in blocks.modules()
                for name in getattr(module, 'weights_read_directly', ())})
            raise ValueError(f'peft targets {missing} name no linear layer of the chosen '
                             f'blocks; their linear layers are {names}')
        return chosen

    def _freeze(self, backbone: nn.Module, trained: str) -> None:
        adapters = {id(param) for layer in self.wrapped_layers(backbone)
                    for name, param in layer.named_parameters()
                    if not name.startswith('base_layer.')}
        norms = {id(param) for module in backbone.modules() if isinstance(module, NORM_TYPES)
                 for param in module.parameters(recurse=False)}
        for name, param in backbone.named_parameters():
            param.requires_grad = (
                id(param) in adapters or bool(re.search(trained, name))
                or 'norms' in self.train and id(param) in norms
                or 'biases' in self.train and name.endswith('.bias'))

    def wrapped_layers(self, backbone: nn.Module) -> list[BaseTunerLayer]:
        """The backbone's adapter layers (peft's tuner layers), in order."""
        return [backbone.get_submodule(name) for name in self.layer_names]

    # ------------------------------------------------------------------ training
    @staticmethod
    def keep_frozen_statistics(backbone: nn.Module) -> None:
        """Put the BatchNorms whose affine tensors are frozen in eval mode: their running
        statistics belong to the frozen pretrained weights too (as ``norm_eval``)."""
        for module in backbone.modules():
            if isinstance(module, _BatchNorm) and not any(
                    param.requires_grad for param in module.parameters(recurse=False)):
                module.eval()

    # ------------------------------------------------------------------ checkpoints
    @staticmethod
    def split_checkpoint(state_dict: dict) -> tuple[dict, dict]:
        """``state_dict`` as (the plain layout: a wrapped layer's ``base_layer`` tensors
        under the layer's own name, the adapters' tensors, of any method). Other keys are
        plain and pass through."""
        plain, adapters = {}, {}
        for key, value in state_dict.items():
            if ADAPTER_KEY.search(key):
                adapters[key] = value
            else:
                plain[key.replace('.base_layer.', '.')] = value
        return plain, adapters


def _load_plain_weights(module: nn.Module, state_dict: dict, prefix: str, *args: Any) -> None:
    """Load hook of a wrapped layer: the plain layout's ``<layer>.weight`` / ``.bias`` are
    its ``<layer>.base_layer.weight`` / ``.bias``."""
    for name in ('weight', 'bias'):
        plain, wrapped = prefix + name, f'{prefix}base_layer.{name}'
        if plain in state_dict and wrapped not in state_dict:
            state_dict[wrapped] = state_dict.pop(plain)


def merge_adapters(model: nn.Module) -> int:
    """Merge every peft adapter layer of ``model`` into its base layer (peft's ``merge``,
    checked for non-finite values) and put the base layer in its place: the model computes
    the same with plain layers, whose state dict has the plain layout. Returns how many
    layers were merged."""
    layers = [(name, module) for name, module in model.named_modules()
              if isinstance(module, BaseTunerLayer)]
    for name, layer in layers:
        layer.merge(safe_merge=True)
        parent, _, child = name.rpartition('.')
        setattr(model.get_submodule(parent), child, layer.get_base_layer())
    for module in model.modules():
        if 'peft_config' in vars(module):
            del module.peft_config
    return len(layers)

