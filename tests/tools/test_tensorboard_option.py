"""The TensorBoard option of every host's runtime (``tools/train.py --tensorboard``): the
config's visualizer also writes TensorBoard events whose scalars read back, and keeps the
local JSON scalars that tools/analysis_tools/plot_logs.py reads."""

import pytest
from mmengine.config import Config
from mmengine.registry import VISUALIZERS, init_default_scope
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from vitdense.model_factory import register_host
from vitdense.engine.tool_config import log_to_tensorboard

from common import REPO_ROOT


@pytest.mark.parametrize('config', [
    'configs/vit/vit-mini-p16_1xb64-a2-8e_demo-in10-64px.py',
    'configs/xcit/mask-rcnn_xcit-d6-p8_fpn_demo-coco.py',
    'configs/cait/upernet_cait-d6-p8_demo-ade.py',
])
def test_the_option_writes_tensorboard_scalars(config, tmp_path):
    cfg = Config.fromfile(str(REPO_ROOT / config))
    log_to_tensorboard(cfg)
    log_to_tensorboard(cfg)  # once is enough
    assert [b['type'] for b in cfg.visualizer.vis_backends] == ['LocalVisBackend',
                                                            'TensorboardVisBackend']
    register_host(cfg)
    init_default_scope(cfg.default_scope)
    visualizer = VISUALIZERS.build(dict(cfg.visualizer, save_dir=str(tmp_path),
                                        name=f'tb_{tmp_path.name}'))
    for step, loss in enumerate((2.0, 1.5, 1.25), 1):
        visualizer.add_scalars(dict(loss=loss), step=step)
    visualizer.close()
    (events,) = tmp_path.rglob('events.out.tfevents.*')
    accumulator = EventAccumulator(str(events))
    accumulator.Reload()
    assert [(s.step, s.value) for s in accumulator.Scalars('loss')] == [
        (1, 2.0), (2, 1.5), (3, 1.25)]
