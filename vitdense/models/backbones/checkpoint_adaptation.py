"""Checkpoint adaptation: any checkpoint layout a family reads, mapped onto one model.

The columnar backbones read official releases, timm state dicts and their own checkpoints.
Keys are renamed by rules kept as data (``SHARED_CHECKPOINT_RULES`` for every family, then
the family's ``checkpoint_rules``), tensors split or stacked differently are merged, and
what the model's mode does not build is dropped, before torch's own ``load_state_dict``
(which takes our layout only). ``ColumnarBackbone`` gets this from :class:`CheckpointAdaptation`.
"""
import re
from typing import Optional

import torch
from mmengine.logging import MMLogger
from mmengine.runner import checkpoint as mmengine_checkpoint

Rule = tuple[str, str]
#: key renames official layouts of every family need, applied before a family's own
#: ``checkpoint_rules``: a learned position table saved as a bare tensor and a block's
#: LayerScale gammas named gamma_1 / gamma_2 or gamma1 / gamma2 (as the official releases
#: of the families save them), ours being ls1.gamma / ls2.gamma as in timm
SHARED_CHECKPOINT_RULES: tuple[Rule, ...] = (
    (r'^pos_embed$', 'pos_embed.weight'),
    (r'\.gamma_?([12])$', r'.ls\1.gamma'),
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
    #: keys of foreign checkpoints that have no counterpart here (classifier heads)
    foreign_only_keys = r'^(head|head_dist|fc_norm|pre_logits)\.'

    @classmethod
    def convert_checkpoint(cls, state_dict: dict) -> dict:
        """Map an official release or a timm state dict of this family to our keys.

        Keys already in our layout pass through unchanged; classifier heads are dropped.
        """
        if 'model' in state_dict and isinstance(state_dict['model'], dict):
            state_dict = state_dict['model']
        converted = {}
        for key, value in state_dict.items():
            key = key[len('module.'):] if key.startswith('module.') else key
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

    def adapt_checkpoint(self, state_dict: dict, strict: bool = True) -> dict:
        """A checkpoint of any layout this family reads (official release, timm, ours;
        bare or wrapped in ``model`` / ``state_dict``), in the layout of this model.

        Keys go through :meth:`convert_checkpoint`; tensors of the classification stage
        are dropped (and logged) when the model is dense. Raises ValueError naming the
        arch when tensors have other shapes than the model's (no load could use them;
        position tables excepted: :class:`LearnedPositionEmbedding` resamples them) and,
        with ``strict``, when the checkpoint is of another architecture: tensors of the
        model missing (the dense pyramid, new in fine-tuning, excepted) while unknown
        ones are present.
        """
        if isinstance(state_dict.get('state_dict'), dict):
            state_dict = state_dict['state_dict']
        converted = self.convert_checkpoint(state_dict)
        expected = self.state_dict()
        unused = sorted(k for k in converted if k not in expected and self._unused_in_mode(k))
        for key in unused:
            del converted[key]
        mismatched = [
            f'{k}: checkpoint {tuple(v.shape)} vs model {tuple(expected[k].shape)}'
            for k, v in converted.items()
            if k in expected and k != 'pos_embed.weight' and v.shape != expected[k].shape]
        missing = [k for k in expected if k not in converted and not k.startswith('pyramid.')]
        unexpected = [k for k in converted if k not in expected]
        if mismatched or (strict and missing and unexpected):
            details = mismatched[:10] if mismatched else [
                f'missing: {", ".join(missing[:8])}', f'unexpected: {", ".join(unexpected[:8])}']
            raise ValueError(
                f'checkpoint does not match {type(self).__name__}(arch={self.arch_name}, '
                f'embed_dims={self.embed_dims}, num_layers={self.num_layers}, patch_size='
                f'{self.patch_size}): {len(mismatched)} tensors with other shapes, '
                f'{len(missing)} missing, {len(unexpected)} unexpected' +
                ''.join(f'\n  {d}' for d in details))
        if unused:
            MMLogger.get_current_instance().info(
                f'{type(self).__name__}: out_type={self.out_type!r} does not use '
                f'{len(unused)} checkpoint tensors ({", ".join(unused[:6])}...)')
        return converted

    def init_weights(self) -> None:
        """mmengine's initialisation, except that ``Pretrained`` entries of ``init_cfg``
        load through :meth:`adapt_checkpoint` (after the others, as in mmengine): the
        checkpoint must be of this architecture; tensors it lacks keep their
        initialisation (mmengine's non-strict load, which logs them)."""
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
                                 cfg.get('map_location', 'cpu'))

    def load_pretrained(self, checkpoint: str, prefix: Optional[str] = None,
                        map_location: str = 'cpu') -> None:
        """Load a checkpoint file as ``init_cfg=dict(type='Pretrained', checkpoint=...,
        prefix=...)`` does: ``prefix`` selects a part of a whole-model checkpoint (e.g.
        ``'backbone.'`` of a classifier). The file is read weights-only whatever the
        environment says (``checkpoint_io.load_checkpoint`` of the package)."""
        # imported here: importing the models registers no file backend (checkpoint_io does)
        from ...checkpoint_io import load_checkpoint
        logger = MMLogger.get_current_instance()
        logger.info(f'load {prefix or "model"} from: {checkpoint}')
        state_dict = load_checkpoint(checkpoint, map_location=map_location)
        if prefix is not None:
            state_dict = state_dict.get('state_dict', state_dict)
            prefix = prefix if prefix.endswith('.') else f'{prefix}.'
            state_dict = {key[len(prefix):]: value for key, value in state_dict.items()
                          if key.startswith(prefix)}
            if not state_dict:
                raise ValueError(f"no tensor of {checkpoint} starts with '{prefix}'")
        mmengine_checkpoint.load_state_dict(self, self.adapt_checkpoint(state_dict),
                                            strict=False, logger='current')

    def _unused_in_mode(self, key: str) -> bool:
        """Checkpoint tensors of the classification stage that dense mode does not build."""
        return self.dense and (key.startswith(('norm.', 'cls_blocks.')) or key == 'cls_token')
