"""tools/deployment/export.py as a user runs it: a backbone exported with dynamic size and
checked on images of two sizes; wrong arguments and an existing file refused, by the same
command line run in this process, before a model is built."""
from __future__ import annotations

import subprocess
import sys
from unittest import mock

import numpy as np
import pytest
import torch
from common import CHECKOUT_ENV, CONFIGS, REPO_ROOT, require_onnx
from PIL import Image

TOOL = REPO_ROOT / 'tools/deployment/export.py'
CONFIG = CONFIGS / 'xcit/upernet_xcit-d6-p8_demo-ade.py'
TINY = ['--cfg-options', 'model.backbone.arch.embed_dims=32', 'model.backbone.arch.num_layers=4',
        'model.backbone.arch.num_heads=2']


def _run(*args: str) -> subprocess.CompletedProcess:
    """The tool in a new interpreter, as a user runs it."""
    return subprocess.run([sys.executable, str(TOOL), *args], env=CHECKOUT_ENV,
                          capture_output=True, text=True, timeout=600)


def test_backbone_export_is_checked_on_every_image(tmp_path):
    require_onnx()
    rng = np.random.default_rng(0)
    images = []
    for height, width in ((96, 128), (80, 150)):
        images.append(tmp_path / f'{height}x{width}.png')
        Image.fromarray(rng.integers(0, 255, (height, width, 3), dtype=np.uint8)).save(images[-1])
    out = tmp_path / 'backbone.onnx'
    result = _run(str(CONFIG), 'none', '--part', 'backbone', '--dynamic', '--out', str(out),
                  '--image', *map(str, images), *TINY)
    assert result.returncode == 0, result.stdout + result.stderr
    assert out.is_file()
    lines = result.stdout.splitlines()
    assert any(line.startswith('exported backbone (dynamic H×W)') for line in lines)
    checks = [line for line in lines if line.startswith('image ')]
    assert [line.split(':')[0] for line in checks] == ['image 0 (96×128)', 'image 1 (80×150)']
    assert lines[-1] == 'exported model matches PyTorch'


def _refusal(capsys, *args: str) -> str:
    """The tool's command line run in this process (no interpreter to start): it must exit
    with argparse's status 2 before building a model; its message."""
    from tools.deployment import export

    with pytest.raises(SystemExit) as exit_, mock.patch.object(
            export, 'build_model', side_effect=AssertionError('a model was built')):
        export.main([str(CONFIG), 'none', *args])
    assert exit_.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize('args, message', [
    (['--format', 'torch-export', '--out', 'model.onnx'], 'writes a .pt2 file'),
    (['--out', 'model.onnx', '--part', 'head'], "invalid choice: 'head'"),
])
def test_wrong_arguments_are_refused(capsys, args, message):
    assert message in _refusal(capsys, *args)


def test_an_existing_file_is_not_overwritten(tmp_path, capsys):
    out = tmp_path / 'model.onnx'
    out.write_text('keep me')
    assert 'exists; pass --overwrite' in _refusal(capsys, '--out', str(out))
    assert out.read_text() == 'keep me'


def test_evaluate_holds_the_segmentor_labels_to_min_agreement(tmp_path, capsys):
    """A stand-in for the exported file that gives 4 of a 64 × 64 image's pixels another
    label: 99.9 % agree, which passes at --min-agreement 0.99 and fails at 0.9995."""
    from mmengine.config import Config

    from tools.deployment import export
    from vitdense.demo_data import make_demo_ade
    from vitdense.deploy import deployable
    from vitdense.model_factory import build_model

    cfg = Config.fromfile(CONFIG)
    cfg.merge_from_dict(dict(model=dict(
        backbone=dict(arch=dict(embed_dims=32, num_layers=4, num_heads=2)),
        decode_head=dict(in_channels=[32] * 4, channels=32),
        auxiliary_head=dict(in_channels=32, channels=16))))
    cfg.val_dataloader.dataset.data_root = str(
        make_demo_ade(tmp_path / 'ade', num_train=1, num_val=2, size=64))
    cfg.val_dataloader.dataset.pipeline = [
        step for step in cfg.val_dataloader.dataset.pipeline if step.type != 'Resize']
    model = build_model(cfg, 'deploy')
    graph, kind = deployable(model)

    def four_pixels_differ(image):
        with torch.no_grad():
            logits, labels = graph(image)
        labels = labels.clone()
        labels[..., :2, :2] = (labels[..., :2, :2] + 1) % logits.shape[1]
        return logits, labels

    assert export.evaluate(cfg, kind, model, four_pixels_differ, min_agreement=0.99)
    assert 'labels equal on 99.902% of 8192 pixels (>= 99%)' in capsys.readouterr().out
    assert not export.evaluate(cfg, kind, model, four_pixels_differ, min_agreement=0.9995)
    assert '(>= 99.95%)' in capsys.readouterr().out
