"""Checkpoint adaptation: any checkpoint layout a family reads, mapped onto one model.

The columnar backbones read official releases, timm state dicts and their own checkpoints.
A :class:`CheckpointLoader` serves one model: keys and tensors are mapped by the family's
:class:`~.checkpoint_layout.CheckpointLayout` (the model's ``checkpoint_layout``), tensors
are fitted to the model, and what the model's mode does not build is dropped, before torch's
own ``load_state_dict`` (which takes our layout only). A load that is not exact raises, the
message written by :class:`~.checkpoint_diagnosis.CheckpointDiagnosis`. The backbone's
``init_weights`` loads its ``Pretrained`` entries through :func:`init_with_pretrained`.
"""
import re
from typing import Callable, Optional

import torch.nn as nn
from mmengine.logging import MMLogger
from mmengine.runner import checkpoint as mmengine_checkpoint

from ..layers.embed import PositionKernel
from .checkpoint_diagnosis import BLOCK_INDEX, CheckpointDiagnosis, table_size_options
from .checkpoint_layout import checkpoint_weights

#: where a model saves its position kernel (``LearnedPositionEmbedding.kernel``)
KERNEL_KEY = 'pos_embed.kernel'
#: what a model saves beside its position table, which other layouts lack: the kernel and
#: the table's grid (``LearnedPositionEmbedding.table_grid``), taken from the model
SAVED_WITH_TABLE = (KERNEL_KEY, 'pos_embed.table_grid')


class CheckpointLoader:
    """Reading foreign checkpoints into ``model``, a ``ColumnarBackbone`` (``dense``,
    ``out_type``, ``num_layers``, ``peft``, ``pos_embed``, ...): keys through its family's
    layout, tensors fitted to it, the load exact or refused. A model with peft adapters
    reads plain checkpoints (the adapters keep their initialisation) and its own.
    ``check_advice``: a refusal checks the advice it prints (False for the model that
    checks an advice)."""

    def __init__(self, model: nn.Module, check_advice: bool = True) -> None:
        self.model, self.layout = model, model.checkpoint_layout
        self.check_advice = check_advice

    def adapt(self, state_dict: dict, strict: bool = True, truncate: bool = False) -> dict:
        """A checkpoint of any layout the family reads (official release, timm, ours;
        bare or wrapped in ``model`` / ``state_dict``), in the layout of the model.

        Keys go through the layout's ``convert``, tensors through its ``fit_tensors``, and
        a model built without ``pos_antialias`` takes the position kernel of the
        checkpoint's library (:meth:`adopt_position_kernel`); tensors the model's mode does
        not build are dropped and logged, and with ``truncate`` so are the trunk blocks
        beyond the model's depth. Raises ValueError when tensors have other shapes than the
        model's (position tables excepted: they are resampled) and, with ``strict``, when
        any tensor of the model is missing (those new in fine-tuning excepted) or any
        checkpoint tensor is left unused, and when the checkpoint computes what no option
        builds or what the order of its keys shows the model does not: the error says what
        the checkpoint is and which option loads it, or that none does.
        """
        model, layout = self.model, self.layout
        state_dict = layout.weights(state_dict)
        expected, adapters = model.state_dict(), {}
        if model.peft is not None:
            # keys are checked in the plain layout; the adapters' tensors, which a plain
            # checkpoint lacks, keep their initialisation unless the checkpoint has them
            state_dict, adapters = model.peft.split_checkpoint(state_dict)
            expected, expected_adapters = model.peft.split_checkpoint(expected)
            unknown = sorted(adapters.keys() - expected_adapters.keys())
            if unknown:
                raise ValueError(f'the checkpoint has adapter tensors that this model\'s '
                                 f'{model.peft} does not build: {", ".join(unknown[:6])}')
        converted = layout.fit_tensors(model, layout.convert(state_dict))
        unused = sorted(k for k in converted if k not in expected and (
            layout.built_by_other_modes(model, k, converted) or truncate and self._beyond_depth(k)))
        for key in unused:
            del converted[key]
        mismatched = [
            f'{k}: checkpoint {tuple(v.shape)} vs model {tuple(expected[k].shape)}'
            for k, v in converted.items()
            if k in expected and k != 'pos_embed.weight' and v.shape != expected[k].shape]
        missing = [k for k in expected if k not in converted and k not in SAVED_WITH_TABLE
                   and not re.search(layout.new_in_fine_tuning, k)]
        unexpected = [k for k in converted if k not in expected]
        diagnosis = CheckpointDiagnosis(model, type(self) if self.check_advice else None)
        unbuilt = layout.mechanisms_not_built(list(state_dict))
        if unbuilt or mismatched or layout.order_options(model, list(state_dict)) or \
                layout.unchosen_options(model, list(state_dict), converted) or \
                table_size_options(model, converted) or (
                strict and (missing or unexpected or diagnosis.class_row_differs(converted))):
            raise ValueError(diagnosis.mismatch_message(converted, mismatched, missing,
                                                        unexpected, state_dict, unbuilt))
        self.adopt_position_kernel(state_dict, converted)
        if unused:
            MMLogger.get_current_instance().info(
                f'{type(model).__name__}(out_type={model.out_type!r}) does not use '
                f'{len(unused)} checkpoint tensors ({", ".join(unused[:6])}...)')
        return {**converted, **adapters}

    def load_pretrained(self, checkpoint: str, prefix: Optional[str] = None,
                        map_location: str = 'cpu', truncate: bool = False) -> None:
        """Load a checkpoint file as ``init_cfg=dict(type='Pretrained', checkpoint=...,
        prefix=..., truncate=...)`` does: ``prefix`` selects a part of a whole-model
        checkpoint (e.g. ``'backbone.'`` of a classifier); ``truncate=True`` loads a deeper
        trunk's first blocks. Loading is exact or raises (:meth:`read_pretrained`)."""
        adapted = self.read_pretrained(checkpoint, prefix, map_location, truncate)
        mmengine_checkpoint.load_state_dict(self.model, adapted, strict=False, logger='current')

    def read_pretrained(self, checkpoint: str, prefix: Optional[str] = None,
                        map_location: str = 'cpu', truncate: bool = False) -> dict:
        """The tensors :meth:`load_pretrained` loads, in the model's plain layout
        (:meth:`adapt`; exact or raises). The file is read weights-only whatever the
        environment says (``checkpoint_io.load_checkpoint`` of the package)."""
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
            return self.adapt(state_dict, truncate=truncate)
        except ValueError as error:
            raise ValueError(f'{checkpoint}'
                             f'{f" (prefix {prefix!r})" if prefix else ""}: {error}') from None

    def adopt_position_kernel(self, state_dict: dict, converted: dict) -> None:
        """A model built without ``pos_antialias`` resamples its position table, at load and
        in forward, as the checkpoint says: its saved kernel (``pos_embed.kernel``: ours),
        else the library whose layout ``state_dict`` (keys as saved) has (the layout's
        ``position_kernels``), else timm's antialiased bicubic; logged when that is not the
        default, and when the model's chosen kernel is not the checkpoint's. ``converted``
        then carries the model's kernel, which the load keeps."""
        model = self.model
        if not hasattr(model.pos_embed, 'use_kernel'):
            return
        saved, current = converted.get(KERNEL_KEY), model.pos_embed.position_kernel
        if saved is not None:
            # a meta tensor (the advice's dry run on the meta device) holds no kernel
            kernel = current if saved.is_meta else PositionKernel.from_tensor(saved)
        else:
            kernel = next((kernel for present, absent, kernel in self.layout.position_kernels
                           if all(any(re.search(p, k) for k in state_dict) for p in present)
                           and not (absent and any(re.search(absent, k) for k in state_dict))),
                          PositionKernel())
        logger, name = MMLogger.get_current_instance(), type(model).__name__
        if kernel != current and model.pos_kernel_chosen:
            logger.info(
                f'{name}: the checkpoint resamples position tables as {kernel}; this model '
                f'resamples them as {current}, as its pos_antialias chooses (leave '
                f'pos_antialias unset to take the checkpoint\'s)')
        elif kernel != current:
            logger.info(f'{name}: the checkpoint resamples position tables as {kernel}; so '
                        f'does this model (set pos_antialias to choose)')
            model.pos_embed.use_kernel(kernel)
            model.pos_antialias = kernel.antialias
        converted[KERNEL_KEY] = model.pos_embed.kernel.detach().clone()

    def _beyond_depth(self, key: str) -> bool:
        match = BLOCK_INDEX.match(key)
        return bool(match) and int(match.group(1)) >= self.model.num_layers


def adapt_checkpoint(model: nn.Module, state_dict: dict, strict: bool = True,
                     truncate: bool = False) -> dict:
    """``state_dict`` of any layout ``model``'s family reads, in ``model``'s layout, for
    ``model.load_state_dict`` (exact or refused: :meth:`CheckpointLoader.adapt`)."""
    return CheckpointLoader(model).adapt(state_dict, strict, truncate)


def init_with_pretrained(model: nn.Module, initialise: Callable[[], None]) -> None:
    """A backbone's initialisation: ``initialise`` (mmengine's ``init_weights``) for its
    ``init_cfg`` but the ``Pretrained`` entries, which then load through
    :meth:`CheckpointLoader.load_pretrained` (after the others, as in mmengine): exactly,
    or with an error naming the options that would load the checkpoint; only tensors new
    in fine-tuning keep their initialisation."""
    init_cfgs = [model.init_cfg] if isinstance(model.init_cfg, dict) else model.init_cfg
    pretrained = [cfg for cfg in init_cfgs or [] if cfg.get('type') == 'Pretrained']
    if model.is_init or not pretrained:
        initialise()
        return
    model.init_cfg = [cfg for cfg in init_cfgs if cfg not in pretrained] or None
    try:
        initialise()
    finally:
        model.init_cfg = init_cfgs
    for cfg in pretrained:
        CheckpointLoader(model).load_pretrained(cfg['checkpoint'], cfg.get('prefix'),
                                                cfg.get('map_location', 'cpu'),
                                                cfg.get('truncate', False))
