"""Run a trained vitdense model on your own images or video: pictures and JSON out.

    python tools/infer.py CONFIG CHECKPOINT INPUT [--out-dir DIR] [--device cpu]
        [--score-thr 0.3] [--compile [BACKEND]]

INPUT is an image, a folder of images or a video. The host library is chosen by the
config's ``default_scope``, as in train / test: mmdet's ``DetInferencer`` (boxes and masks),
mmseg's ``MMSegInferencer`` (label maps) or mmpretrain's ``ImageClassificationInferencer``
(classes). Written to DIR (default ``work_dirs/infer/<config name>``):
  vis/<image>.png          the predictions drawn on each image (or video frame)
  predictions.json         per image: detection boxes, scores, labels and RLE masks; the
                           segmentation's class fractions and label map file; the top-5 classes
  pred/<image>.png         segmentation label maps (mmseg)
  <video>_pred.mp4         for a video, the drawn frames as a video
"""
from __future__ import annotations

import argparse
import json
import os
import os.path as osp
from typing import Any, Optional

import numpy as np
import torch
from mmengine.config import Config
from mmengine.registry import init_default_scope
from mmengine.utils import ProgressBar

import vitdense  # noqa: F401  (vitdense registries)
from vitdense.analysis.loading import IMAGE_SUFFIXES
from vitdense.checkpoint_io import safe_load
from vitdense.engine.compile import add_compile_argument, compile_model
from vitdense.model_factory import register_host

VIDEO_SUFFIXES = ('.mp4', '.avi', '.mov', '.mkv', '.webm')
TOP_K = 5


def list_images(path: str, out_dir: str) -> tuple[list[str], Optional[tuple[str, float]]]:
    """Image files of ``path``; a video is split into ``out_dir/frames`` first (its name and
    frame rate are returned to assemble the drawn frames)."""
    if osp.isdir(path):
        files = sorted(osp.join(path, f) for f in os.listdir(path)
                       if f.lower().endswith(IMAGE_SUFFIXES))
        if not files:
            raise SystemExit(f'no images ({", ".join(IMAGE_SUFFIXES)}) in folder {path}')
        return files, None
    if not osp.isfile(path):
        raise SystemExit(f'input not found: {path}')
    if path.lower().endswith(VIDEO_SUFFIXES):
        return split_video(path, osp.join(out_dir, 'frames'))
    if not path.lower().endswith(IMAGE_SUFFIXES):
        raise SystemExit(f'{path}: not an image ({", ".join(IMAGE_SUFFIXES)}) or a video '
                         f'({", ".join(VIDEO_SUFFIXES)})')
    return [path], None


def split_video(path: str, frame_dir: str) -> tuple[list[str], tuple[str, float]]:
    import cv2
    capture = cv2.VideoCapture(path)
    if not capture.isOpened():
        raise SystemExit(f'cannot read video {path}')
    fps = capture.get(cv2.CAP_PROP_FPS) or 25.
    os.makedirs(frame_dir, exist_ok=True)
    frames = []
    while True:
        ok, frame = capture.read()
        if not ok:
            break
        frames.append(osp.join(frame_dir, f'frame_{len(frames):06d}.png'))
        cv2.imwrite(frames[-1], frame)
    capture.release()
    if not frames:
        raise SystemExit(f'video {path} has no frames')
    return frames, (osp.splitext(osp.basename(path))[0], fps)


def join_video(frames: list[str], path: str, fps: float) -> None:
    import cv2
    first = cv2.imread(frames[0])
    writer = cv2.VideoWriter(path, cv2.VideoWriter_fourcc(*'mp4v'), fps,
                             (first.shape[1], first.shape[0]))
    for frame in frames:
        writer.write(cv2.imread(frame))
    writer.release()


def jsonable(value: Any) -> Any:
    """Arrays and tensors as (rounded) lists, recursively."""
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().numpy()
    if isinstance(value, np.ndarray):
        value = np.round(value, 5) if value.dtype.kind == 'f' else value
        return value.tolist()
    if isinstance(value, dict):
        return {key: jsonable(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(item) for item in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


class Predictor:
    """One host library's inferencer, run on one image at a time (so that the progress bar
    is ours and every host names its pictures after the input)."""

    def __init__(self, cfg: Config, checkpoint: str, device: str, out_dir: str,
                 score_thr: float) -> None:
        self.scope = cfg.default_scope
        self.out_dir = out_dir
        self.score_thr = score_thr
        # the one safe loader (weights_only, allow-list), mapped: only the pickle is read here
        meta = safe_load(checkpoint, map_location='cpu', mmap=True).get('meta') or {}
        self.classes = self._classes(cfg, meta)
        if self.scope == 'mmdet':
            from mmdet.apis import DetInferencer
            self.inferencer = DetInferencer(cfg, checkpoint, device=device, show_progress=False)
            if self.classes and 'dataset_meta' not in meta:
                self.inferencer.model.dataset_meta = dict(classes=self.classes)
                self.inferencer.visualizer.dataset_meta = dict(
                    classes=self.classes, palette='random')
        elif self.scope == 'mmseg':
            from mmseg.apis import MMSegInferencer
            self.inferencer = MMSegInferencer(cfg, checkpoint, device=device,
                                              classes=self.classes, palette=self._palette())
        else:
            import mmpretrain.utils.progress
            from mmpretrain.apis import ImageClassificationInferencer
            mmpretrain.utils.progress.disable_progress_bar = True  # one bar: ours
            self.inferencer = ImageClassificationInferencer(
                cfg, pretrained=checkpoint, device=device, classes=self.classes)
        self.inferencer.show_progress = False

    @staticmethod
    def _classes(cfg: Config, meta: dict) -> Optional[list[str]]:
        classes = (meta.get('dataset_meta') or {}).get('classes')
        if classes is None:
            dataset = cfg.get('test_dataloader', {}).get('dataset', {})
            classes = (dataset.get('metainfo') or {}).get('classes')
        return list(classes) if classes else None

    def _palette(self) -> Optional[list[list[int]]]:
        if not self.classes:
            return None
        rng = np.random.default_rng(0)
        return rng.integers(0, 255, (len(self.classes), 3)).tolist()

    def __call__(self, image: str) -> dict:
        vis_dir = osp.join(self.out_dir, 'vis')
        if self.scope == 'mmdet':
            result = self.inferencer(image, out_dir=self.out_dir, pred_score_thr=self.score_thr)
            prediction = result['predictions'][0]
            keep = [i for i, s in enumerate(prediction['scores']) if s >= self.score_thr]
            return {key: [prediction[key][i] for i in keep] for key in prediction}
        if self.scope == 'mmseg':
            result = self.inferencer(image, out_dir=self.out_dir)
            labels = np.asarray(result['predictions'])
            # mmseg numbers its label maps; name them after the image
            label_map = osp.join('pred', osp.splitext(osp.basename(image))[0] + '.png')
            numbered = f'{self.inferencer.num_pred_imgs - 1:08d}_pred.png'
            os.replace(osp.join(self.out_dir, 'pred', numbered),
                       osp.join(self.out_dir, label_map))
            counts = np.bincount(labels.ravel(), minlength=len(self.classes or ()))
            names = self.classes or [str(i) for i in range(len(counts))]
            return dict(label_map=label_map, shape=list(labels.shape),
                        class_fractions={names[i]: round(float(c) / labels.size, 5)
                                         for i, c in enumerate(counts) if c})
        os.makedirs(vis_dir, exist_ok=True)
        (prediction,) = self.inferencer(image, show_dir=vis_dir)
        scores = np.asarray(prediction['pred_scores'])
        top = np.argsort(-scores)[:TOP_K]
        names = self.classes or [str(i) for i in range(len(scores))]
        return dict(pred_label=prediction['pred_label'], pred_score=prediction['pred_score'],
                    pred_class=names[prediction['pred_label']],
                    top_k=[dict(label=int(i), class_=names[i], score=float(scores[i]))
                           for i in top])


def drawn_picture(out_dir: str, image: str) -> str:
    """Where the host drew ``image`` (mmdet / mmseg keep the file name, mmpretrain .png)."""
    vis_dir = osp.join(out_dir, 'vis')
    same = osp.join(vis_dir, osp.basename(image))
    return same if osp.isfile(same) else osp.join(
        vis_dir, osp.splitext(osp.basename(image))[0] + '.png')


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('config', help='config file (mmdet, mmseg or mmpretrain scope)')
    parser.add_argument('checkpoint', help='checkpoint file')
    parser.add_argument('input', help='image, folder of images, or video')
    parser.add_argument('--out-dir', help='default: work_dirs/infer/<config name>')
    parser.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    parser.add_argument('--score-thr', type=float, default=0.3,
                        help='detection: keep and draw boxes scoring at least this')
    add_compile_argument(parser)
    args = parser.parse_args(argv)
    if args.out_dir is None:
        args.out_dir = osp.join('work_dirs', 'infer',
                                osp.splitext(osp.basename(args.config))[0])
    return args


def main(argv: Optional[list[str]] = None) -> dict:
    args = parse_args(argv)
    if not osp.isfile(args.config):
        raise SystemExit(f'config file not found: {args.config}')
    if not osp.isfile(args.checkpoint):
        raise SystemExit(f'checkpoint not found: {args.checkpoint}')
    cfg = Config.fromfile(args.config)
    register_host(cfg)  # the host library named by default_scope, or why not
    init_default_scope(cfg.default_scope)
    os.makedirs(args.out_dir, exist_ok=True)
    images, video = list_images(args.input, args.out_dir)
    predict = Predictor(cfg, args.checkpoint, args.device, args.out_dir, args.score_thr)
    if args.compile:
        compile_model(predict.inferencer.model, backend=args.compile)
    predictions = {}
    progress = ProgressBar(len(images))
    for image in images:
        predictions[osp.basename(image)] = jsonable(predict(image))
        progress.update()
    result = dict(config=args.config, checkpoint=args.checkpoint, task=cfg.default_scope,
                  classes=predict.classes, predictions=predictions)
    with open(osp.join(args.out_dir, 'predictions.json'), 'w') as f:
        json.dump(result, f)
    if video is not None:
        name, fps = video
        join_video([drawn_picture(args.out_dir, image) for image in images],
                   osp.join(args.out_dir, f'{name}_pred.mp4'), fps)
    print(f'\n{len(images)} image(s): pictures in {osp.join(args.out_dir, "vis")}, '
          f'predictions in {osp.join(args.out_dir, "predictions.json")}')
    return result


if __name__ == '__main__':
    main()
