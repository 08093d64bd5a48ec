"""The hosts' own entry points on the default install, each in a fresh interpreter with no call
of ours and no environment variable of ours (``PYTHONPATH`` only picks this checkout's
vitdense, the one the environment has installed): mmdet's and mmseg's ``tools/train.py`` train
a demo config, ``--resume`` continues it to the weights of the uninterrupted run and
``tools/test.py`` evaluates it; the three inferencers, given a checkpoint of our
``tools/train.py``, predict what ``tools/infer.py`` does; every checkpoint written loads with
``torch.load``'s defaults."""
from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from tools import infer
from vitdense.demo_data import make_demo_ade, make_demo_coco, make_demo_imagenet

from common import CHECKOUT_ENV, REPO_ROOT

CONFIGS = {
    'mmdet': 'configs/xcit/mask-rcnn_xcit-d6-p8_fpn_demo-coco.py',
    'mmseg': 'configs/xcit/upernet_xcit-d6-p8_demo-ade.py',
    'mmpretrain': 'configs/vit/vit-mini-p16_1xb64-a2-8e_demo-in10-64px.py',
}
IMAGE = 'one.jpg'


def _python(*args: str | Path, cwd: Path = REPO_ROOT) -> str:
    """Run ``python ARGS`` in a fresh interpreter; its output (it must succeed)."""
    result = subprocess.run([sys.executable, *map(str, args)], cwd=cwd, capture_output=True,
                            text=True, env=CHECKOUT_ENV)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout + result.stderr


def _host_tool(package: str, name: str) -> Path:
    """``tools/<name>`` as the installed host package ships it (``.mim/tools``)."""
    return Path(importlib.util.find_spec(package).origin).parent / '.mim/tools' / name


@pytest.fixture(scope='session')
def demo_sets(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp('demo_sets')
    return {'mmdet': make_demo_coco(root / 'coco', num_train=2, num_val=1, size=64),
            'mmseg': make_demo_ade(root / 'ade', num_train=2, num_val=1, size=64),
            'mmpretrain': make_demo_imagenet(root / 'in10', num_train=1, num_val=1, size=72)}


def _options(task: str, data_root: Path, iters: int) -> list[str]:
    """--cfg-options: ``iters`` deterministic iterations of 2 images, a checkpoint after
    each, on ``data_root``."""
    options = [f'{split}_dataloader.{key}' for split in ('train', 'val', 'test')
               for key in (f'dataset.data_root={data_root}', 'num_workers=0',
                           'persistent_workers=False')]
    options += ['randomness.seed=0', 'randomness.deterministic=True',
                'default_hooks.checkpoint.interval=1', 'default_hooks.checkpoint.max_keep_ckpts=-1']
    if task == 'mmpretrain':  # trained by epoch: one epoch of the one training image
        return ['--cfg-options', *options, 'train_cfg.max_epochs=1', 'train_cfg.val_interval=1']
    options += [f'train_cfg.max_iters={iters}', f'train_cfg.val_interval={iters}',
                'train_dataloader.batch_size=2']
    if task == 'mmdet':
        annotations = data_root / 'annotations/instances_val.json'
        options += [f'val_evaluator.ann_file={annotations}',
                    f'test_evaluator.ann_file={annotations}']
    else:
        options += ['model.data_preprocessor.size=(64,64)']
    return ['--cfg-options', *options]


@pytest.fixture(scope='session')
def our_checkpoints(demo_sets, tmp_path_factory) -> dict[str, Path]:
    """A checkpoint of each demo config, written by our tools/train.py after one iteration
    (one epoch for the classifier)."""
    checkpoints = {}
    for task, config in CONFIGS.items():
        work = tmp_path_factory.mktemp(f'ours_{task}')
        _python(REPO_ROOT / 'tools/train.py', config, '--work-dir', work, '--skip-data-check',
                *_options(task, demo_sets[task], iters=1))
        checkpoints[task] = work / ('epoch_1.pth' if task == 'mmpretrain' else 'iter_1.pth')
    return checkpoints


def _assert_plain(work_dir: Path) -> int:
    """Every checkpoint under ``work_dir`` loads with torch's defaults; how many there are."""
    checkpoints = sorted(work_dir.rglob('*.pth'))
    for path in checkpoints:
        assert torch.serialization.get_unsafe_globals_in_checkpoint(path) == [], path
        torch.load(path)
    return len(checkpoints)


@pytest.mark.parametrize('task', ['mmdet', 'mmseg'])
def test_host_train_resume_and_test_tools(task, demo_sets, tmp_path):
    options = _options(task, demo_sets[task], iters=2)
    config = tmp_path / 'config.py'  # a user's config on ours, naming our resume hook
    config.write_text(f"_base_ = '{REPO_ROOT / CONFIGS[task]}'\n"
                      "custom_hooks = [dict(type='vitdense.ExactResumeHook')]\n")
    train = _host_tool(task, 'train.py')
    whole, resumed = tmp_path / 'whole', tmp_path / 'resumed'
    _python(train, config, '--work-dir', whole, *options)
    resumed.mkdir()
    shutil.copy(whole / 'iter_1.pth', resumed / 'iter_1.pth')
    (resumed / 'last_checkpoint').write_text(str(resumed / 'iter_1.pth'))
    log = _python(train, config, '--work-dir', resumed, '--resume', *options)
    assert 'resumed epoch: 0, iter: 1' in log
    final, expected = (torch.load(work / 'iter_2.pth')['state_dict'] for work in (resumed, whole))
    assert list(final) == list(expected)
    for key, value in expected.items():
        assert torch.equal(final[key], value), key

    log = _python(_host_tool(task, 'test.py'), config, whole / 'iter_2.pth', '--work-dir',
                  tmp_path / 'test', *options)
    assert ('coco/bbox_mAP' if task == 'mmdet' else 'mIoU') in log
    assert _assert_plain(tmp_path) == 4


# one host's inferencer (each in its own interpreter: the hosts' default scopes clash in one)
INFERENCER = """
import json, sys
import numpy as np
task, config, checkpoint, image = sys.argv[1:]
if task == 'mmdet':
    from mmdet.apis import DetInferencer
    result = DetInferencer(model=config, weights=checkpoint, device='cpu', show_progress=False)(
        image)['predictions'][0]
    result.pop('masks', None)
elif task == 'mmseg':
    from mmseg.apis import MMSegInferencer
    result = np.asarray(MMSegInferencer(model=config, weights=checkpoint, device='cpu')(image)[
        'predictions']).tolist()
else:
    from mmpretrain.apis import ImageClassificationInferencer
    result = np.asarray(ImageClassificationInferencer(model=config, pretrained=checkpoint,
                                                      device='cpu')(image)[0]['pred_scores'])
    result = result.tolist()
print('PREDICTIONS', json.dumps(result))
"""


def test_inferencers_predict_what_our_infer_tool_does(our_checkpoints, image_folder, tmp_path):
    image = image_folder / IMAGE
    configs = {task: str(REPO_ROOT / config) for task, config in CONFIGS.items()}
    hosts = {task: json.loads(_python('-c', INFERENCER, task, configs[task], our_checkpoints[task],
                                      image, cwd=tmp_path).split('PREDICTIONS ', 1)[1]
                              .splitlines()[0]) for task in CONFIGS}
    ours = {task: infer.main([configs[task], str(our_checkpoints[task]), str(image),
                              '--out-dir', str(tmp_path / task), '--score-thr', '0',
                              '--device', 'cpu'])['predictions'][IMAGE]
            for task in CONFIGS}
    det = hosts['mmdet']
    assert len(det['bboxes']) == len(ours['mmdet']['bboxes']) > 0
    np.testing.assert_allclose(ours['mmdet']['bboxes'], det['bboxes'], atol=1e-3)
    np.testing.assert_allclose(ours['mmdet']['scores'], det['scores'], atol=1e-5)
    assert ours['mmdet']['labels'] == det['labels']
    label_map = np.asarray(Image.open(tmp_path / 'mmseg' / ours['mmseg']['label_map']))
    assert np.array_equal(label_map, np.asarray(hosts['mmseg']))
    scores = np.asarray(hosts['mmpretrain'])
    top = [entry['label'] for entry in ours['mmpretrain']['top_k']]
    assert top == np.argsort(-scores, kind='stable')[:len(top)].tolist()
    np.testing.assert_allclose([entry['score'] for entry in ours['mmpretrain']['top_k']],
                               scores[top], atol=1e-6)
    assert sum(_assert_plain(path.parent) for path in our_checkpoints.values()) >= 3
