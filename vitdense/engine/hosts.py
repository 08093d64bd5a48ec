"""Where the host libraries' own tools differ (how test images are drawn, how predictions
are dumped): one table, :data:`HOSTS`, looked up by a config's ``default_scope``
(:func:`host_of`). Registering the library and building the config's model are
:mod:`vitdense.model_factory`'s.
"""
from __future__ import annotations

import os.path as osp
from dataclasses import dataclass
from typing import Callable

from mmengine.config import Config

from vitdense.model_factory import host_scope


def _draw_mmdet(cfg: Config, show_dir: str) -> None:
    cfg.default_hooks.visualization.update(draw=True, test_out_dir=osp.abspath(show_dir))


def _draw_mmseg(cfg: Config, show_dir: str) -> None:
    cfg.default_hooks.visualization.update(draw=True, interval=1)
    cfg.visualizer.save_dir = osp.abspath(show_dir)


def _draw_mmpretrain(cfg: Config, show_dir: str) -> None:
    cfg.default_hooks.visualization.update(enable=True, interval=1,
                                           out_dir=osp.abspath(show_dir))


@dataclass(frozen=True)
class Host:
    """How one OpenMMLab library's own tools draw (every image) and dump test results."""

    draw: Callable[[Config, str], None]
    dump_metric: Callable[[str], dict]
    out_help: str


HOSTS = {
    'mmdet': Host(_draw_mmdet,
                  lambda out: dict(type='DumpDetResults', out_file_path=out),
                  'pickle file of the predictions (masks RLE-encoded)'),
    'mmseg': Host(_draw_mmseg,
                  lambda out: dict(type='IoUMetric', output_dir=out, format_only=True),
                  'folder for the predicted label maps (PNG)'),
    'mmpretrain': Host(_draw_mmpretrain,
                       lambda out: dict(type='DumpResults', out_file_path=out),
                       'pickle file of the predictions'),
}


def host_of(cfg: Config) -> Host:
    """How the tools of the library ``cfg.default_scope`` names draw and dump (a look-up:
    :func:`vitdense.model_factory.register_host` imports and registers the library)."""
    return HOSTS[host_scope(cfg)]
