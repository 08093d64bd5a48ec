"""Checkpoint adaptation: any checkpoint layout a family reads, mapped onto one model.

The columnar backbones read official releases, timm state dicts and their own checkpoints.
Keys and tensors are mapped by the family's key table (:mod:`.checkpoint_keys`: the shared
table, then the family's ``checkpoint_keys``; the export to timm reads it backward), tensors
are fitted to the model, and what the model's mode does not build is dropped, before torch's
own ``load_state_dict`` (which takes our layout only). A load that is not exact raises, the
message written by :mod:`.checkpoint_diagnosis`. ``ColumnarBackbone`` gets this from
:class:`CheckpointAdaptation`.
"""
import re
from typing import Any, Optional

import torch
from mmengine.logging import MMLogger
from mmengine.runner import checkpoint as mmengine_checkpoint

from ..layers.embed import PositionKernel
from .checkpoint_diagnosis import BLOCK_INDEX, CheckpointDiagnosis
from .checkpoint_keys import SHARED_KEYS, KeyTable

#: where a model saves its position kernel (``LearnedPositionEmbedding.kernel``)
KERNEL_KEY = 'pos_embed.kernel'
#: our tensors timm's models have no module for: the dense pyramid, new in fine-tuning, and
#: the position kernel (timm's models resample with their own)
NOT_IN_TIMM = r'^(pyramid\.|pos_embed\.kernel$)'
#: where a checkpoint file keeps its weights, in the order timm's ``load_state_dict`` reads
#: them: the EMA weights of a timm ``train.py`` checkpoint first, as timm evaluates and
#: fine-tunes them, then a whole model's ``state_dict``, then a release's ``model``
WEIGHT_ENTRIES = ('state_dict_ema', 'model_ema', 'state_dict', 'model')


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


class CheckpointAdaptation(CheckpointDiagnosis):
    """Reading foreign checkpoints, for a ``ColumnarBackbone`` (a ``BaseModule`` with
    ``dense``, ``out_type``, ``arch_name``, ``embed_dims``, ``num_layers``, ``patch_size``,
    ``peft``): keys through the family's table (``checkpoint_keys``), tensors fitted to the
    model, the load exact or refused (the refusal written by :class:`CheckpointDiagnosis`),
    and ``Pretrained`` initialisation through it. A model with peft adapters reads plain
    checkpoints (the adapters keep their initialisation) and its own.
    """

    #: the family's checkpoint keys (timm's, read both ways; other layouts'; tensors merged
    #: and split), after ``checkpoint_keys.SHARED_KEYS``
    checkpoint_keys = KeyTable()
    #: the family's settings (arch keys, else model attributes) -> the keyword of its timm
    #: model's constructor, beside the shared ones (``timm_export.SHARED_TIMM_ARGUMENTS``)
    timm_arguments: dict[str, str] = {}
    #: the family's options the timm model it exports to has no counterpart for -> the value
    #: that model computes: an export of a backbone with another value is refused, naming it
    timm_inexpressible: dict[str, Any] = {}
    #: whether the timm model's ``embed_dim`` is per head (timm's ConViT)
    timm_embed_dim_per_head = False
    #: tensors of the model a checkpoint may lack: new in fine-tuning, initialised so that
    #: the checkpoint's function is kept (the dense pyramid, zero relative position tables)
    new_in_fine_tuning = r'^pyramid\.|\.attn\.rel_pos\.'
    #: how the library of a checkpoint layout resamples position tables: (key patterns that
    #: each match a key of the layout as saved, a pattern none matches or None, its kernel);
    #: the first layout the checkpoint has gives the kernel, at load and in forward, of a
    #: model built without ``pos_antialias``; none: timm's antialiased bicubic
    position_kernels: tuple[tuple[tuple[str, ...], Optional[str], PositionKernel], ...] = ()

    @classmethod
    def checkpoint_table(cls) -> KeyTable:
        """The family's key table after the shared one."""
        return SHARED_KEYS + cls.checkpoint_keys

    @classmethod
    def convert_checkpoint(cls, state_dict: dict) -> dict:
        """Map an official release or a timm state dict of this family to our keys
        (:meth:`checkpoint_table`). Keys already in our layout pass through unchanged;
        classifier heads are dropped, and so are the tensors of a source's pretraining or
        other tasks that the family has no module for, logged."""
        converted, left_out = cls.checkpoint_table().to_ours(checkpoint_weights(state_dict))
        if left_out:
            MMLogger.get_current_instance().info(
                f'{cls.__name__} leaves out {len(left_out)} checkpoint tensors of its source\'s '
                f'pretraining or other tasks: {", ".join(left_out[:6])}'
                f'{", ..." if len(left_out) > 6 else ""}')
        return converted

    @classmethod
    def export_to_timm(cls, state_dict: dict) -> dict:
        """A backbone state dict of this family in our layout, in the layout of the family's
        timm model (:meth:`checkpoint_table` read backward); the dense pyramid, which timm
        has no module for, is left out.

        Raises ValueError unless loading the result back (:meth:`convert_checkpoint`) gives
        every tensor exactly: a table whose renames or tensor rules are not one-to-one.
        """
        kept = {k: v for k, v in state_dict.items() if not re.match(NOT_IN_TIMM, k)}
        exported = cls.checkpoint_table().to_timm(kept)
        loaded_back = cls.convert_checkpoint(exported)
        differing = sorted(k for k in kept.keys() | loaded_back.keys()
                           if k not in kept or k not in loaded_back
                           or not torch.equal(kept[k], loaded_back[k]))
        if differing:
            raise ValueError(
                f'{cls.__name__}: the timm export does not load back exactly for '
                f'{len(differing)} tensors ({", ".join(differing[:6])}): a Rename or '
                f'TensorRule of its checkpoint_keys is not one-to-one')
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
        excepted: ``new_in_fine_tuning``) or any checkpoint tensor is left unused, and when
        the checkpoint computes what no option builds (:meth:`mechanisms_not_built`): the
        error says what the checkpoint is and which option loads it, or that none does.
        """
        state_dict = checkpoint_weights(state_dict)
        expected, adapters = self.state_dict(), {}
        if self.peft is not None:
            # keys are checked in the plain layout; the adapters' tensors, which a plain
            # checkpoint lacks, keep their initialisation unless the checkpoint has them
            state_dict, adapters = self.peft.split_checkpoint(state_dict)
            expected, expected_adapters = self.peft.split_checkpoint(expected)
            unknown = sorted(adapters.keys() - expected_adapters.keys())
            if unknown:
                raise ValueError(f'the checkpoint has adapter tensors that this model\'s '
                                 f'{self.peft} does not build: {", ".join(unknown[:6])}')
        converted = self.fit_checkpoint_tensors(self.convert_checkpoint(state_dict))
        unused = sorted(k for k in converted if k not in expected and (
            self.built_by_other_modes(k) or truncate and self._beyond_depth(k)))
        for key in unused:
            del converted[key]
        mismatched = [
            f'{k}: checkpoint {tuple(v.shape)} vs model {tuple(expected[k].shape)}'
            for k, v in converted.items()
            if k in expected and k != 'pos_embed.weight' and v.shape != expected[k].shape]
        missing = [k for k in expected if k not in converted and k != KERNEL_KEY
                   and not re.search(self.new_in_fine_tuning, k)]
        unexpected = [k for k in converted if k not in expected]
        unbuilt = self.mechanisms_not_built(list(state_dict))
        if unbuilt or mismatched or self.order_options(list(state_dict)) or (strict and (
                missing or unexpected or self.class_row_differs(converted))):
            raise ValueError(self.mismatch_message(converted, mismatched, missing,
                                                   unexpected, state_dict, unbuilt))
        self.adopt_position_kernel(state_dict, converted)
        if unused:
            MMLogger.get_current_instance().info(
                f'{type(self).__name__}(out_type={self.out_type!r}) does not use '
                f'{len(unused)} checkpoint tensors ({", ".join(unused[:6])}...)')
        return {**converted, **adapters}

    def mechanisms_not_built(self, saved_keys: list[str]) -> list[str]:
        """What a checkpoint computes that no option of the family builds, as its keys (as
        saved, in their order) show: each a phrase after "the checkpoint has" (none here)."""
        return []

    def order_options(self, saved_keys: list[str]) -> list[str]:
        """The options that the order of a checkpoint's keys (as saved) shows and this
        model's settings differ from, as the advice writes them: a load that they name is
        refused, whatever the shapes (none here; ViT's res-post-norm blocks)."""
        return []

    def fit_checkpoint_tensors(self, converted: dict) -> dict:
        """Converted checkpoint tensors a family brings to this model's shapes before they
        are checked (none here; ViT resamples BEiT's relative position tables)."""
        return converted

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
        trunk's first blocks. Loading is exact or raises (:meth:`read_pretrained`)."""
        adapted = self.read_pretrained(checkpoint, prefix, map_location, truncate)
        mmengine_checkpoint.load_state_dict(self, adapted, strict=False, logger='current')

    def read_pretrained(self, checkpoint: str, prefix: Optional[str] = None,
                        map_location: str = 'cpu', truncate: bool = False) -> dict:
        """The tensors :meth:`load_pretrained` loads, in this model's plain layout
        (:meth:`adapt_checkpoint`; exact or raises). The file is read weights-only whatever
        the environment says (``checkpoint_io.load_checkpoint`` of the package)."""
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
            return self.adapt_checkpoint(state_dict, truncate=truncate)
        except ValueError as error:
            raise ValueError(f'{checkpoint}'
                             f'{f" (prefix {prefix!r})" if prefix else ""}: {error}') from None

    def adopt_position_kernel(self, state_dict: dict, converted: dict) -> None:
        """A model built without ``pos_antialias`` resamples its position table, at load and
        in forward, as the checkpoint says: its saved kernel (``pos_embed.kernel``: ours),
        else the library whose layout ``state_dict`` (keys as saved) has (the family's
        ``position_kernels``), else timm's antialiased bicubic; logged when that is not the
        default, and when the model's chosen kernel is not the checkpoint's. ``converted``
        then carries the model's kernel, which the load keeps."""
        if not hasattr(self.pos_embed, 'use_kernel'):
            return
        saved, current = converted.get(KERNEL_KEY), self.pos_embed.position_kernel
        if saved is not None:
            # a meta tensor (the advice's dry run on the meta device) holds no kernel
            kernel = current if saved.is_meta else PositionKernel.from_tensor(saved)
        else:
            kernel = next((kernel for present, absent, kernel in self.position_kernels
                           if all(any(re.search(p, k) for k in state_dict) for p in present)
                           and not (absent and any(re.search(absent, k) for k in state_dict))),
                          PositionKernel())
        logger = MMLogger.get_current_instance()
        if kernel != current and self.pos_kernel_chosen:
            logger.info(
                f'{type(self).__name__}: the checkpoint resamples position tables as '
                f'{kernel}; this model resamples them as {current}, as its pos_antialias '
                f'chooses (leave pos_antialias unset to take the checkpoint\'s)')
        elif kernel != current:
            logger.info(f'{type(self).__name__}: the checkpoint resamples position tables as '
                        f'{kernel}; so does this model (set pos_antialias to choose)')
            self.pos_embed.use_kernel(kernel)
            self.pos_antialias = kernel.antialias
        converted[KERNEL_KEY] = self.pos_embed.kernel.detach().clone()

    def built_by_other_modes(self, key: str) -> bool:
        """Whether checkpoint tensor ``key`` belongs to a part this model's mode does not
        build: the classification stage of a dense model, the class token (and registers)
        of a trunk that carries none."""
        return bool(self.dense and re.match(self.classification_keys, key) or
                    self.cls_token is None and re.match(self.prefix_token_keys, key))

    def _beyond_depth(self, key: str) -> bool:
        match = BLOCK_INDEX.match(key)
        return bool(match) and int(match.group(1)) >= self.num_layers
