"""The dense benchmark: the packaged R50 configs with our backbone swapped in, a synthetic
training iteration, and a tiny run end to end (no timed asserts)."""
import json

import pytest
import torch

pytest.importorskip('mmdet')
pytest.importorskip('mmseg')

from benchmarks import benchmark_dense as tool  # noqa: E402


def _types(cfg) -> set:
    if isinstance(cfg, dict):
        return {cfg.get('type')} | {t for v in cfg.values() for t in _types(v)}
    if isinstance(cfg, (list, tuple)):
        return {t for v in cfg for t in _types(v)}
    return set()


def test_configs_keep_the_r50_model_and_swap_only_the_backbone():
    det = tool.model_config('det', 'xcit:nano_12', 256)
    assert det.type == 'MaskRCNN' and det.backbone.type == 'vitdense.XCiT'
    assert det.neck.in_channels == [128] * 4 and det.rpn_head.type == 'RPNHead'
    seg = tool.model_config('seg', 'vit:small', 256)
    assert seg.decode_head.in_channels == [384] * 4 and seg.auxiliary_head.in_channels == 384
    assert seg.data_preprocessor.size == (256, 256)
    resnet = tool.model_config('seg', tool.RESNET, 256)
    assert resnet.backbone.type == 'ResNetV1c' and resnet.backbone.init_cfg is None
    assert 'SyncBN' in _types(resnet)  # as packaged: one process normalises it as BN


def test_unknown_backbones_and_single_image_segmentation_are_refused():
    with pytest.raises(SystemExit, match='unknown backbone'):
        tool.parse_args(['--backbones', 'xcit:huge'])
    with pytest.raises(SystemExit):
        tool.parse_args(['--tasks', 'seg', '--batch', '1'])


def test_a_detection_iteration_trains_the_backbone():
    pytest.importorskip('mmcv.ops')
    model, iteration = tool.make_iteration('det', 'xcit:nano_12', 64, 1, 'cpu')
    before = model.backbone.blocks[0].attn.qkv.weight.detach().clone()
    iteration()
    assert not torch.equal(before, model.backbone.blocks[0].attn.qkv.weight)


def test_tiny_segmentation_run_end_to_end_writes_table_and_json(tmp_path, capsys):
    out = tmp_path / 'dense'
    tool.main(['--tasks', 'seg', '--backbones', tool.RESNET, 'xcit:nano_12', '--img-size', '64',
               '--batch', '2', '--repeats', '1', '--threads', '1', '--no-memory',
               '--out', str(out)])
    assert 'training iteration' in capsys.readouterr().out
    rows = {row['backbone']: row for row in json.loads(out.with_suffix('.json').read_text())[
        'results']}
    assert rows[tool.RESNET]['time_vs_r50'] == 1.
    xcit = rows['xcit:nano_12']
    assert xcit['iter_s'] > 0 and xcit['gflops_per_iter'] > 0 and xcit['time_vs_r50'] > 0
    assert xcit['backbone_params_m'] < rows[tool.RESNET]['backbone_params_m']
