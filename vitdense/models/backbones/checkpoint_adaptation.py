"""Checkpoint adaptation: any checkpoint layout a family reads, mapped onto one model.

The columnar backbones read official releases, timm state dicts and their own checkpoints.
Keys are renamed by rules kept as data (``SHARED_CHECKPOINT_RULES`` for every family, then
the family's ``checkpoint_rules``), tensors split or stacked differently are merged, and
what the model's mode does not build is dropped, before torch's own ``load_state_dict``
(which takes our layout only). ``ColumnarBackbone`` gets this from :class:`CheckpointAdaptation`.
"""
import math
import re
from typing import Any, Optional

import torch
from mmengine.logging import MMLogger
from mmengine.runner import checkpoint as mmengine_checkpoint

Rule = tuple[str, str]
#: key renames official layouts of every family need, applied before a family's own
#: ``checkpoint_rules``: a learned position table saved as a bare tensor and a block's
#: LayerScale gammas named gamma_1 / gamma_2 or gamma1 / gamma2 (as the official releases
#: of the families save them), ours being ls1.gamma / ls2.gamma as in timm, and
#: OpenMMLab's FFN (``ffn.layers``: a linear with its activation, then a linear)
SHARED_CHECKPOINT_RULES: tuple[Rule, ...] = (
    (r'^pos_embed$', 'pos_embed.weight'),
    (r'\.gamma_?([12])$', r'.ls\1.gamma'),
    (r'\.ffn\.layers\.0\.0\.', '.mlp.fc1.'),
    (r'\.ffn\.layers\.1\.', '.mlp.fc2.'),
)


def rename_key(key: str, rules: tuple[Rule, ...]) -> str:
    """``key`` after every (regex, replacement) rule in turn."""
    for pattern, replacement in rules:
        key = re.sub(pattern, replacement, key)
    return key


CLASS_ATTENTION_SPLIT = re.compile(r'^cls_blocks\.\d+\.attn\.(qkv|k)\.')
#: our keys -> timm's where every family's timm model names them differently (the inverse of
#: ``SHARED_CHECKPOINT_RULES`` for timm's names): timm keeps the position table as a bare tensor
SHARED_TIMM_RULES: tuple[Rule, ...] = (
    (r'^pos_embed\.weight$', 'pos_embed'),
)
#: our tensors timm's models have no module for: the dense pyramid, new in fine-tuning
NOT_IN_TIMM = r'^pyramid\.'
BLOCK_INDEX = re.compile(r'^blocks\.(\d+)\.')
#: where a checkpoint file keeps its weights, in the order timm's ``load_state_dict`` reads
#: them: the EMA weights of a timm ``train.py`` checkpoint first, as timm evaluates and
#: fine-tunes them, then a whole model's ``state_dict``, then a release's ``model``
WEIGHT_ENTRIES = ('state_dict_ema', 'model_ema', 'state_dict', 'model')
#: the prefix of the backbone's tensors in a whole OpenMMLab model's checkpoint
BACKBONE_PREFIX = 'backbone.'
#: attention biases of a trunk block (ViT's and CaiT's qkv, ConViT's qk and v)
QKV_BIAS = re.compile(r'^blocks\.\d+\.attn\.(qkv|qk|v)\.bias$')
#: a block's gated positional self-attention (ConViT's local blocks)
GPSA_GATING = re.compile(r'^blocks\.\d+\.attn\.gating$')


def checkpoint_weights(checkpoint: dict) -> dict:
    """The weights of a loaded checkpoint file: the first of ``WEIGHT_ENTRIES`` it holds
    (logged when it is an EMA), else the file's dict itself; DataParallel's ``module.``
    stripped."""
    for entry in WEIGHT_ENTRIES:
        if isinstance(checkpoint.get(entry), dict):
            if entry.endswith('ema'):
                MMLogger.get_current_instance().info(
                    f'the checkpoint holds EMA weights: reading {entry!r}, as timm does')
            checkpoint = checkpoint[entry]
            break
    return {key[len('module.'):] if key.startswith('module.') else key: value
            for key, value in checkpoint.items()}


def _table_prefix_rows(rows: int) -> int:
    """Rows of a position table before its square grid (class token, registers)."""
    return next(p for p in range(rows) if math.isqrt(rows - p) ** 2 == rows - p)


def describe_checkpoint(state_dict: dict) -> dict:
    """What a checkpoint in our layout is: family (the registered family whose
    ``checkpoint_markers`` match most), depth, width, LayerScale, registers, rows of the
    position table before its grid (the class token's), normalisation after pooling
    (``fc_norm``), class-attention blocks, patch size (of a linear patch projection),
    attention biases, class token, gated positional (GPSA) blocks, the FFN's hidden width
    and whether it is gated (SwiGLU: a first map of twice the hidden width)."""
    from . import backbone_families  # the families import this module
    scores = {cls.__name__: len(cls.checkpoint_markers) for cls in backbone_families().values()
              if cls.checkpoint_markers and all(
                  any(re.search(m, k) for k in state_dict) for m in cls.checkpoint_markers)}
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
        _table_prefix_rows(table.shape[1]),
        fc_norm=any(k.startswith('fc_norm.') for k in state_dict),
        class_attention_blocks=len({k.split('.')[1] for k in state_dict
                                    if k.startswith('cls_blocks.')}),
        patch_size=projection.shape[-1] if projection is not None and projection.dim() == 4
        else None,
        qkv_bias=any(QKV_BIAS.match(k) for k in state_dict),
        class_token='cls_token' in state_dict,
        gpsa_blocks=sum(bool(GPSA_GATING.match(k)) for k in state_dict),
        mlp_hidden=fc2.shape[-1] if fc2 is not None else None,
        gated_mlp=fc1 is not None and fc2 is not None and fc1.shape[-2] == 2 * fc2.shape[-1])


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


class CheckpointAdaptation:
    """Reading foreign checkpoints, for a ``ColumnarBackbone`` (a ``BaseModule`` with
    ``dense``, ``out_type``, ``arch_name``, ``embed_dims``, ``num_layers``, ``patch_size``).

    A family states its key renames in ``checkpoint_rules`` and may extend
    :meth:`merge_checkpoint_tensors`; the rest is the same for all.
    """

    #: the family's key renames (regex, replacement), after ``SHARED_CHECKPOINT_RULES``
    checkpoint_rules: tuple[Rule, ...] = ()
    #: our keys -> the family's timm model's (regex, replacement), after
    #: ``SHARED_TIMM_RULES``: the inverse of ``checkpoint_rules`` for timm's layout
    timm_export_rules: tuple[Rule, ...] = ()
    #: the family's settings (arch keys, else model attributes) -> the keyword of its timm
    #: model's constructor, beside the shared ones (``timm_export.SHARED_TIMM_ARGUMENTS``)
    timm_arguments: dict[str, str] = {}
    #: the family's options the timm model it exports to has no counterpart for -> the value
    #: that model computes: an export of a backbone with another value is refused, naming it
    timm_inexpressible: dict[str, Any] = {}
    #: whether the timm model's ``embed_dim`` is per head (timm's ConViT)
    timm_embed_dim_per_head = False
    #: keys of foreign checkpoints that have no counterpart here (classifier heads)
    foreign_only_keys = r'^(head|head_dist|pre_logits)\.'
    #: key patterns only this family's checkpoints have all of (what an error names)
    checkpoint_markers: tuple[str, ...] = ()
    #: tensors of the model a checkpoint may lack: new in fine-tuning, initialised so that
    #: the checkpoint's function is kept (the dense pyramid, zero relative position tables)
    new_in_fine_tuning = r'^pyramid\.|\.attn\.rel_pos\.'
    #: how the library of a checkpoint layout resamples position tables: (a key pattern of
    #: the layout as saved, antialias); the first match is the kernel, at load and in
    #: forward, of a model built without ``pos_antialias``; none: timm's antialiased bicubic
    position_kernels: tuple[tuple[str, bool], ...] = ()
    #: the layouts of sources whose options the tensors' shapes do not show: (a key pattern
    #: of the layout as saved, a key pattern it lacks or None, the options that build it, a
    #: note): the options of every layout a checkpoint has are named where the model's
    #: settings differ
    checkpoint_layouts: tuple[tuple[str, Optional[str], dict, str], ...] = ()

    @classmethod
    def convert_checkpoint(cls, state_dict: dict) -> dict:
        """Map an official release or a timm state dict of this family to our keys.

        Keys already in our layout pass through unchanged; classifier heads are dropped.
        """
        converted = {}
        for key, value in checkpoint_weights(state_dict).items():
            if re.match(cls.foreign_only_keys, key):
                continue
            converted[rename_key(key, SHARED_CHECKPOINT_RULES + cls.checkpoint_rules)] = value
        return cls.merge_checkpoint_tensors(converted)

    @classmethod
    def merge_checkpoint_tensors(cls, state_dict: dict) -> dict:
        """Tensors split or stacked differently. Class attention keeps a query map and a
        fused key-value map; official releases store one qkv map or separate q, k, v."""
        for key in [k for k in state_dict if CLASS_ATTENTION_SPLIT.search(k)]:
            if key not in state_dict:
                continue
            base, kind, param = key.rsplit('.', 2)
            if kind == 'qkv':
                q, k, v = state_dict.pop(key).chunk(3)
                state_dict[f'{base}.q.{param}'] = q
            else:
                k = state_dict.pop(key)
                v = state_dict.pop(f'{base}.v.{param}')
            state_dict[f'{base}.kv.{param}'] = torch.cat([k, v])
        return state_dict

    @classmethod
    def split_for_timm(cls, state_dict: dict) -> dict:
        """The inverse of :meth:`merge_checkpoint_tensors` for timm's layout: class
        attention's fused key-value map split into timm's key and value maps."""
        for key in [k for k in state_dict if re.search(r'^cls_blocks\.\d+\.attn\.kv\.', k)]:
            base, _, param = key.rsplit('.', 2)
            state_dict[f'{base}.k.{param}'], state_dict[f'{base}.v.{param}'] = (
                state_dict.pop(key).chunk(2))
        return state_dict

    @classmethod
    def export_to_timm(cls, state_dict: dict) -> dict:
        """A backbone state dict of this family in our layout, in the layout of the family's
        timm model (``timm_export_rules``, :meth:`split_for_timm`); the dense pyramid, which
        timm has no module for, is left out.

        Raises ValueError unless loading the result back (:meth:`convert_checkpoint`) gives
        every tensor exactly: the export rules must invert the loading rules.
        """
        kept = {k: v for k, v in state_dict.items() if not re.match(NOT_IN_TIMM, k)}
        split = cls.split_for_timm(dict(kept))
        exported = {rename_key(key, SHARED_TIMM_RULES + cls.timm_export_rules): value
                    for key, value in split.items()}
        loaded_back = cls.convert_checkpoint(exported)
        differing = sorted(k for k in kept.keys() | loaded_back.keys()
                           if k not in kept or k not in loaded_back
                           or not torch.equal(kept[k], loaded_back[k]))
        if differing:
            raise ValueError(
                f'{cls.__name__}: the timm export does not load back exactly for '
                f'{len(differing)} tensors ({", ".join(differing[:6])}): timm_export_rules / '
                f'split_for_timm must invert checkpoint_rules / merge_checkpoint_tensors')
        return exported

    def adapt_checkpoint(self, state_dict: dict, strict: bool = True,
                         truncate: bool = False) -> dict:
        """A checkpoint of any layout this family reads (official release, timm, ours;
        bare or wrapped in ``model`` / ``state_dict``), in the layout of this model.

        Keys go through :meth:`convert_checkpoint`, tensors through the family's
        :meth:`fit_checkpoint_tensors`, and a model built without
        ``pos_antialias`` takes the position kernel of the checkpoint's library
        (:meth:`adopt_position_kernel`); tensors the model's mode does not build
        (:meth:`built_by_other_modes`) are dropped and logged, and with ``truncate`` so are
        the trunk blocks beyond the model's depth. Raises ValueError when tensors have other
        shapes than the model's (position tables excepted: they are resampled) and, with
        ``strict``, when any tensor of the model is missing (those new in fine-tuning
        excepted: ``new_in_fine_tuning``) or any checkpoint tensor is left unused: the
        error says what the checkpoint is and which option loads it.
        """
        state_dict = checkpoint_weights(state_dict)
        converted = self.fit_checkpoint_tensors(self.convert_checkpoint(state_dict))
        expected = self.state_dict()
        unused = sorted(k for k in converted if k not in expected and (
            self.built_by_other_modes(k) or truncate and self._beyond_depth(k)))
        for key in unused:
            del converted[key]
        mismatched = [
            f'{k}: checkpoint {tuple(v.shape)} vs model {tuple(expected[k].shape)}'
            for k, v in converted.items()
            if k in expected and k != 'pos_embed.weight' and v.shape != expected[k].shape]
        missing = [k for k in expected
                   if k not in converted and not re.search(self.new_in_fine_tuning, k)]
        unexpected = [k for k in converted if k not in expected]
        if mismatched or (strict and (missing or unexpected or self._class_row_differs(
                converted))):
            raise ValueError(self._mismatch_message(converted, mismatched, missing,
                                                    unexpected, state_dict))
        self.adopt_position_kernel(state_dict)
        if unused:
            MMLogger.get_current_instance().info(
                f'{type(self).__name__}(out_type={self.out_type!r}) does not use '
                f'{len(unused)} checkpoint tensors ({", ".join(unused[:6])}...)')
        return converted

    def fit_checkpoint_tensors(self, converted: dict) -> dict:
        """Converted checkpoint tensors a family brings to this model's shapes before they
        are checked (none here; ViT resamples BEiT's relative position tables)."""
        return converted

    def _mismatch_message(self, converted: dict, mismatched: list[str], missing: list[str],
                          unexpected: list[str], saved: dict) -> str:
        """What the checkpoint is, what the model is, and the options that would load it
        (a whole model's checkpoint: described by its backbone, ``prefix`` named first);
        ``saved``: the checkpoint's keys as saved, which show its source's layout."""
        whole_model = not any(k in self.state_dict() for k in converted) and any(
            k.startswith(BACKBONE_PREFIX) for k in converted)
        if whole_model:
            converted = self.convert_checkpoint({
                k[len(BACKBONE_PREFIX):]: v for k, v in converted.items()
                if k.startswith(BACKBONE_PREFIX)})
            saved = {k[len(BACKBONE_PREFIX):] for k in saved if k.startswith(BACKBONE_PREFIX)}
        found = describe_checkpoint(converted)
        model = self.describe_model()
        details = mismatched[:10] + [
            f'{name}: {", ".join(keys[:8])}{", ..." if len(keys) > 8 else ""}'
            for name, keys in (('missing', missing), ('unexpected', unexpected)) if keys]
        options = ([f"init_cfg=dict(type='Pretrained', ..., prefix={BACKBONE_PREFIX!r}) (the "
                    f"backbone of a whole model's checkpoint, with mmseg's model.pretrained=None)"]
                   if whole_model else []) + self.options_to_load(found, model)
        if found['family'] == model['family']:
            options += self.layout_options(saved)
        if not options:
            options.append(f'no option of {type(self).__name__} loads it; build the model the '
                           f'checkpoint was trained as')
        return (f'checkpoint does not match {type(self).__name__}(arch={self.arch_name}, '
                f'embed_dims={self.embed_dims}, num_layers={self.num_layers}, patch_size='
                f'{self.patch_size}): {len(mismatched)} tensors with other shapes, '
                f'{len(missing)} missing, {len(unexpected)} unexpected\n'
                f'  checkpoint: {format_facts(found)}\n  model:      {format_facts(model)}\n'
                f'  to load it: {"; ".join(options)}' + ''.join(f'\n  {d}' for d in details))

    def init_weights(self) -> None:
        """mmengine's initialisation, except that ``Pretrained`` entries of ``init_cfg``
        load through :meth:`load_pretrained` (after the others, as in mmengine): exactly,
        or with an error naming the options that would load the checkpoint; only tensors
        new in fine-tuning (``new_in_fine_tuning``) keep their initialisation."""
        init_cfgs = [self.init_cfg] if isinstance(self.init_cfg, dict) else self.init_cfg
        pretrained = [cfg for cfg in init_cfgs or [] if cfg.get('type') == 'Pretrained']
        if self.is_init or not pretrained:
            super().init_weights()
            return
        self.init_cfg = [cfg for cfg in init_cfgs if cfg not in pretrained] or None
        try:
            super().init_weights()
        finally:
            self.init_cfg = init_cfgs
        for cfg in pretrained:
            self.load_pretrained(cfg['checkpoint'], cfg.get('prefix'),
                                 cfg.get('map_location', 'cpu'), cfg.get('truncate', False))

    def load_pretrained(self, checkpoint: str, prefix: Optional[str] = None,
                        map_location: str = 'cpu', truncate: bool = False) -> None:
        """Load a checkpoint file as ``init_cfg=dict(type='Pretrained', checkpoint=...,
        prefix=..., truncate=...)`` does: ``prefix`` selects a part of a whole-model
        checkpoint (e.g. ``'backbone.'`` of a classifier); ``truncate=True`` loads a deeper
        trunk's first blocks. Loading is exact or raises (:meth:`adapt_checkpoint`). The
        file is read weights-only whatever the environment says (``checkpoint_io.
        load_checkpoint`` of the package)."""
        # imported here: importing the models registers no file backend (checkpoint_io does)
        from ...checkpoint_io import load_checkpoint
        logger = MMLogger.get_current_instance()
        logger.info(f'load {prefix or "model"} from: {checkpoint}')
        state_dict = load_checkpoint(checkpoint, map_location=map_location)
        if prefix is not None:
            state_dict = checkpoint_weights(state_dict)
            prefix = prefix if prefix.endswith('.') else f'{prefix}.'
            state_dict = {key[len(prefix):]: value for key, value in state_dict.items()
                          if key.startswith(prefix)}
            if not state_dict:
                raise ValueError(f"no tensor of {checkpoint} starts with '{prefix}'")
        try:
            adapted = self.adapt_checkpoint(state_dict, truncate=truncate)
        except ValueError as error:
            raise ValueError(f'{checkpoint}'
                             f'{f" (prefix {prefix!r})" if prefix else ""}: {error}') from None
        mmengine_checkpoint.load_state_dict(self, adapted, strict=False, logger='current')

    def describe_model(self) -> dict:
        """:func:`describe_checkpoint`'s facts for the checkpoint this model would load."""
        facts = describe_checkpoint(self.state_dict())
        table = getattr(self.pos_embed, 'checkpoint_prefix_tokens', None)
        return {**facts, 'family': type(self).__name__, 'depth': self.num_layers,
                'width': self.embed_dims, 'table_prefix_rows': table,
                'patch_size': facts['patch_size'] and self.patch_size}

    def adopt_position_kernel(self, state_dict: dict) -> None:
        """A model built without ``pos_antialias`` resamples its position table, at load and
        in forward, as the library whose layout ``state_dict`` (keys as saved) has: the
        family's ``position_kernels``, else timm's antialiased bicubic; logged when that is
        not the default."""
        if self.pos_kernel_chosen or not hasattr(self.pos_embed, 'antialias'):
            return
        antialias = next((antialias for pattern, antialias in self.position_kernels
                          if any(re.match(pattern, key) for key in state_dict)), True)
        if antialias != self.pos_antialias:
            MMLogger.get_current_instance().info(
                f'{type(self).__name__}: the checkpoint\'s library resamples position tables '
                f'{"with" if antialias else "without"} antialiasing; so does this model (set '
                f'pos_antialias to choose)')
        self.pos_antialias = self.pos_embed.antialias = antialias

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
        if found['gated_mlp'] != model['gated_mlp'] and 'swiglu_mlp' in self.arch_defaults:
            arch['swiglu_mlp'] = found['gated_mlp']
        if found['mlp_hidden'] and found['width'] == model['width'] and \
                found['mlp_hidden'] != model['mlp_hidden']:
            arch['mlp_ratio'] = _ratio_of(found['mlp_hidden'], found['width'])
        if found['gpsa_blocks'] != model['gpsa_blocks']:
            arch['num_local_layers'] = found['gpsa_blocks']
        if not self.dense and found['class_attention_blocks'] != model[
                'class_attention_blocks']:
            arch['num_cls_layers'] = found['class_attention_blocks']
        if found['registers'] != model['registers']:
            options.append(f"reg_tokens={found['registers']}")
        if not found['class_token'] and model['class_token']:
            options.append(self._class_token_free_option(found['registers']))
        elif self._class_row_differs_by(found['table_prefix_rows']):
            options.append(f"no_embed_class={found['table_prefix_rows'] == 0} (a position "
                           f"table {'without' if found['table_prefix_rows'] == 0 else 'with'}"
                           f" the class token's row)")
        if found['fc_norm'] != model['fc_norm'] and not self.dense:
            options.append("out_type='avg_featmap', fc_norm=True (the pooled tokens are "
                           "normalised: MAE's fine-tuned layout)" if found['fc_norm']
                           else 'fc_norm=False')
        if arch:
            options.append(f"arch_overrides=dict("
                           f"{', '.join(f'{k}={v!r}' for k, v in arch.items())})")
        return options

    def layout_options(self, saved_keys) -> list[str]:
        """The options of the family's ``checkpoint_layouts`` that a checkpoint with
        ``saved_keys`` (as saved) has, where this model's settings differ, with the notes."""
        options, notes = {}, []
        for present, absent, layout, note in self.checkpoint_layouts:
            if any(re.search(present, k) for k in saved_keys) and not (
                    absent and any(re.search(absent, k) for k in saved_keys)):
                options.update(layout)
                notes.append(note)
        differing = {name: value for name, value in options.items() if (
            self.arch[name] if name in self.arch else getattr(self, name)) != value}
        if not differing:
            return []
        return [f"{', '.join(f'{k}={v!r}' for k, v in differing.items())} "
                f"({', and '.join(notes)})"]

    def _class_token_free_option(self, registers: int) -> str:
        """The option that loads a checkpoint without class token: a dense trunk without
        one (``dense_class_token=False``) where it has no registers, else the family's
        ``class_token=False`` (its registers kept), where the family has it."""
        if self.dense and not registers:
            return 'dense_class_token=False (the checkpoint has no class token)'
        if 'class_token' in self.arch_defaults:
            pooled = ", out_type='avg_featmap'" if self.out_type == 'cls_token' else ''
            return f'class_token=False{pooled} (the checkpoint has no class token)'
        return (f'no option of {type(self).__name__} builds a model without class token '
                f'{"and with registers" if registers else "for classification"}')

    def arch_option(self, depth: int, width: Optional[int]) -> str:
        """The ``arch`` (names of ``arch_zoo``) of a trunk of ``depth`` blocks of ``width``,
        else ``depth=`` where the width is this model's."""
        names = [name for name, arch in self.arch_zoo.items()
                 if (arch['num_layers'], arch['embed_dims']) == (depth, width)]
        if names:
            return ' or '.join(f'arch={name!r}' for name in names)
        if width == self.embed_dims:
            return f'depth={depth}'
        return f'arch=dict(embed_dims={width}, num_layers={depth}, num_heads=...)'

    def built_by_other_modes(self, key: str) -> bool:
        """Whether checkpoint tensor ``key`` belongs to a part this model's mode does not
        build: the classification stage of a dense model, the class token (and registers)
        of a trunk that carries none."""
        return bool(self.dense and re.match(self.classification_keys, key) or
                    self.cls_token is None and re.match(self.prefix_token_keys, key))

    def _beyond_depth(self, key: str) -> bool:
        match = BLOCK_INDEX.match(key)
        return bool(match) and int(match.group(1)) >= self.num_layers

    def _class_row_differs_by(self, rows: Optional[int]) -> bool:
        """Whether a position table with ``rows`` prefix rows is another layout than the
        model's (which reads tables with ``checkpoint_prefix_tokens`` rows, or as many as
        it keeps)."""
        embed = self.pos_embed
        if rows is None or not hasattr(embed, 'checkpoint_prefix_tokens'):
            return False
        return rows not in (embed.num_prefix_tokens, embed.checkpoint_prefix_tokens)

    def _class_row_differs(self, converted: dict) -> bool:
        table = converted.get('pos_embed.weight')
        return table is not None and table.dim() == 3 and self._class_row_differs_by(
            _table_prefix_rows(table.shape[1]))
