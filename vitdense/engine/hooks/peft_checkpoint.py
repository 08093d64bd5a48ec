"""Checkpoints of a run with peft adapters that hold what the run trains, not the frozen base.

A backbone built with ``peft`` (``docs/peft.md``) and initialised from a local ``Pretrained``
checkpoint (its base) freezes every tensor the base supplies. This hook leaves those tensors
out of the run's checkpoints and records the base instead, by path and SHA-256: the
checkpoint keeps the adapters, what else trains (pyramid, neck, heads), the buffers of the
modules that train, the optimizer state and the loop state. Loading such a checkpoint
(``resume``, ``load_from``, ``tools/test.py``, ``tools/model_converters/merge_peft.py``)
reads the frozen tensors back from the base the config names (or, where that file is not
there, the recorded one), after checking its checksum (a different file, even at the same
path, is refused), so a resume is exact. A backbone without a local base keeps its frozen
tensors in the checkpoint.
"""
from __future__ import annotations

import hashlib
import os.path as osp
from typing import Any, Callable, Iterator, Optional

from mmengine.hooks import Hook
from mmengine.logging import MMLogger
from mmengine.model import is_model_wrapper
from torch import nn

from vitdense.models import ColumnarBackbone
from vitdense.models.backbones.checkpoint_adaptation import CheckpointLoader
from vitdense.registry import HOOKS

#: the checkpoint ``meta`` entry: backbone prefix -> its base's path, SHA-256 and the number
#: of tensors left out
META_KEY = 'peft_bases'


def file_sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, 'rb') as f:
        for chunk in iter(lambda: f.read(1 << 24), b''):
            digest.update(chunk)
    return digest.hexdigest()


def _pretrained_entry(backbone: ColumnarBackbone) -> Optional[dict]:
    """The backbone's single ``Pretrained`` entry, or None."""
    entries = backbone.init_cfg if isinstance(backbone.init_cfg, list) else [backbone.init_cfg]
    pretrained = [cfg for cfg in entries if cfg and cfg.get('type') == 'Pretrained']
    return pretrained[0] if len(pretrained) == 1 else None


def peft_backbones(model: nn.Module) -> Iterator[tuple[str, ColumnarBackbone, Optional[dict]]]:
    """(state-dict prefix, backbone, its ``Pretrained`` entry or None) of every backbone of
    ``model`` with peft adapters."""
    for name, module in model.named_modules():
        if isinstance(module, ColumnarBackbone) and module.peft is not None:
            yield (f'{name}.' if name else ''), module, _pretrained_entry(module)


def frozen_keys(backbone: nn.Module) -> list[str]:
    """State-dict keys of ``backbone`` that its base supplies and training leaves as they
    are: frozen parameters and the buffers of modules whose parameters are all frozen
    (BatchNorm statistics of the frozen trunk)."""
    keys = [name for name, param in backbone.named_parameters() if not param.requires_grad]
    for name, module in backbone.named_modules():
        params = list(module.parameters(recurse=False))
        if params and not any(param.requires_grad for param in params):
            keys += [f'{name}.{buffer}' if name else buffer
                     for buffer, value in module.named_buffers(recurse=False)
                     if buffer not in module._non_persistent_buffers_set]
    return keys


@HOOKS.register_module()
class PeftCheckpointHook(Hook):
    """Leave the frozen base out of checkpoints and read it back on load (module doc)."""

    priority = 'LOW'

    def __init__(self) -> None:
        self.digests: dict[str, str] = {}  # base path -> SHA-256, computed once a run

    def _digest(self, path: str) -> str:
        if path not in self.digests:
            self.digests[path] = file_sha256(path)
        return self.digests[path]

    @staticmethod
    def _model(runner: Any) -> nn.Module:
        return runner.model.module if is_model_wrapper(runner.model) else runner.model

    def before_save_checkpoint(self, runner: Any, checkpoint: dict) -> None:
        bases = {}
        state_dict = checkpoint['state_dict']
        for prefix, backbone, base in peft_backbones(self._model(runner)):
            if base is None or not osp.isfile(str(base['checkpoint'])):
                continue  # no local base to read the frozen tensors back from: kept
            keys = frozen_keys(backbone)
            for key in keys:
                del state_dict[prefix + key]
            bases[prefix] = dict(path=str(base['checkpoint']), prefix=base.get('prefix'),
                                 sha256=self._digest(str(base['checkpoint'])),
                                 tensors=len(keys))
        if bases:
            checkpoint.setdefault('meta', {})[META_KEY] = bases

    def after_load_checkpoint(self, runner: Any, checkpoint: dict) -> None:
        fill_frozen_base(self._model(runner), checkpoint, self._digest)


def fill_frozen_base(model: nn.Module, checkpoint: dict,
                     digest: Callable[[str], str] = file_sha256) -> None:
    """Put into ``checkpoint['state_dict']`` the frozen tensors that
    :class:`PeftCheckpointHook` left out, read from each base that its ``meta`` names: the
    file that ``model``'s config gives, or the recorded path where the config names none
    that exists (a run started with ``--cfg-options``); raises ValueError when that file's
    checksum is not the recorded one. A checkpoint that left nothing out is not changed."""
    bases = (checkpoint.get('meta') or {}).get(META_KEY)
    if not bases:
        return
    backbones = {prefix: (backbone, base) for prefix, backbone, base in peft_backbones(model)}
    state_dict = checkpoint['state_dict']
    for prefix, recorded in bases.items():
        if prefix not in backbones:
            raise ValueError(f'the checkpoint leaves out the frozen base of {prefix!r} '
                             f'({recorded["path"]}), but this model has no backbone with '
                             f'peft there to read it into')
        backbone, base = backbones[prefix]
        # the config's base where it names a file, else the one recorded: either way the
        # recorded checksum's
        path = str(base['checkpoint']) if base and osp.isfile(str(base['checkpoint'])) \
            else recorded['path']
        if not osp.isfile(path):
            raise FileNotFoundError(f'the checkpoint leaves out the frozen base of '
                                    f'{prefix!r}, {recorded["path"]}, which is not there; give '
                                    f'it (model.backbone init_cfg checkpoint)')
        found = digest(path)
        if found != recorded['sha256']:
            raise ValueError(
                f'the checkpoint was trained on the base {recorded["path"]} (sha256 '
                f'{recorded["sha256"][:16]}...), but the config\'s base {path} has sha256 '
                f'{found[:16]}...: give the base it was trained on '
                f'(model.backbone init_cfg checkpoint)')
        base = base or {}
        weights = CheckpointLoader(backbone).read_pretrained(
            path, base.get('prefix', recorded['prefix']), base.get('map_location', 'cpu'),
            base.get('truncate', False))
        for key in frozen_keys(backbone):
            state_dict.setdefault(prefix + key, weights[key.replace('.base_layer.', '.')])
        MMLogger.get_current_instance().info(
            f'{prefix or "model"}: {recorded["tensors"]} frozen tensors read from the base '
            f'{path}')
