"""Export a config's model for inference (ONNX or torch.export) and check the file against
PyTorch.

    python tools/deployment/export.py CONFIG CHECKPOINT --out FILE [--format onnx|torch-export]
        [--part model|backbone] [--shape H W] [--dynamic] [--image IMG ...] [--evaluate]

What is exported (``vitdense.deploy``):
- ``--part backbone``: the backbone alone, a normalised image (B, 3, H, W) in, the dense
  feature pyramid out;
- ``--part model`` (default) of an mmseg config (UperNet, Semantic FPN): the image as loaded
  (B, 3, H, W, 0-255, BGR) in, logits (B, classes, H, W) and labels (B, H, W) out, whole-image
  inference;
- ``--part model`` of an mmdet Mask R-CNN config: one image as loaded (1, 3, H, W) in, boxes
  (N, 4, pixels of the input), scores (N,), labels (N,) and masks (N, H, W) out, with standard
  ONNX operators only (NonMaxSuppression, RoiAlign).
Images go in at the size the network should see them (a resize of the test pipeline is not in
the graph). ``--dynamic`` exports height and width as dynamic dimensions (from 64 pixels);
otherwise the graph takes the ``--shape`` it was traced at (default: the first image's).

Then the file runs (onnxruntime for .onnx, the exported program for .pt2) on the images given
with ``--image``, or on the first ``--num-images`` images of the config's validation set, next
to the PyTorch model; the differences are printed and the exit status is 1 when one is past
the tolerance. ``--evaluate`` also runs the whole validation set through both and compares the
config's metrics (mIoU, COCO bbox / segm mAP); ``--min-agreement`` (the share of equal
labels and mask pixels) holds on both the images and the validation set. CHECKPOINT ``none``
exports the initialised model (for trying the export without a trained one).
"""
from __future__ import annotations

import argparse
import copy
import numbers
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from mmengine.config import Config, DictAction
from mmengine.evaluator import Evaluator
from mmengine.structures import InstanceData, PixelData

import vitdense  # noqa: F401  (vitdense registries)
from vitdense.deploy import (FORMATS, PARTS, SUFFIXES, ExportedModel, deployable,
                             export_module, max_abs_differences)
from vitdense.deploy.inputs import (graph_input, image_tensor, sample_images,
                                    validation_loader)
from vitdense.model_factory import build_model

#: the floors the exported model is held to on a validation set (--evaluate)
METRIC_TOLERANCES = {'mIoU': 0.1, 'coco/bbox_mAP': 0.005, 'coco/segm_mAP': 0.005}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('config', help='mmseg or mmdet config file')
    parser.add_argument('checkpoint', help="checkpoint file, or 'none' for initialised weights")
    parser.add_argument('--out', required=True, help='file to write (.onnx or .pt2)')
    parser.add_argument('--format', choices=FORMATS, default='onnx')
    parser.add_argument('--part', choices=PARTS, default='model',
                        help='the whole model (default) or its backbone')
    parser.add_argument('--shape', nargs=2, type=int, metavar=('H', 'W'),
                        help='size to trace at (default: the first image\'s)')
    parser.add_argument('--dynamic', action='store_true', help='dynamic height and width')
    parser.add_argument('--image', nargs='+', default=[], metavar='IMG',
                        help='images to check the file on (default: validation images)')
    parser.add_argument('--num-images', type=int, default=4,
                        help='validation images to check on when no --image is given')
    parser.add_argument('--evaluate', action='store_true',
                        help='compare the metrics of both on the whole validation set')
    parser.add_argument('--atol', type=float, default=1e-4,
                        help='largest absolute difference of float outputs (boxes: times '
                             'the image side)')
    parser.add_argument('--min-agreement', type=float, default=0.999,
                        help='smallest fraction of equal labels / mask pixels')
    parser.add_argument('--overwrite', action='store_true', help='replace an existing --out')
    parser.add_argument('--check-existing', action='store_true',
                        help='check the file already at --out instead of exporting')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction,
                        help='override config entries, key=value')
    args = parser.parse_args(argv)
    suffix = SUFFIXES[args.format]
    if Path(args.out).suffix != suffix:
        parser.error(f'--format {args.format} writes a {suffix} file; --out is {args.out}')
    if Path(args.out).exists() and not (args.overwrite or args.check_existing):
        parser.error(f'{args.out} exists; pass --overwrite to replace it')
    if args.check_existing and not Path(args.out).is_file():
        parser.error(f'--check-existing: no file at {args.out}')
    if args.checkpoint != 'none' and not Path(args.checkpoint).is_file():
        parser.error(f'checkpoint not found: {args.checkpoint}')
    return args


def reference_outputs(kind: str, model: torch.nn.Module, graph: torch.nn.Module,
                      x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """PyTorch's outputs: the backbone, the segmentor's own ``predict`` logits, the graph
    for Mask R-CNN (its equality with mmdet's ``predict`` is tested)."""
    with torch.no_grad():
        if kind == 'segmentor':
            logits = segmentor_logits(model, x)
            return logits, logits.argmax(dim=1)
        outs = graph(x)
    return tuple(outs)


def segmentor_logits(model: torch.nn.Module, image: torch.Tensor) -> torch.Tensor:
    """mmseg's own whole-image inference (preprocessor, ``inference``) on loaded images."""
    data = model.data_preprocessor(dict(inputs=list(image)), False)
    metas = [dict(img_shape=image.shape[2:], ori_shape=image.shape[2:],
                  pad_shape=image.shape[2:], padding_size=[0, 0, 0, 0])] * image.shape[0]
    return model.inference(data['inputs'], metas)


def compare(kind: str, reference: tuple, exported: tuple, image_hw: tuple, atol: float,
            min_agreement: float) -> tuple[str, bool]:
    """One line of differences and whether they are within the tolerances."""
    if kind == 'backbone':
        diffs = max_abs_differences(reference, exported)
        return 'max |diff| per level ' + ' '.join(f'{d:.2e}' for d in diffs), max(diffs) <= atol
    if kind == 'segmentor':
        (logit_diff,) = max_abs_differences(reference[:1], exported[:1])
        agreement = float((reference[1] == exported[1]).double().mean())
        return (f'logits max |diff| {logit_diff:.2e}, labels equal on {100 * agreement:.3f}% '
                f'of pixels', agreement >= min_agreement)
    if reference[0].shape != exported[0].shape:
        return (f'{len(exported[0])} detections, PyTorch {len(reference[0])}', False)
    box_diff, score_diff = max_abs_differences(reference[:2], exported[:2])
    labels_equal = bool((reference[2] == exported[2]).all())
    masks = reference[3].numel()
    agreement = float((reference[3] == exported[3]).sum()) / masks if masks else 1.
    ok = (box_diff <= atol * max(image_hw) and score_diff <= atol and labels_equal
          and agreement >= min_agreement)
    return (f'{len(reference[0])} detections: boxes max |diff| {box_diff:.2e} px, scores '
            f'{score_diff:.2e}, labels {"equal" if labels_equal else "DIFFER"}, mask pixels '
            f'equal {100 * agreement:.3f}%', ok)


def exported_samples(kind: str, run: ExportedModel, data: dict) -> list:
    """The batch's data samples with the exported file's predictions, as mmseg / mmdet
    ``predict`` fills them (boxes and masks brought back to the original image size)."""
    samples = copy.deepcopy(data['data_samples'])
    for image, sample in zip(data['inputs'], samples):
        outs = run(image_tensor(image))
        if kind == 'segmentor':
            sample.pred_sem_seg = PixelData(data=outs[1][:1].long())
            continue
        boxes, scores, labels, masks = outs
        scale_w, scale_h = sample.metainfo.get('scale_factor', (1., 1.))
        boxes = boxes / boxes.new_tensor([scale_w, scale_h, scale_w, scale_h])
        ori_hw = tuple(sample.metainfo['ori_shape'][:2])
        if tuple(masks.shape[1:]) != ori_hw and len(masks):
            masks = F.interpolate(masks[:, None].float(), size=ori_hw, mode='bilinear')[:, 0]
        sample.pred_instances = InstanceData(bboxes=boxes, scores=scores, labels=labels.long(),
                                             masks=masks.reshape(-1, *ori_hw) > 0.5)
    return samples


def evaluate(cfg: Config, kind: str, model: torch.nn.Module, run: ExportedModel,
             min_agreement: float) -> bool:
    """The config's validation metrics of PyTorch and of the exported file, side by side
    (and, for a segmentor, the share of pixels given the same label, held to
    ``min_agreement``)."""
    loader = validation_loader(cfg, batch_size=1)
    evaluators = {}
    for name in ('pytorch', 'exported'):
        evaluators[name] = Evaluator(copy.deepcopy(cfg.val_evaluator))
        evaluators[name].dataset_meta = loader.dataset.metainfo
    same = total = 0
    for data in loader:
        exported = exported_samples(kind, run, data)
        with torch.no_grad():
            reference = model.test_step(copy.deepcopy(data))
        evaluators['pytorch'].process(reference, data)
        evaluators['exported'].process(exported, data)
        if kind == 'segmentor':
            for ref, out in zip(reference, exported):
                same += int((ref.pred_sem_seg.data == out.pred_sem_seg.data).sum())
                total += ref.pred_sem_seg.data.numel()
    metrics = {name: ev.evaluate(len(loader.dataset)) for name, ev in evaluators.items()}
    ok = True
    print(f'\nvalidation set ({len(loader.dataset)} images): metric  PyTorch  exported')
    for key, value in metrics['pytorch'].items():
        if not isinstance(value, numbers.Real):
            continue
        value, other = float(value), float(metrics['exported'][key])
        tolerance = METRIC_TOLERANCES.get(key)
        within = tolerance is None or abs(value - other) <= tolerance
        ok &= within
        print(f'  {key:24s} {value:8.4f} {other:8.4f}' +
              ('' if tolerance is None else f'  (|diff| <= {tolerance}: {within})'))
    if total:
        agreement = same / total
        ok &= agreement >= min_agreement
        print(f'  labels equal on {100 * agreement:.3f}% of {total} pixels '
              f'(>= {100 * min_agreement:g}%)')
    return ok


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cfg = Config.fromfile(args.config)
    if args.cfg_options:
        cfg.merge_from_dict(args.cfg_options)
    model = build_model(cfg, 'deploy', None if args.checkpoint == 'none' else args.checkpoint)
    graph, kind = deployable(model, args.part)
    images = sample_images(cfg, args.image, args.num_images)
    if args.shape:
        example = F.interpolate(images[0], size=tuple(args.shape), mode='bilinear')
    else:
        example = images[0]
    if args.check_existing:
        out = Path(args.out)
    else:
        start = time.perf_counter()
        out = export_module(graph, graph_input(kind, model, example), args.out, args.format,
                            dynamic=args.dynamic, overwrite=args.overwrite)
        size = 'dynamic H×W' if args.dynamic else f'{example.shape[2]}×{example.shape[3]}'
        print(f'exported {kind} ({size}) to {out} ({out.stat().st_size / 2 ** 20:.1f} MiB) '
              f'in {time.perf_counter() - start:.0f} s')
    run = ExportedModel(out)
    ok = True
    for index, image in enumerate(images):
        if not args.dynamic:
            image = F.interpolate(image, size=example.shape[2:], mode='bilinear')
        x = graph_input(kind, model, image)
        line, within = compare(kind, reference_outputs(kind, model, graph, x), run(x),
                               tuple(image.shape[2:]), args.atol, args.min_agreement)
        ok &= within
        print(f'image {index} ({image.shape[2]}×{image.shape[3]}): {line}'
              + ('' if within else '  PAST TOLERANCE'))
    if args.evaluate:
        if kind == 'backbone':
            raise SystemExit('--evaluate compares whole models; drop --part backbone')
        ok &= evaluate(cfg, kind, model, run, args.min_agreement)
    print('exported model matches PyTorch' if ok else 'exported model differs from PyTorch '
          'past the tolerance')
    return 0 if ok else 1


if __name__ == '__main__':
    sys.exit(main())
