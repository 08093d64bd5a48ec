"""The demo datasets: seeded, exact visible-part masks, the layouts mmdet / mmseg read."""
import json
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
from pycocotools import mask as mask_utils

from vitdense.demo_data import ADE_CLASSES, SHAPE_CLASSES, make_demo_ade, make_demo_coco
from vitdense.demo_data.shapes import CLASS_COLOURS, render_shapes

from common import CHECKOUT_ENV, REPO_ROOT


def _tree(folder: Path) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes()
            for p in sorted(folder.rglob('*')) if p.is_file()}


@pytest.fixture(scope='module')
def coco(tmp_path_factory) -> Path:
    return make_demo_coco(tmp_path_factory.mktemp('coco'), num_train=12, num_val=4, size=96)


@pytest.fixture(scope='module')
def ade(tmp_path_factory) -> Path:
    return make_demo_ade(tmp_path_factory.mktemp('ade'), num_train=12, num_val=4, size=64)


def test_coco_is_a_function_of_its_seed(coco, tmp_path):
    again = make_demo_coco(tmp_path / 'again', num_train=12, num_val=4, size=96)
    assert _tree(again) == _tree(coco)
    other = make_demo_coco(tmp_path / 'other', num_train=12, num_val=4, size=96, seed=1)
    assert _tree(other) != _tree(coco)


def test_first_images_do_not_depend_on_the_count(coco, tmp_path):
    fewer = make_demo_coco(tmp_path / 'fewer', num_train=5, num_val=1, size=96)
    assert (fewer / 'train' / '000004.jpg').read_bytes() == \
        (coco / 'train' / '000004.jpg').read_bytes()


def test_coco_annotations_are_valid_visible_masks(coco):
    data = json.loads((coco / 'annotations' / 'instances_train.json').read_text())
    assert [c['name'] for c in data['categories']] == list(SHAPE_CLASSES)
    assert len(data['images']) == 12
    per_image: dict = {}
    for ann in data['annotations']:
        mask = mask_utils.decode(ann['segmentation']).astype(bool)
        assert mask.shape == (96, 96)
        assert ann['area'] == mask.sum() >= 40
        ys, xs = np.nonzero(mask)
        assert ann['bbox'] == [xs.min(), ys.min(), xs.max() - xs.min() + 1,
                               ys.max() - ys.min() + 1]
        assert 1 <= ann['category_id'] <= 3 and ann['iscrowd'] == 0
        per_image.setdefault(ann['image_id'], []).append(mask)
    assert set(per_image) == {image['id'] for image in data['images']}
    for masks in per_image.values():
        assert 1 <= len(masks) <= 4
        assert np.sum(masks, axis=0).max() == 1  # occluded parts belong to the occluder only


def test_scene_pixels_follow_the_masks():
    scenes = [render_shapes(np.random.default_rng(i), 96) for i in range(30)]
    occluded = 0
    for scene in scenes:
        for mask in scene.masks:
            inside = scene.image[mask].astype(float)
            assert inside.std(axis=0).max() < 10  # one flat colour plus pixel noise
        occluded += any(not _is_convex_blob(mask) for mask in scene.masks)
    assert occluded > 0, 'no scene with an occluded shape'


def test_object_colours_follow_the_class_unless_random():
    def mean_colours(class_colours):
        found = {}
        for i in range(30):
            scene = render_shapes(np.random.default_rng(i), 96, class_colours=class_colours)
            for kind, mask in zip(scene.labels, scene.masks):
                found.setdefault(kind, []).append(scene.image[mask].mean(axis=0))
        return {kind: np.array(colours) for kind, colours in found.items()}

    for kind, colours in mean_colours(True).items():
        assert np.abs(colours - CLASS_COLOURS[kind]).max() < 40 + 10  # jitter + noise
    spread = np.concatenate(list(mean_colours(False).values())).std(axis=0)
    assert spread.min() > 50, 'random colours should span the RGB cube'


def _is_convex_blob(mask: np.ndarray) -> bool:
    contours, _ = cv2.findContours(mask.astype(np.uint8), cv2.RETR_EXTERNAL,
                                   cv2.CHAIN_APPROX_NONE)
    hull = cv2.convexHull(np.concatenate(contours))
    return len(contours) == 1 and mask.sum() >= 0.9 * cv2.contourArea(hull)


def test_ade_layout_and_labels(ade, tmp_path):
    for folder, count in (('training', 12), ('validation', 4)):
        images = sorted((ade / 'images' / folder).glob('*.jpg'))
        labels = sorted((ade / 'annotations' / folder).glob('*.png'))
        assert len(images) == count
        assert [p.stem for p in images] == [p.stem for p in labels]
    seen = set()
    for path in (ade / 'annotations' / 'training').glob('*.png'):
        label = cv2.imread(str(path), cv2.IMREAD_UNCHANGED)
        assert label.dtype == np.uint8 and label.shape == (64, 64)
        seen |= set(np.unique(label).tolist())
    assert seen == set(range(len(ADE_CLASSES) + 1))  # 0 = clutter, ignored by mmseg
    assert _tree(make_demo_ade(tmp_path / 'again', num_train=12, num_val=4, size=64)) == \
        _tree(ade)


@pytest.mark.parametrize('kind, train_images',
                         [('ade', 'images/training'), ('panoptic', 'train')],
                         ids=['ade', 'panoptic'])
def test_cli_writes_the_named_folder(kind, train_images, tmp_path):
    out = tmp_path / f'cli_{kind}'
    subprocess.run([sys.executable, str(REPO_ROOT / 'tools' / 'data' / 'make_demo_data.py'), kind,
                    '--out', str(out), '--num-train', '2', '--num-val', '1', '--size', '32'],
                   check=True, capture_output=True, env=CHECKOUT_ENV)
    assert len(list((out / train_images).glob('*.jpg'))) == 2
