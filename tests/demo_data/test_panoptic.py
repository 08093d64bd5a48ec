"""The demo COCO panoptic set: seeded, the demo ADE scenes with their objects apart, in the
layout mmdet's CocoPanopticDataset and CocoPanopticMetric read (a perfect prediction scores
PQ 100 by the metric, a wrong one less)."""
import json
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from mmdet.evaluation import CocoPanopticMetric
from mmdet.evaluation.functional import INSTANCE_OFFSET

from vitdense.demo_data import (ADE_CLASSES, PANOPTIC_CLASSES, SHAPE_CLASSES, make_demo_ade,
                                make_demo_panoptic)

SIZE = 64


def _tree(folder: Path) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes()
            for p in sorted(folder.rglob('*')) if p.is_file()}


def _ids(png: Path) -> np.ndarray:
    """A COCO panoptic PNG's segment ids: R + 256 G + 256² B."""
    rgb = cv2.imread(str(png))[..., ::-1].astype(np.int64)
    return rgb[..., 0] + 256 * rgb[..., 1] + 256 ** 2 * rgb[..., 2]


@pytest.fixture(scope='module')
def panoptic(tmp_path_factory) -> Path:
    return make_demo_panoptic(tmp_path_factory.mktemp('panoptic'), num_train=6, num_val=4,
                              size=SIZE)


def test_panoptic_is_a_function_of_its_seed(panoptic, tmp_path):
    again = make_demo_panoptic(tmp_path / 'again', num_train=6, num_val=4, size=SIZE)
    assert _tree(again) == _tree(panoptic)
    other = make_demo_panoptic(tmp_path / 'other', num_train=6, num_val=4, size=SIZE, seed=1)
    assert _tree(other) != _tree(panoptic)


@pytest.mark.parametrize('split', ['train', 'val'])
def test_segments_match_their_pngs_and_the_ade_scenes(panoptic, split, tmp_path):
    data = json.loads((panoptic / 'annotations' / f'panoptic_{split}.json').read_text())
    assert [(c['id'], c['name'], c['isthing']) for c in data['categories']] == [
        (1, 'circle', 1), (2, 'square', 1), (3, 'triangle', 1), (4, 'wall', 0), (5, 'floor', 0)]
    count = len(data['images'])
    ade = make_demo_ade(tmp_path / 'ade', num_train=6, num_val=4, size=SIZE)
    folder = 'training' if split == 'train' else 'validation'
    things = 0
    for image, ann in zip(data['images'], data['annotations']):
        assert image['id'] == ann['image_id']
        assert (panoptic / split / image['file_name']).read_bytes() == \
            (ade / 'images' / folder / f'ADE_{split}_{image["id"]:08d}.jpg').read_bytes()
        ids = _ids(panoptic / 'annotations' / f'panoptic_{split}' / ann['file_name'])
        assert ids.shape == (SIZE, SIZE)
        segments = {s['id']: s for s in ann['segments_info']}
        assert set(np.unique(ids)) - {0} == set(segments)
        semantic = np.zeros_like(ids)  # ADE ids, 0 for VOID
        for segment_id, segment in segments.items():
            region = ids == segment_id
            ys, xs = np.nonzero(region)
            assert segment['area'] == region.sum()
            assert segment['bbox'] == [xs.min(), ys.min(), xs.max() - xs.min() + 1,
                                       ys.max() - ys.min() + 1]
            assert segment['iscrowd'] == 0
            name = PANOPTIC_CLASSES[segment['category_id'] - 1]
            semantic[region] = ADE_CLASSES.index(name) + 1
            things += name in SHAPE_CLASSES
        label = cv2.imread(str(ade / 'annotations' / folder / f'ADE_{split}_{image["id"]:08d}'
                               f'.png'), cv2.IMREAD_UNCHANGED)
        np.testing.assert_array_equal(semantic, label)
        stuff = [s['category_id'] for s in segments.values() if s['category_id'] > 3]
        assert len(stuff) == len(set(stuff)) >= 1  # one segment per stuff class present
    assert count and things >= count  # every scene has at least one object


def _perfect_prediction(panoptic: Path, ann: dict, swap_stuff: bool) -> torch.Tensor:
    """mmdet's panoptic result for ``ann`` (label + instance × INSTANCE_OFFSET, VOID = the
    class count) from its own PNG: the ground truth, or with wall and floor swapped."""
    ids = _ids(panoptic / 'annotations' / 'panoptic_val' / ann['file_name'])
    pan = np.full(ids.shape, len(PANOPTIC_CLASSES), np.int64)
    for number, segment in enumerate(ann['segments_info'], 1):
        label = segment['category_id'] - 1
        if swap_stuff and label >= len(SHAPE_CLASSES):
            label = 7 - label  # wall (3) <-> floor (4)
        pan[ids == segment['id']] = label + number * INSTANCE_OFFSET
    return torch.from_numpy(pan)[None]


@pytest.mark.parametrize('swap_stuff', [False, True], ids=['truth', 'stuff-swapped'])
def test_the_metric_scores_the_ground_truth_perfect(panoptic, swap_stuff):
    data = json.loads((panoptic / 'annotations' / 'panoptic_val.json').read_text())
    metric = CocoPanopticMetric(ann_file=str(panoptic / 'annotations' / 'panoptic_val.json'),
                                seg_prefix=str(panoptic / 'annotations' / 'panoptic_val'))
    metric.dataset_meta = dict(classes=PANOPTIC_CLASSES, thing_classes=SHAPE_CLASSES,
                               stuff_classes=PANOPTIC_CLASSES[len(SHAPE_CLASSES):])
    samples = [dict(img_id=image['id'], img_path=str(panoptic / 'val' / image['file_name']),
                    ori_shape=(SIZE, SIZE),
                    pred_panoptic_seg=dict(sem_seg=_perfect_prediction(panoptic, ann,
                                                                        swap_stuff)))
               for image, ann in zip(data['images'], data['annotations'])]
    metric.process({}, samples)
    scores = metric.evaluate(len(samples))
    present = {s['category_id'] for ann in data['annotations'] for s in ann['segments_info']}
    things = sum(category <= len(SHAPE_CLASSES) for category in present)
    assert things >= 1 and len(present) - things >= 1
    # swapped: every stuff segment is a false positive of the other class and a false negative
    # of its own, so stuff scores 0 and the mean over the classes present falls with it
    assert scores['coco_panoptic/PQ_th'] == pytest.approx(100.0)
    assert scores['coco_panoptic/PQ_st'] == pytest.approx(0.0 if swap_stuff else 100.0)
    assert scores['coco_panoptic/PQ'] == pytest.approx(
        100.0 * things / len(present) if swap_stuff else 100.0)
