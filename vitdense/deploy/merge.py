"""A checkpoint trained with peft adapters (the backbones' ``peft`` option) as a plain
checkpoint: the adapters merged into the weights they adapt (peft's merge), loadable strictly
by the same config without ``peft`` and exported from there as any model.

The merge is checked before anything is written: the plain model, built from the config
without ``peft`` and loaded strictly, gives the backbone outputs of the adapted model on a
random batch within :data:`MERGE_TOLERANCE` (float32).
"""
from __future__ import annotations

import copy
import os
import os.path as osp
from typing import Any, NamedTuple

import torch
from mmengine.config import Config
from torch import nn

from ..checkpoint_io import load_checkpoint, save_plain
from ..engine.hooks.peft_checkpoint import META_KEY as PEFT_BASES
from ..engine.hooks.peft_checkpoint import fill_frozen_base
from ..model_factory import build_model
from ..models.backbones.checkpoint_layout import checkpoint_weights

#: largest difference of the merged model's backbone outputs from the adapted model's, over
#: the outputs' largest magnitude: float32 rounding of the merged sums (measured ~1e-7)
MERGE_TOLERANCE = 1e-5
#: the random batch the merge is checked on: two images of this size
CHECK_SIZE = (128, 128)


class MergeReport(NamedTuple):
    """What :func:`merge_peft_checkpoint` did: layers merged, tensors written, and the
    largest relative difference of the merged model's backbone outputs."""
    merged_layers: int
    tensors: int
    max_relative_difference: float


def config_without_peft(cfg: Config) -> Config:
    """``cfg`` with the ``peft`` option of every backbone in ``cfg.model`` removed (the
    backbone itself, ViT-Adapter's trunk, a distillation teacher's); raises ValueError
    where there is none: nothing to merge."""
    plain = copy.deepcopy(cfg)
    found = []

    def strip(node: Any) -> None:
        if isinstance(node, dict):
            if node.get('peft') is not None:
                found.append(node.get('type'))
            node.pop('peft', None)
            for value in node.values():
                strip(value)
        elif isinstance(node, (list, tuple)):
            for value in node:
                strip(value)

    strip(plain.model)
    if not found:
        raise ValueError('the config builds no backbone with a peft option: its checkpoints '
                         'are plain already')
    return plain


def _relative_difference(ours: list[torch.Tensor], reference: list[torch.Tensor]) -> float:
    return max(((a - b).abs().max() / b.abs().max()).item() for a, b in zip(ours, reference))


def _backbone_outputs(model: nn.Module, image: torch.Tensor) -> list[torch.Tensor]:
    with torch.no_grad():
        return list(model.backbone(image))


def merge_peft_checkpoint(cfg: Config, checkpoint: str | os.PathLike,
                          out: str | os.PathLike) -> MergeReport:
    """Merge the adapters of ``checkpoint`` (a whole model of ``cfg``, whose backbone has a
    ``peft`` option; where :class:`~vitdense.engine.PeftCheckpointHook` left the frozen base
    out, it is read back) and write the plain checkpoint to ``out`` (its ``meta`` kept, with
    ``peft_merged_from``), atomically; an existing ``out`` is refused (FileExistsError),
    before any work and again at the write. Raises ValueError when the merged model does
    not give the adapted one's outputs (:data:`MERGE_TOLERANCE`)."""
    if osp.exists(out):
        raise FileExistsError(f'{os.fspath(out)} exists; it is kept (choose another OUT)')
    plain_cfg = config_without_peft(cfg)
    source = load_checkpoint(os.fspath(checkpoint), map_location='cpu')
    adapted = build_model(cfg, 'count')
    # a checkpoint that PeftCheckpointHook wrote holds no frozen base: read it back
    fill_frozen_base(adapted, source)
    adapted.load_state_dict(checkpoint_weights(source), strict=True)
    adapted.eval()
    image = torch.randn(2, 3, *CHECK_SIZE, generator=torch.Generator().manual_seed(0))
    reference = _backbone_outputs(adapted, image)
    # imported here: peft (and the transformers it imports) loads in seconds, which
    # ``import vitdense.deploy`` for an export does not need
    from ..models.backbones.peft_tuning import merge_adapters
    merged_layers = merge_adapters(adapted)
    state_dict = adapted.state_dict()
    plain = build_model(plain_cfg, 'count')
    plain.load_state_dict(state_dict, strict=True)
    plain.eval()
    difference = _relative_difference(_backbone_outputs(plain, image), reference)
    if not difference <= MERGE_TOLERANCE:
        raise ValueError(f'the merged model\'s backbone outputs differ from the adapted '
                         f'model\'s by {difference:.2e} (relative), more than '
                         f'{MERGE_TOLERANCE:.0e}: nothing written')
    meta = {key: value for key, value in (source.get('meta') or {}).items()
            if key != PEFT_BASES}
    meta['peft_merged_from'] = os.fspath(checkpoint)
    save_plain(dict(meta=meta, state_dict=state_dict), out, overwrite=False)
    return MergeReport(merged_layers, len(state_dict), difference)
