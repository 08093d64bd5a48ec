"""The columnar backbones' constructor options, resolved and checked: the arch settings, the
blocks and pyramid levels read, each block's attention layout, mmseg's ``pretrained`` and
``peft``. Each is a function of the values it reads and raises naming the fix, so that
:class:`.base.ColumnarBackbone` only wires them.
"""
import inspect
import warnings
from typing import TYPE_CHECKING, NamedTuple, Optional, Sequence, Union

import torch.nn as nn

from ..layers.grid import Grid
from ..layers.pyramid import PYRAMID_STRIDES, check_levels

if TYPE_CHECKING:
    from .peft_tuning import PeftTuning

OUT_TYPES = ('featmap', 'cls_token', 'avg_featmap')
#: how inputs that are not a multiple of the patch size (or of the pyramid's 32) are met
PADDINGS = ('image', 'stem')
BATCH_NORM_TYPES = ('BN', 'SyncBN')
OFFICIAL_OUT_INDICES = {12: (3, 5, 7, 11), 24: (7, 11, 15, 23)}


class AttentionLayout(NamedTuple):
    """How a trunk block's token mixer attends (plain-backbone detection, Li et al. 2022,
    §3): within windows of
    ``window_size`` tokens a side (0: globally), with relative position tables for
    ``rel_pos_grid`` (None: without)."""
    window_size: int = 0
    rel_pos_grid: Optional[Grid] = None


def to_pair(size: Union[int, Sequence[int]]) -> tuple[int, int]:
    return (size, size) if isinstance(size, int) else tuple(size)


def arch_settings(family: type, arch: Union[str, dict]) -> dict:
    """``family``'s arch settings for a table name or a custom dict (``depth``, timm's name,
    for ``num_layers`` accepted), with the family's defaults."""
    if isinstance(arch, str):
        if arch not in family.arch_zoo:
            raise KeyError(f'unknown {family.__name__} arch {arch!r}; '
                           f'choose one of {sorted(family.arch_zoo)} or pass a dict')
        return {**family.arch_defaults, **family.arch_zoo[arch]}
    if not isinstance(arch, dict):
        raise TypeError(f'arch must be a str or dict, got {type(arch).__name__}')
    if 'depth' in arch:
        if 'num_layers' in arch:
            raise KeyError(f'custom {family.__name__} arch: depth and num_layers both given '
                           f'({arch}); they are one setting, give one')
        arch = {('num_layers' if k == 'depth' else k): v for k, v in arch.items()}
    missing = [k for k in family.arch_keys if k not in arch]
    unknown = unknown_arch_keys(family, arch)
    if missing or unknown:
        raise KeyError(f'custom {family.__name__} arch: missing keys {missing}, unknown keys '
                       f'{unknown}; allowed: '
                       f'{list(family.arch_keys) + list(family.arch_defaults)}')
    return {**family.arch_defaults, **arch}


def unknown_arch_keys(family: type, settings: dict) -> list[str]:
    """The keys of ``settings`` that are no arch setting of ``family``."""
    return [k for k in settings if k not in family.arch_keys and k not in family.arch_defaults]


def constructor_parameters(cls: type, root: type) -> inspect.Signature:
    """The keyword signature of ``cls(...)``: the parameters of every ``__init__`` from
    ``cls`` up to ``root``'s, the nearest class's first, without the ``*args`` /
    ``**kwargs`` each passes on."""
    parameters: dict[str, inspect.Parameter] = {}
    for base in cls.__mro__:
        if '__init__' not in vars(base):
            continue
        own = list(inspect.signature(vars(base)['__init__']).parameters.items())[1:]
        for name, parameter in own:
            if parameter.kind not in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
                parameters.setdefault(name, parameter)
        if base is root:
            break
    arch = parameters.pop('arch').replace(kind=inspect.Parameter.POSITIONAL_OR_KEYWORD)
    others = [parameter.replace(kind=inspect.Parameter.KEYWORD_ONLY)
              for parameter in parameters.values()]
    return inspect.Signature([arch, *others], return_annotation=None)


def pretrained_init_cfg(pretrained: Optional[str],
                        init_cfg: Optional[Union[dict, list]]) -> Optional[Union[dict, list]]:
    """``init_cfg`` with mmseg's ``pretrained`` argument turned into its ``Pretrained``
    entry, as mmseg's own backbones (its VisionTransformer) do."""
    if pretrained is None:
        return init_cfg
    if not isinstance(pretrained, str):
        raise TypeError(f'pretrained must be a checkpoint path or URL (str) or None, got '
                        f'{type(pretrained).__name__}')
    if init_cfg is not None:
        raise ValueError(f'pretrained={pretrained!r} and init_cfg={init_cfg} both given: set '
                         f'init_cfg=dict(type=\'Pretrained\', checkpoint=...) alone (in an '
                         f'mmseg config, model.pretrained=None)')
    warnings.warn(f'pretrained={pretrained!r} (mmseg\'s model-level option) is read as '
                  f'init_cfg=dict(type=\'Pretrained\', checkpoint={pretrained!r}); say it '
                  f'with init_cfg, as the backbone\'s own option', FutureWarning)
    return dict(type='Pretrained', checkpoint=pretrained)


def check_options(out_type: str, padding: str, with_cp: Union[bool, int],
                  fc_norm: bool) -> None:
    """Refuse an unknown ``out_type`` or ``padding``, a negative ``with_cp`` and
    ``fc_norm`` where no tokens are averaged."""
    if out_type not in OUT_TYPES:
        raise ValueError(f'unknown out_type {out_type!r}; expected one of {OUT_TYPES}')
    if padding not in PADDINGS:
        raise ValueError(f'unknown padding {padding!r}; expected one of {PADDINGS}')
    if not isinstance(with_cp, int) or with_cp < 0:
        raise ValueError(f'with_cp must be True, False or a number of blocks >= 0, got '
                         f'{with_cp!r}')
    if fc_norm and out_type == 'cls_token':
        raise ValueError("fc_norm normalises averaged tokens: it needs out_type="
                         "'avg_featmap' (or 'featmap', which builds no norm)")


def batch_norm_type(norm_cfg: dict) -> str:
    """The type of the backbone's BatchNorm layers that ``norm_cfg`` names."""
    norm_type = norm_cfg.get('type')
    if norm_type not in BATCH_NORM_TYPES or set(norm_cfg) != {'type'}:
        raise ValueError(f'norm_cfg sets the type of the backbone\'s BatchNorm layers: '
                         f'dict(type=...) with a type in {list(BATCH_NORM_TYPES)}, got '
                         f'{norm_cfg}')
    return norm_type


def pyramid_levels_read(pyramid_levels: Optional[Sequence[int]],
                        pyramid: bool) -> tuple[int, ...]:
    """The pyramid's levels that come out; () without the multi-layer pyramid."""
    if not pyramid:
        if pyramid_levels is not None:
            raise ValueError(f'pyramid_levels {pyramid_levels} chooses the multi-layer '
                             f"pyramid's levels, but pyramid=False (or out_type is not "
                             f"'featmap'); the simple feature pyramid chooses its levels by "
                             f'its scale_factors')
        return ()
    return check_levels(range(len(PYRAMID_STRIDES)) if pyramid_levels is None
                        else pyramid_levels)


def default_out_indices(num_layers: int) -> tuple[int, ...]:
    """The official dense recipes' blocks for 12 and 24 blocks (El-Nouby et al. 2021,
    §4.2); otherwise the ends of the four quarters, each once (fewer than four for a trunk
    of fewer than four blocks)."""
    if num_layers in OFFICIAL_OUT_INDICES:
        return OFFICIAL_OUT_INDICES[num_layers]
    return tuple(sorted({max(num_layers * q // 4 - 1, 0) for q in (1, 2, 3, 4)}))


def out_indices_read(out_indices: Optional[Sequence[int]], num_layers: int,
                     levels: tuple[int, ...]) -> tuple[int, ...]:
    """The 0-based blocks whose outputs form the dense features, one per pyramid level of
    ``levels`` where the multi-layer pyramid follows."""
    if out_indices is None:
        out_indices = default_out_indices(num_layers)
        if levels and len(out_indices) == len(PYRAMID_STRIDES):
            out_indices = [out_indices[level] for level in levels]
    if isinstance(out_indices, int):
        out_indices = [out_indices]
    checked = []
    for index in out_indices:
        if not -num_layers <= index < num_layers:
            raise IndexError(f'out_indices: block {index} out of range for '
                             f'{num_layers} blocks')
        checked.append(index % num_layers)
    if len(set(checked)) != len(checked) or checked != sorted(checked):
        raise ValueError(f'out_indices must be increasing and unique, got {out_indices}')
    if levels and len(checked) != len(levels):
        strides = '/'.join(str(PYRAMID_STRIDES[level]) for level in levels)
        raise ValueError(f'the pyramid\'s {len(levels)} levels (strides {strides}, '
                         f'pyramid_levels={levels}) take one out_index each, got '
                         f'{len(checked)}: {out_indices}; set pyramid_levels to the levels '
                         f'wanted, or pyramid=False for the blocks\' maps alone')
    return tuple(checked)


def attention_layouts(num_layers: int, patch_size: int, window_size: int,
                      window_block_indexes: Optional[Sequence[int]], use_rel_pos: bool,
                      rel_pos_img_size: Union[int, Sequence[int]]
                      ) -> tuple[AttentionLayout, ...]:
    """Each of ``num_layers`` blocks' :class:`AttentionLayout`: windows of ``window_size``
    in ``window_block_indexes`` (None: all), relative position tables for the window or,
    in global blocks, for the grid of ``rel_pos_img_size`` where ``use_rel_pos``."""
    if window_size < 0:
        raise ValueError(f'window_size must be >= 0, got {window_size}')
    if window_block_indexes is not None and any(
            not -num_layers <= i < num_layers for i in window_block_indexes):
        raise IndexError(f'window_block_indexes {list(window_block_indexes)} out of range '
                         f'for {num_layers} blocks')
    windowed = set(range(num_layers) if window_block_indexes is None else
                   (i % num_layers for i in window_block_indexes))
    if not (window_size and windowed) and not use_rel_pos:
        return (AttentionLayout(),) * num_layers
    global_grid = tuple(size // patch_size for size in to_pair(rel_pos_img_size))
    layouts = []
    for index in range(num_layers):
        window = window_size if index in windowed else 0
        grid = ((window, window) if window else global_grid) if use_rel_pos else None
        layouts.append(AttentionLayout(window, grid))
    return tuple(layouts)


def check_token_layouts(family: str, token_attention: bool, num_prefix_tokens: int,
                        class_token_layer: int) -> None:
    """Refuse window attention and relative positions to a family without token attention
    or a trunk that carries prefix tokens (from block ``class_token_layer``)."""
    if not token_attention:
        raise ValueError(f'{family} has no token attention: window attention and relative '
                         f'positions apply to the families with token attention; use the '
                         f'simple pyramid alone')
    if num_prefix_tokens:
        raise ValueError(f'window attention and relative positions take patch tokens only, '
                         f'but the trunk of {family} carries {num_prefix_tokens} prefix '
                         f'tokens (class token from block {class_token_layer}, registers): '
                         f'set dense_class_token=False')


def apply_peft(model: nn.Module, peft: Optional[dict]) -> Optional['PeftTuning']:
    """The ``peft`` option's adapters applied to ``model``, a built, initialised backbone
    (its ``new_in_fine_tuning`` tensors train); None without the option."""
    if peft is None:
        return None
    if not isinstance(peft, dict):
        raise TypeError(f'peft must be a dict such as dict(type=\'LoRA\', r=16, '
                        f'alpha=32), got {type(peft).__name__}')
    # imported here: peft imports transformers, seconds that a backbone without it skips
    try:
        from .peft_tuning import PeftTuning
    except ModuleNotFoundError as error:
        raise ModuleNotFoundError(f'the peft option needs the peft package ({error}): '
                                  f'bash tools/install.sh, or pip install peft==0.21.0 '
                                  f'"transformers<5"') from error
    tuning = PeftTuning(**peft)
    tuning.apply(model, model.checkpoint_layout.new_in_fine_tuning)
    return tuning


def checked_overrides(family: type, overrides: dict) -> dict:
    """``overrides``, each key checked to be an arch setting of ``family``."""
    unknown = unknown_arch_keys(family, overrides)
    if unknown:
        raise KeyError(f'{family.__name__}: unknown arch settings {unknown} in '
                       f'arch_overrides; allowed: '
                       f'{list(family.arch_keys) + list(family.arch_defaults)}')
    return overrides


def check_output_cls_token(family: str, out_type: str, pyramid_levels: tuple[int, ...],
                           out_indices: tuple[int, ...], class_token_layer: Optional[int]
                           ) -> None:
    """Refuse ``output_cls_token`` where a probed block's output has no class token to pair
    with its map (``class_token_layer``, where it joins the trunk: None where it does not),
    or where the pyramid, which takes maps alone, follows."""
    if out_type != 'featmap' or pyramid_levels:
        raise ValueError(f"output_cls_token pairs each block's map with its class token: "
                         f"it needs out_type='featmap' and pyramid=False, got out_type="
                         f"{out_type!r}, pyramid={bool(pyramid_levels)}")
    if class_token_layer is None:
        raise ValueError(f'output_cls_token: the dense trunk of {family} carries no class '
                         f'token (it joins after the trunk, in the classification stage, '
                         f'or the model is built without it: dense_class_token=False, '
                         f'class_token=False)')
    if out_indices[0] < class_token_layer:
        raise ValueError(f'output_cls_token: the class token of {family} joins before block '
                         f'{class_token_layer}, so block {out_indices[0]} of out_indices '
                         f'{list(out_indices)} has none; read blocks >= {class_token_layer}')
