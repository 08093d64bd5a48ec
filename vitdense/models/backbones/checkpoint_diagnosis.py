"""Checkpoint diagnosis: what a checkpoint is, what the model is, and the options that
would load the one into the other, written when a load is refused
(``CheckpointLoader.adapt`` of :mod:`.checkpoint_adaptation`), each advice checked before
it is printed. The families are found through the registry, which this module reads, so it
imports none of them.
"""
import ast
import math
import re
from typing import Callable, Optional, Sequence

import torch
import torch.nn as nn

from vitdense.registry import MODELS
from ..layers.rotary import eva02_reference_grid
from .checkpoint_layout import CheckpointLayout

BLOCK_INDEX = re.compile(r'^blocks\.(\d+)\.')
#: the prefix of the backbone's tensors in a whole OpenMMLab model's checkpoint
BACKBONE_PREFIX = 'backbone.'
#: our dense pyramid's tensors, new in fine-tuning
PYRAMID_PREFIX = 'pyramid.'
#: attention biases of a trunk block (ViT's and CaiT's qkv, ConViT's qk and v)
QKV_BIAS = re.compile(r'^blocks\.\d+\.attn\.(qkv|qk|v)\.bias$')
#: a block's gated positional self-attention (ConViT's local blocks)
GPSA_GATING = re.compile(r'^blocks\.\d+\.attn\.gating$')


def _table_prefix_rows(rows: int, grid: Optional[torch.Tensor] = None) -> int:
    """Rows of a position table before its grid (class token, registers): the saved
    ``grid`` (ours), else a square one."""
    if grid is not None and not grid.is_meta:
        return rows - math.prod(grid.tolist())
    return next(p for p in range(rows) if math.isqrt(rows - p) ** 2 == rows - p)


def describe_checkpoint(state_dict: dict) -> dict:
    """What a checkpoint in our layout is: family (the registered family whose layout's
    ``markers`` match most), depth, width, LayerScale, registers, rows of the
    position table before its grid (the class token's), normalisation after pooling
    (``fc_norm``), class-attention blocks, patch size (of a linear patch projection),
    attention biases, class token, gated positional (GPSA) blocks, the FFN's hidden width
    and whether it is gated (SwiGLU: a first map of twice the hidden width), the reference
    grid of EVA-02's rotary tables where it keeps them."""
    layouts = [layout for layout in (getattr(cls, 'checkpoint_layout', None)
                                     for cls in MODELS.module_dict.values())
               if isinstance(layout, CheckpointLayout) and layout.markers]
    scores = {layout.family: len(layout.markers) for layout in layouts if all(
        any(re.search(m, k) for k in state_dict) for m in layout.markers)}
    blocks = {int(m.group(1)) for m in map(BLOCK_INDEX.match, state_dict) if m}
    table = state_dict.get('pos_embed.weight')
    norm = state_dict.get('blocks.0.norm1.weight')
    reg_token = state_dict.get('reg_token')
    projection = state_dict.get('patch_embed.proj.weight')
    fc1, fc2 = (state_dict.get(f'blocks.0.mlp.fc{i}.weight') for i in (1, 2))
    return dict(
        family=max(scores, key=scores.get) if scores else 'unknown',
        depth=max(blocks) + 1 if blocks else 0,
        width=norm.shape[-1] if norm is not None else None,
        layer_scale=any(k.endswith('.ls1.gamma') for k in state_dict if BLOCK_INDEX.match(k)),
        registers=reg_token.shape[1] if reg_token is not None else 0,
        table_prefix_rows=None if table is None or table.dim() != 3 else
        _table_prefix_rows(table.shape[1], state_dict.get('pos_embed.table_grid')),
        fc_norm=any(k.startswith('fc_norm.') for k in state_dict),
        class_attention_blocks=len({k.split('.')[1] for k in state_dict
                                    if k.startswith('cls_blocks.')}),
        patch_size=projection.shape[-1] if projection is not None and projection.dim() == 4
        else None,
        qkv_bias=any(QKV_BIAS.match(k) for k in state_dict),
        class_token='cls_token' in state_dict,
        gpsa_blocks=sum(bool(GPSA_GATING.match(k)) for k in state_dict),
        mlp_hidden=fc2.shape[-1] if fc2 is not None else None,
        gated_mlp=fc1 is not None and fc2 is not None and fc1.shape[-2] == 2 * fc2.shape[-1],
        rotary_grid=next((eva02_reference_grid(state_dict[k], state_dict[k[:-3] + 'sin'])
                          for k in sorted(state_dict)
                          if k.endswith('rope.freqs_cos') and k[:-3] + 'sin' in state_dict),
                         None))


#: an item of the advice that sets ``Pretrained`` keys
PRETRAINED_KEYS = re.compile(r"^init_cfg=dict\(type='Pretrained', \.\.\., (.*)\)$")


def _literal(node: ast.expr):
    """The value an advised option writes: a literal, or ``dict(...)`` of literals."""
    if isinstance(node, ast.Call) and getattr(node.func, 'id', None) == 'dict' and \
            not node.args:
        return {keyword.arg: _literal(keyword.value) for keyword in node.keywords}
    return ast.literal_eval(node)


def parse_advice(options: list[str]) -> Optional[tuple[dict, dict]]:
    """The constructor options and ``Pretrained`` keys the items of an advice write (each
    its first alternative; items that start with 'or', and the notes in parentheses, left
    out), or None where an item writes no option (another family, a remark)."""
    kwargs, pretrained = {}, {}
    for item in options:
        if item.startswith('or '):
            continue
        written = re.sub(r' \(.*\)$', '', item).split(' or ')[0]
        match = PRETRAINED_KEYS.match(written)
        try:
            call = ast.parse(f'f({match.group(1) if match else written})', mode='eval').body
            values = {keyword.arg: _literal(keyword.value) for keyword in call.keywords}
        except (SyntaxError, ValueError):
            return None
        if call.args or None in values:
            return None
        if match:
            pretrained.update(values)
        elif 'arch_overrides' in values and 'arch_overrides' in kwargs:
            kwargs['arch_overrides'] = {**kwargs['arch_overrides'], **values.pop('arch_overrides')}
            kwargs.update(values)
        else:
            kwargs.update(values)
    return kwargs, pretrained


def _ratio_of(hidden: int, width: int) -> float:
    """The ``mlp_ratio`` whose hidden width ``int(width * mlp_ratio)`` is ``hidden``."""
    ratio = hidden / width
    return ratio if int(width * ratio) == hidden else math.nextafter(ratio, math.inf)


def format_facts(facts: dict) -> str:
    """One line of :func:`describe_checkpoint`'s facts."""
    rows = facts['table_prefix_rows']
    return (f"{facts['family']}, depth {facts['depth']}, width {facts['width']}, "
            f"{'with' if facts['layer_scale'] else 'no'} LayerScale, "
            f"{facts['registers']} registers, position table "
            f"{'-' if rows is None else f'with {rows} prefix rows'}, "
            f"{'fc_norm after pooling, ' if facts['fc_norm'] else ''}"
            f"{facts['class_attention_blocks']} class-attention blocks, patch size "
            f"{facts['patch_size'] or '-'}, {'' if facts['qkv_bias'] else 'no '}qkv bias, "
            f"{'' if facts['class_token'] else 'no '}class token"
            f"{f', {n} GPSA blocks' if (n := facts['gpsa_blocks']) else ''}")


def _listed(keys: Sequence[str], shown: int = 6) -> str:
    return ', '.join(keys[:shown]) + (', ...' if len(keys) > shown else '')


#: the patch grid (a side at most) of the image the advice's check runs: every tensor of a
#: trunk acts on a few tokens, and the check costs a small forward and backward
CHECK_GRID = 4


def check_dtype(tensors: dict) -> torch.dtype:
    """The precision the advice's check computes in: bfloat16 for a file of 16-bit floats
    (its own tensors, not a float32 copy twice their size: 28 GB for a 7B model's;
    float16's in bfloat16's range), else float32."""
    half = any(v.dtype in (torch.float16, torch.bfloat16) for v in tensors.values())
    return torch.bfloat16 if half else torch.float32


def forward_refusal(model: torch.nn.Module, adapted: dict) -> Optional[str]:
    """Whether ``model`` (built on the meta device) computes with the tensors ``adapted`` to
    it: they are assigned (in :func:`check_dtype`; what the checkpoint lacks, new in
    fine-tuning, zero), one image of at most ``CHECK_GRID`` patches a side goes forward and a
    random projection of the outputs backward (each gradient read as it is accumulated,
    then dropped). None where the outputs are finite and every checkpoint parameter gets a
    gradient that is not all zero; else what fails: the forward, or the tensors that have
    no effect on it (a load that is exact but computes without them)."""
    dtype = check_dtype(adapted)
    model.load_state_dict({k: v.to(dtype) if v.is_floating_point() else v
                           for k, v in adapted.items()}, strict=False, assign=True)
    for module in model.modules():
        for slots in (module._parameters, module._buffers):
            for slot, tensor in slots.items():
                if tensor is not None and tensor.is_meta:
                    zeros = torch.zeros(tensor.shape, dtype=dtype if tensor.is_floating_point()
                                        else tensor.dtype)
                    slots[slot] = torch.nn.Parameter(zeros) if isinstance(
                        tensor, torch.nn.Parameter) else zeros
    tensors = model.state_dict(keep_vars=True)
    if model.peft is not None:  # the plain layout the checkpoint was adapted to
        tensors = {**model.peft.split_checkpoint(tensors)[0]}
    parameters = {k: v for k, v in tensors.items()
                  if k in adapted and isinstance(v, torch.nn.Parameter)}
    effective: set[str] = set()
    model.eval().requires_grad_(False)
    for key, parameter in parameters.items():
        parameter.requires_grad_(True)
        parameter.register_post_accumulate_grad_hook(_effect_recorder(key, effective))
    generator = torch.Generator().manual_seed(0)
    side = [min(cells, CHECK_GRID) * model.patch_size for cells in model.pretrain_grid]
    image = torch.randn(1, model.in_channels, *side, generator=generator).to(dtype)
    with torch.enable_grad():
        outputs = [o for out in model(image) for o in (out if isinstance(out, tuple) else (out,))]
        if not all(bool(o.isfinite().all()) for o in outputs):
            return 'its forward is not finite'
        sum((o.float() * torch.randn(o.shape, generator=generator)).sum()
            for o in outputs).backward()
    inert = sorted(parameters.keys() - effective)
    if not inert:
        return None
    return f'{len(inert)} of its tensors have no effect on the forward: {_listed(inert)}'


def _effect_recorder(key: str, effective: set[str]) -> Callable[[nn.Parameter], None]:
    """A hook that adds ``key`` to ``effective`` where its parameter's gradient is not all
    zero, then drops the gradient: a check of a large model holds one gradient at a time."""
    def record(parameter: nn.Parameter) -> None:
        if parameter.grad.any():
            effective.add(key)
        parameter.grad = None
    return record


def table_size_options(model: nn.Module, converted: dict) -> list[str]:
    """``img_size`` where the position table of a checkpoint (in our layout) has a finer grid
    than ``model``'s on an axis: a load would resample it down, and the model would compute
    otherwise than the file at every input size, its own included. Built at the file's
    size, the model resamples the table from its own grid to each input's, as the sources'
    code does in forward (timm, mmseg, mmpretrain, DINOv2). A model that resamples the
    file's patch projection (``resample_patch_embed``) approximates it by choice: not named."""
    table, embed = converted.get('pos_embed.weight'), model.pos_embed
    if table is None or table.dim() != 3 or not hasattr(embed, 'checkpoint_grid') or \
            model.arch.get('resample_patch_embed'):
        return []
    grid = embed.checkpoint_grid(table, converted.get('pos_embed.table_grid'))
    projection = converted.get('patch_embed.proj.weight')
    patch = projection.shape[-1] if projection is not None and projection.dim() == 4 \
        else model.patch_size  # the file's patch, which the advice may name
    ours = tuple(size // patch for size in model.img_size)
    if grid is None or all(side <= own for side, own in zip(grid, ours)):
        return []
    rows, cols = (side * patch for side in grid)
    return [f"img_size={rows if rows == cols else (rows, cols)} (the file's position table is "
            f"a {grid[0]} x {grid[1]} grid, finer than this model's {ours[0]} x {ours[1]}, "
            f"which would resample it down)"]


class CheckpointDiagnosis:
    """The message of a refused load into ``model`` (a ``ColumnarBackbone``): the
    checkpoint's facts beside the model's and the options (constructor, ``Pretrained`` keys)
    that would load it, from the family's layout (``model.checkpoint_layout``: what marks
    its checkpoints, the layouts whose options no shape shows). ``loader``: the loader class
    that checks an advice by loading it into the model it names (None: not checked)."""

    def __init__(self, model: nn.Module, loader: Optional[type] = None) -> None:
        self.model, self.layout, self.loader = model, model.checkpoint_layout, loader
        self.name = type(model).__name__

    def mismatch_message(self, converted: dict, mismatched: list[str], missing: list[str],
                         unexpected: list[str], saved: dict,
                         unbuilt: Sequence[str] = ()) -> str:
        """What the checkpoint is, what the model is, and the options that would load it
        (a whole model's checkpoint: described by its backbone, ``prefix`` named first);
        ``saved``: the checkpoint's keys as saved, which show its source's layout;
        ``unbuilt``: what the checkpoint computes that no option builds, named instead of
        any option (none would compute what the checkpoint does)."""
        checkpoint = saved
        whole_model = not any(k in self.model.state_dict() for k in converted) and any(
            k.startswith(BACKBONE_PREFIX) for k in converted)
        if whole_model:
            converted = self.layout.convert({
                k[len(BACKBONE_PREFIX):]: v for k, v in converted.items()
                if k.startswith(BACKBONE_PREFIX)})
            saved = [k[len(BACKBONE_PREFIX):] for k in saved if k.startswith(BACKBONE_PREFIX)]
        found = describe_checkpoint(converted)
        model = self.describe_model()
        details = mismatched[:10] + [
            f'{name}: {", ".join(keys[:8])}{", ..." if len(keys) > 8 else ""}'
            for name, keys in (('missing', missing), ('unexpected', unexpected)) if keys]
        options = ([f"init_cfg=dict(type='Pretrained', ..., prefix={BACKBONE_PREFIX!r}) (the "
                    f"backbone of a whole model's checkpoint, with mmseg's model.pretrained=None)"]
                   if whole_model else []) + self.options_to_load(found, model)
        if found['family'] == model['family']:
            options += (table_size_options(self.model, converted) + self.layout_options(saved)
                        + self.layout.order_options(self.model, list(saved))
                        + self.layout.unchosen_options(self.model, list(saved), converted))
        if unbuilt:
            options = [f'no option of {self.name} loads it: the checkpoint has '
                       f'{", and ".join(unbuilt)}, which {self.name} does not build']
        elif options:
            refusal = self.advice_refusal(options, checkpoint)
            options = [refusal] if refusal else options
        if not options:
            options.append(f'no option of {self.name} loads it; build the model the '
                           f'checkpoint was trained as')
        shape = self.model
        return (f'checkpoint does not match {self.name}(arch={shape.arch_name}, '
                f'embed_dims={shape.embed_dims}, num_layers={shape.num_layers}, patch_size='
                f'{shape.patch_size}): {len(mismatched)} tensors with other shapes, '
                f'{len(missing)} missing, {len(unexpected)} unexpected\n'
                f'  checkpoint: {format_facts(found)}\n  model:      {format_facts(model)}\n'
                f'  to load it: {"; ".join(options)}' + ''.join(f'\n  {d}' for d in details))

    def advice_refusal(self, options: list[str], saved: dict) -> Optional[str]:
        """None where the model the advice ``options`` builds (this model's constructor
        options with the advised ones) loads ``saved`` exactly, its ``Pretrained`` keys
        applied, and, for a checkpoint of real tensors, computes with all of them
        (:func:`forward_refusal`); else what to say instead: no option loads it, and the
        tensors the advised model has no place or no use for. Advice that names another
        family or writes no option is not checked, nor is the advised model's own refusal."""
        advised = parse_advice(options)
        if self.loader is None or advised is None:
            return None
        kwargs, pretrained = advised
        prefix = pretrained.get('prefix') or ''
        # the checking model builds no pyramid (new in fine-tuning): its tensors are left out
        saved = {k[len(prefix):]: v for k, v in saved.items()
                 if k.startswith(prefix) and not k[len(prefix):].startswith(PYRAMID_PREFIX)}
        refused = f"no option of {self.name} loads it: the options its tensors imply " \
                  f"({'; '.join(options)})"
        failures = (ValueError, TypeError, KeyError, RuntimeError, NotImplementedError)
        try:
            with torch.device('meta'):
                model = type(self.model)(**self._advised_options(kwargs))
        except failures as error:
            return f'no option of {self.name} loads it: the advised model cannot be built ' \
                   f'({error})'
        try:
            adapted = self.loader(model, check_advice=False).adapt(
                saved, truncate=pretrained.get('truncate', False))
        except failures:
            unknown = self._unknown_tensors(model, saved)
            return f'{refused} leave it refused' + (
                f'; tensors no option builds: {_listed(unknown)}' if unknown else '')
        if any(getattr(v, 'is_meta', False) for v in saved.values()):
            return None  # a meta checkpoint (a dry run) has no forward to check
        unused = forward_refusal(model, adapted)
        return None if unused is None else f'{refused} load it, but {unused}'

    @staticmethod
    def _unknown_tensors(model: nn.Module, saved: dict) -> list[str]:
        """The tensors of ``saved`` that ``model`` (the advised one) has no place for."""
        layout = model.checkpoint_layout
        try:
            converted = layout.fit_tensors(model, layout.convert(saved))
        except (ValueError, TypeError, KeyError, RuntimeError):
            return []
        expected = model.state_dict()
        return sorted(k for k in converted
                      if k not in expected and
                      not layout.built_by_other_modes(model, k, converted))

    def _advised_options(self, advised: dict) -> dict:
        """This model's constructor options with the ``advised`` ones, for a model that
        checks the advice: without the pyramid (new in fine-tuning) and dense outputs but
        the last block's, so that every checkpoint tensor can reach its forward."""
        given = self.model.given_options()
        overrides = {**(given.get('arch_overrides') or {}), **advised.pop('arch_overrides', {})}
        return {**given, **advised, 'arch_overrides': overrides, 'init_cfg': None,
                'pretrained': None, 'pyramid': False, 'pyramid_levels': None,
                'out_indices': (-1,), 'output_cls_token': False}

    def describe_model(self) -> dict:
        """:func:`describe_checkpoint`'s facts for the checkpoint this model would load."""
        facts = describe_checkpoint(self.model.state_dict())
        table = getattr(self.model.pos_embed, 'checkpoint_prefix_tokens', None)
        return {**facts, 'family': self.name, 'depth': self.model.num_layers,
                'width': self.model.embed_dims, 'table_prefix_rows': table,
                'patch_size': facts['patch_size'] and self.model.patch_size}

    def options_to_load(self, found: dict, model: dict) -> list[str]:
        """The constructor options (and ``Pretrained`` keys) that would load a checkpoint of
        ``found`` facts into a model like this one (``model``: :meth:`describe_model`)."""
        if found['family'] == 'unknown':
            return []
        if found['family'] != model['family']:
            return [f"a {found['family']} backbone (type='vitdense.{found['family']}'), "
                    f"depth {found['depth']}, width {found['width']}"]
        options, arch = [], {}
        if (found['depth'], found['width']) != (model['depth'], model['width']):
            options.append(self.arch_option(found['depth'], found['width']))
            if found['depth'] > model['depth'] and found['width'] == model['width']:
                options.append(f"or load its first {model['depth']} blocks: "
                               f"init_cfg=dict(type='Pretrained', ..., truncate=True)")
        if found['layer_scale'] != model['layer_scale']:
            options.append('layer_scale=1e-5 (any value: the checkpoint\'s gammas replace '
                           'it)' if found['layer_scale'] else 'layer_scale=None')
        if found['patch_size'] and found['patch_size'] != model['patch_size']:
            options.append(f"patch_size={found['patch_size']}")
        if found['qkv_bias'] != model['qkv_bias']:
            arch['qkv_bias'] = found['qkv_bias']
        if found['gated_mlp'] != model['gated_mlp'] and 'swiglu_mlp' in self.model.arch_defaults:
            arch['swiglu_mlp'] = found['gated_mlp']
        if found['mlp_hidden'] and found['width'] == model['width'] and \
                found['mlp_hidden'] != model['mlp_hidden']:
            arch['mlp_ratio'] = _ratio_of(found['mlp_hidden'], found['width'])
        if found['gpsa_blocks'] != model['gpsa_blocks']:
            arch['num_local_layers'] = found['gpsa_blocks']
        if not self.model.dense and found['class_attention_blocks'] != model[
                'class_attention_blocks']:
            arch['num_cls_layers'] = found['class_attention_blocks']
        if found['registers'] != model['registers']:
            options.append(f"reg_tokens={found['registers']}")
        options += self._prefix_token_options(found, model)
        if found['fc_norm'] != model['fc_norm'] and not self.model.dense:
            options.append("out_type='avg_featmap', fc_norm=True (the pooled tokens are "
                           "normalised: MAE's fine-tuned layout)" if found['fc_norm']
                           else 'fc_norm=False')
        if arch:
            options.append(f"arch_overrides=dict("
                           f"{', '.join(f'{k}={v!r}' for k, v in arch.items())})")
        return options + self.layout.family_options(self.model, found)

    def layout_options(self, saved_keys) -> list[str]:
        """The options of the family's ``source_layouts`` that a checkpoint with
        ``saved_keys`` (as saved) has, where this model's settings differ, with the notes."""
        options, notes = {}, []
        for present, absent, layout, note in self.layout.source_layouts:
            if any(re.search(present, k) for k in saved_keys) and not (
                    absent and any(re.search(absent, k) for k in saved_keys)):
                options.update(layout)
                notes.append(note)
        differing = {name: value for name, value in options.items() if (
            self.model.arch[name] if name in self.model.arch else getattr(self.model, name))
            != value}
        if not differing:
            return []
        return [f"{', '.join(f'{k}={v!r}' for k, v in differing.items())} "
                f"({', and '.join(notes)})"]

    def _prefix_token_options(self, found: dict, model: dict) -> list[str]:
        """The options that load a checkpoint's class token, or its lack, and the prefix
        rows of its position table; a checkpoint's registers without class token need a
        model built without one (a trunk without class token drops its registers)."""
        registers, rows = found['registers'], found['table_prefix_rows']
        options = []
        class_free = not found['class_token'] and (
            model['class_token'] or registers and not self.model.num_registers)
        if class_free:
            options.append(self._class_token_free_option(registers))
        if class_free and registers:  # the advised model's table: the registers' rows
            differs = rows is not None and rows != (
                0 if self.model.arch.get('no_embed_class') else registers)
        else:
            differs = not class_free and self._class_row_differs_by(rows)
        if differs:
            kind = "the class token's row" if found['class_token'] else "the registers' rows"
            options.append(f"no_embed_class={rows == 0} (a position table "
                           f"{'without' if rows == 0 else 'with'} {kind})")
        return options

    def _class_token_free_option(self, registers: int) -> str:
        """The option that loads a checkpoint without class token: a dense trunk without
        one (``dense_class_token=False``) where it has no registers, else the family's
        ``class_token=False`` (its registers kept), where the family has it."""
        if self.model.dense and not registers:
            return 'dense_class_token=False (the checkpoint has no class token)'
        if 'class_token' in self.model.arch_defaults:
            pooled = ", out_type='avg_featmap'" if self.model.out_type == 'cls_token' else ''
            return f'class_token=False{pooled} (the checkpoint has no class token)'
        return (f'no option of {self.name} builds a model without class token '
                f'{"and with registers" if registers else "for classification"}')

    def arch_option(self, depth: int, width: Optional[int]) -> str:
        """The ``arch`` (names of ``arch_zoo``) of a trunk of ``depth`` blocks of ``width``,
        else ``depth=`` where the width is this model's."""
        names = [name for name, arch in self.model.arch_zoo.items()
                 if (arch['num_layers'], arch['embed_dims']) == (depth, width)]
        if names:
            return ' or '.join(f'arch={name!r}' for name in names)
        if width == self.model.embed_dims:
            return f'depth={depth}'
        return f'arch=dict(embed_dims={width}, num_layers={depth}, num_heads=...)'

    def _class_row_differs_by(self, rows: Optional[int]) -> bool:
        """Whether a position table with ``rows`` prefix rows is another layout than the
        model's (which reads tables with ``checkpoint_prefix_tokens`` rows, or as many as
        it keeps)."""
        embed = self.model.pos_embed
        if rows is None or not hasattr(embed, 'checkpoint_prefix_tokens'):
            return False
        return rows not in (embed.num_prefix_tokens, embed.checkpoint_prefix_tokens)

    def class_row_differs(self, converted: dict) -> bool:
        """Whether the position table of ``converted`` has another class-row layout than
        the model's (a strict load refuses it)."""
        table = converted.get('pos_embed.weight')
        return table is not None and table.dim() == 3 and self._class_row_differs_by(
            _table_prefix_rows(table.shape[1], converted.get('pos_embed.table_grid')))
