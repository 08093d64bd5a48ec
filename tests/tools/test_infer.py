"""tools/infer.py on the demo configs of the three tasks, with checkpoints of randomly
initialised models: pictures and JSON for a folder and a video, with the host inferencer's
predictions (consistent boxes, label-map fractions, ranked classes)."""
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from mmengine.config import Config
from PIL import Image

from tools import infer
from vitdense.model_factory import build_model

from common import REPO_ROOT

CONFIGS = {
    'mmpretrain': REPO_ROOT / 'configs/vit/vit-mini-p16_1xb64-a2-8e_demo-in10-64px.py',
    'mmdet': REPO_ROOT / 'configs/vit/mask-rcnn_vit-d6-p8_fpn_demo-coco.py',
    'mmseg': REPO_ROOT / 'configs/vit/upernet_vit-d6-p8_demo-ade.py',
}


def random_checkpoint(config: Path, path: Path) -> Path:
    torch.manual_seed(0)
    model = build_model(Config.fromfile(str(config)), 'train')
    torch.save(dict(meta={}, state_dict=model.state_dict()), path)
    return path


@pytest.mark.parametrize('task', list(CONFIGS))
def test_a_folder_gives_a_picture_and_a_prediction_per_image(task, image_folder, tmp_path):
    checkpoint = random_checkpoint(CONFIGS[task], tmp_path / 'model.pth')
    out = tmp_path / 'out'
    result = infer.main([str(CONFIGS[task]), str(checkpoint), str(image_folder),
                         '--out-dir', str(out), '--score-thr', '0'])
    saved = json.loads((out / 'predictions.json').read_text())
    assert saved == result and saved['task'] == task
    assert sorted(saved['predictions']) == ['one.jpg', 'two.jpg']
    for name in ('one', 'two'):
        assert infer.drawn_picture(str(out), f'{name}.jpg') and Path(
            infer.drawn_picture(str(out), f'{name}.jpg')).is_file()
    prediction = saved['predictions']['one.jpg']
    if task == 'mmpretrain':
        scores = [entry['score'] for entry in prediction['top_k']]
        assert scores == sorted(scores, reverse=True) and len(scores) == 5
        assert prediction['pred_class'] == saved['classes'][prediction['pred_label']]
        assert prediction['pred_score'] == pytest.approx(scores[0], abs=1e-5)
        from mmpretrain.apis import ImageClassificationInferencer
        (direct,) = ImageClassificationInferencer(str(CONFIGS[task]), pretrained=str(
            checkpoint))(str(image_folder / 'one.jpg'))
        assert prediction['top_k'][0]['label'] == direct['pred_label']
        np.testing.assert_allclose(scores, np.sort(direct['pred_scores'])[::-1][:5], atol=1e-5)
    elif task == 'mmdet':
        assert len(prediction['bboxes']) == len(prediction['scores']) == len(
            prediction['labels']) == len(prediction['masks']) > 0
        for x1, y1, x2, y2 in prediction['bboxes']:
            assert 0 <= x1 <= x2 <= 64 and 0 <= y1 <= y2 <= 48
        # mmdet's own API on the same model and image: the same detections
        from mmdet.apis import inference_detector, init_detector
        direct = inference_detector(init_detector(str(CONFIGS[task]), str(checkpoint),
                                                  device='cpu'),
                                    str(image_folder / 'one.jpg')).pred_instances
        np.testing.assert_allclose(prediction['bboxes'], direct.bboxes.numpy(), atol=1e-3)
        np.testing.assert_allclose(prediction['scores'], direct.scores.numpy(), atol=1e-5)
        assert prediction['labels'] == direct.labels.tolist()
    else:
        assert prediction['shape'] == [48, 64]
        assert sum(prediction['class_fractions'].values()) == pytest.approx(1, abs=1e-4)
        label_map = np.asarray(Image.open(out / prediction['label_map']))
        assert label_map.shape == (48, 64)
        # mmseg's own API on the same model and image: the same label map
        from mmseg.apis import inference_model, init_model
        direct = inference_model(init_model(str(CONFIGS[task]), str(checkpoint), device='cpu'),
                                 str(image_folder / 'one.jpg')).pred_sem_seg.data[0].numpy()
        assert np.array_equal(label_map, direct)
        fractions = np.bincount(label_map.ravel()) / label_map.size
        for index, name in enumerate(saved['classes']):
            assert prediction['class_fractions'].get(name, 0) == pytest.approx(
                fractions[index] if index < len(fractions) else 0, abs=1e-4)


def test_a_video_is_split_and_its_drawn_frames_joined(tmp_path):
    import cv2
    video = tmp_path / 'clip.mp4'
    writer = cv2.VideoWriter(str(video), cv2.VideoWriter_fourcc(*'mp4v'), 5, (64, 48))
    for value in (0, 120, 240):
        writer.write(np.full((48, 64, 3), value, np.uint8))
    writer.release()
    checkpoint = random_checkpoint(CONFIGS['mmpretrain'], tmp_path / 'model.pth')
    out = tmp_path / 'out'
    result = infer.main([str(CONFIGS['mmpretrain']), str(checkpoint), str(video),
                         '--out-dir', str(out)])
    assert sorted(result['predictions']) == [f'frame_{i:06d}.png' for i in range(3)]
    capture = cv2.VideoCapture(str(out / 'clip_pred.mp4'))
    assert int(capture.get(cv2.CAP_PROP_FRAME_COUNT)) == 3


def test_bad_inputs_are_named(tmp_path):
    checkpoint = random_checkpoint(CONFIGS['mmpretrain'], tmp_path / 'model.pth')
    with pytest.raises(SystemExit, match='input not found: nowhere.jpg'):
        infer.main([str(CONFIGS['mmpretrain']), str(checkpoint), 'nowhere.jpg',
                    '--out-dir', str(tmp_path)])
    (tmp_path / 'notes.txt').write_text('x')
    with pytest.raises(SystemExit, match='notes.txt: not an image'):
        infer.main([str(CONFIGS['mmpretrain']), str(checkpoint), str(tmp_path / 'notes.txt'),
                    '--out-dir', str(tmp_path)])
    with pytest.raises(SystemExit, match='checkpoint not found'):
        infer.main([str(CONFIGS['mmpretrain']), 'missing.pth', 'x.jpg'])
