"""A family's checkpoint layout: what its checkpoints look like, as an object beside the
family (its ``checkpoint_layout``), never methods of the model.

A :class:`CheckpointLayout` holds the family's key table (:mod:`.checkpoint_keys`, read
forward on load and backward on the export to timm), the patterns that mark its
checkpoints, the layouts whose options no shape shows, the position kernels of the
libraries it reads, and the keywords of its timm model. A family whose checkpoints need
rules beyond tables (ViT: :mod:`.checkpoint_vit`) subclasses it and overrides the hooks;
the loader (:mod:`.checkpoint_adaptation`) and the diagnosis (:mod:`.checkpoint_diagnosis`)
call them with the model they serve.
"""
import re
from dataclasses import dataclass, field
from typing import Any, Collection, Optional

import torch
import torch.nn as nn
from mmengine.logging import MMLogger

from ..layers.embed import PositionKernel
from .checkpoint_keys import SHARED_KEYS, KeyTable

#: our tensors timm's models have no module for: the dense pyramid, new in fine-tuning, the
#: position kernel (timm's models resample with their own) and the table's saved grid
NOT_IN_TIMM = r'^(pyramid\.|pos_embed\.(kernel|table_grid)$)'
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


#: a layout whose options no tensor's shape shows: (a key pattern of the layout as saved, a
#: key pattern it lacks or None, the options that build it, a note)
SourceLayout = tuple[str, Optional[str], dict, str]
#: an option that a source's files were built with by their config and no tensor shows, so
#: that a model must be given it explicitly to load them: (a key pattern of the layout as
#: saved, the option's name, the advice naming it, e.g. ``'norm_eps=1e-06 or ...'``)
UnshownOption = tuple[str, str, str]
#: the resampling of a library's position tables: (key patterns that each match a key of
#: its layout as saved, a pattern none matches or None, its kernel)
LayoutKernel = tuple[tuple[str, ...], Optional[str], PositionKernel]


@dataclass(frozen=True)
class CheckpointLayout:
    """The checkpoints of one family (``family``: its class name, for messages)."""
    family: str
    #: the family's checkpoint keys (timm's, read both ways; other layouts'; tensors merged
    #: and split), after ``checkpoint_keys.SHARED_KEYS``
    keys: KeyTable = KeyTable()
    #: key patterns only this family's checkpoints have all of (what an error names)
    markers: tuple[str, ...] = ()
    #: the layouts of sources whose options the tensors' shapes do not show: the options of
    #: every layout a checkpoint has are named where the model's settings differ
    source_layouts: tuple[SourceLayout, ...] = ()
    #: options of sources whose configs differ in them and whose files show none: a load
    #: of such a file into a model built without the option is refused, naming it
    unshown_options: tuple[UnshownOption, ...] = ()
    #: how the library of a checkpoint layout resamples position tables; the first layout
    #: the checkpoint has gives the kernel, at load and in forward, of a model built without
    #: ``pos_antialias``; none: timm's antialiased bicubic
    position_kernels: tuple[LayoutKernel, ...] = ()
    #: the family's settings (arch keys, else model attributes) -> the keyword of its timm
    #: model's constructor, beside the shared ones (``timm_export.SHARED_TIMM_ARGUMENTS``)
    timm_arguments: dict[str, str] = field(default_factory=dict)
    #: the family's options the timm model it exports to has no counterpart for -> the value
    #: that model computes: an export of a backbone with another value is refused, naming it
    timm_inexpressible: dict[str, Any] = field(default_factory=dict)
    #: whether the timm model's ``embed_dim`` is per head (timm's ConViT)
    timm_embed_dim_per_head: bool = False
    #: tensors of the model a checkpoint may lack: new in fine-tuning, initialised so that
    #: the checkpoint's function is kept (the dense pyramid, zero relative position tables)
    new_in_fine_tuning: str = r'^pyramid\.|\.attn\.rel_pos\.'
    #: checkpoint tensors of the classification stage (final norm, class attention): a
    #: dense model builds none of them and leaves them unused
    classification_keys: str = r'^(norm|fc_norm|cls_blocks)\.'
    #: checkpoint tensors of the tokens prepended to the patches: unused by a model that
    #: builds no class token (a dense trunk without it, ViTDet)
    prefix_token_keys: str = r'^(cls_token|reg_token)$'

    def table(self) -> KeyTable:
        """The family's key table after the shared one."""
        return SHARED_KEYS + self.keys

    def weights(self, checkpoint: dict) -> dict:
        """The weights of a loaded file (:func:`checkpoint_weights`)."""
        return checkpoint_weights(checkpoint)

    def convert(self, state_dict: dict) -> dict:
        """An official release or a timm state dict of this family in our keys
        (:meth:`table`). Keys already in our layout pass through unchanged; classifier heads
        are dropped, and so are the tensors of a source's pretraining or other tasks that the
        family has no module for, logged."""
        converted, left_out = self.table().to_ours(self.weights(state_dict))
        if left_out:
            MMLogger.get_current_instance().info(
                f'{self.family} leaves out {len(left_out)} checkpoint tensors of its source\'s '
                f'pretraining or other tasks: {", ".join(left_out[:6])}'
                f'{", ..." if len(left_out) > 6 else ""}')
        return converted

    def export_to_timm(self, state_dict: dict) -> dict:
        """A backbone state dict of this family in our layout, in the layout of the family's
        timm model (:meth:`table` read backward); the dense pyramid, which timm has no module
        for, is left out.

        Raises ValueError unless loading the result back (:meth:`convert`) gives every
        tensor exactly: a table whose renames or tensor rules are not one-to-one.
        """
        kept = {k: v for k, v in state_dict.items() if not re.match(NOT_IN_TIMM, k)}
        exported = self.table().to_timm(kept)
        loaded_back = self.convert(exported)
        differing = sorted(k for k in kept.keys() | loaded_back.keys()
                           if k not in kept or k not in loaded_back
                           or not torch.equal(kept[k], loaded_back[k]))
        if differing:
            raise ValueError(
                f'{self.family}: the timm export does not load back exactly for '
                f'{len(differing)} tensors ({", ".join(differing[:6])}): a Rename or '
                f'TensorRule of its checkpoint layout is not one-to-one')
        return exported

    # ---------------------------------------------------------------- family hooks
    def fit_tensors(self, model: nn.Module, converted: dict) -> dict:
        """Converted checkpoint tensors brought to ``model``'s shapes before they are
        checked (none here; ViT resamples BEiT's relative position tables)."""
        return converted

    def mechanisms_not_built(self, saved_keys: list[str]) -> list[str]:
        """What a checkpoint computes that no option of the family builds, as its keys (as
        saved, in their order) show: each a phrase after "the checkpoint has" (none here)."""
        return []

    def order_options(self, model: nn.Module, saved_keys: list[str]) -> list[str]:
        """The options that the order of a checkpoint's keys (as saved) shows and ``model``'s
        settings differ from, as the advice writes them: a load they name is refused,
        whatever the shapes (none here; ViT's res-post-norm blocks)."""
        return []

    def unchosen_options(self, model: nn.Module, saved_keys: list[str], converted: dict
                         ) -> list[str]:
        """The advice of each of the ``unshown_options`` whose layout a checkpoint's keys
        (as saved) have and which ``model`` was not given (:meth:`chosen`): a load they
        name is refused, whatever the shapes. ``converted``: its tensors in our layout,
        which a family's rule reads (XCiT's class-attention norm)."""
        return [advice for pattern, option, advice in self.unshown_options
                if not self.chosen(model, option) and
                any(re.search(pattern, k) for k in saved_keys)]

    @staticmethod
    def chosen(model: nn.Module, option: str) -> bool:
        """Whether ``model`` was given ``option`` (a keyword, ``arch_overrides`` or an arch
        dict) rather than taking its arch's or the family's default."""
        given = model.given_options()
        arch = given.get('arch')
        return given.get(option) is not None or option in (given.get('arch_overrides') or {}) \
            or isinstance(arch, dict) and option in arch

    def family_options(self, model: nn.Module, found: dict) -> list[str]:
        """Options beyond the shared ones that the checkpoint's facts (``found``) name for
        ``model`` (none here; ViT's rotary reference grid)."""
        return []

    def built_by_other_modes(self, model: nn.Module, key: str, checkpoint: Collection[str]
                             ) -> bool:
        """Whether tensor ``key`` of a ``checkpoint`` (its keys, converted) belongs to a
        part ``model``'s mode does not build: the classification stage of a dense model,
        the class token (and registers) of a trunk that carries none."""
        return bool(model.dense and re.match(self.classification_keys, key) or
                    model.cls_token is None and re.match(self.prefix_token_keys, key))
