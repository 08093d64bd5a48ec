"""Convert the official ViT-Adapter checkpoints (Chen et al., ICLR 2023) to the models of our
adapter configs.

The authors released Mask R-CNN (mmdet 2.x) and UperNet (mmseg 0.x) checkpoints whose
necks and heads already carry mmdet 3.x / mmseg 1.x names. The backbone's adapter modules
(``spm``, ``interactions``, ``level_embed``, ``up``, ``norm1..4``) have our names too; its
DeiT trunk (``patch_embed``, ``pos_embed``, ``blocks``) moves under ``backbone.trunk`` through
the trunk's own :meth:`~vitdense.models.ColumnarBackbone.adapt_checkpoint` (timm's block
names, the class token and its position row dropped: the official adapter carries none).

    python tools/model_converters/vit_adapter_official.py \\
        mask_rcnn_deit_adapter_small_fpn_3x_coco.pth.tar vit-adapter-s_mask-rcnn_coco.pth \\
        --config configs/vit/mask-rcnn_vit-s-p16_adapter_3x_coco.py
"""
from __future__ import annotations

import argparse
import re
from collections import OrderedDict

from mmengine.config import Config

import vitdense  # noqa: F401  (vitdense registries)
from vitdense.checkpoint_io import safe_load, save_plain
from vitdense.engine.hosts import build_model
from vitdense.models import ColumnarBackbone

BACKBONE = 'backbone.'
#: the official backbone's trunk tensors; every other backbone tensor is the adapter's
TRUNK_KEYS = re.compile(r'^(patch_embed\.|pos_embed$|cls_token$|blocks\.)')


def convert_backbone(state_dict: dict, trunk: ColumnarBackbone) -> OrderedDict:
    """The official ``ViTAdapter``'s state dict (no prefix) -> our ``ColumnarAdapter``'s,
    its trunk's part made to fit ``trunk`` exactly (raises naming any mismatch)."""
    trunk_part = {key: value for key, value in state_dict.items() if TRUNK_KEYS.match(key)}
    converted = OrderedDict(
        (f'trunk.{key}', value)
        for key, value in trunk.adapt_checkpoint(trunk_part, strict=True).items())
    converted.update((key, value) for key, value in state_dict.items()
                     if not TRUNK_KEYS.match(key))
    return converted


def convert(state_dict: dict, trunk: ColumnarBackbone) -> OrderedDict:
    """Official detector / segmentor state dict -> our key layout (necks and heads kept)."""
    backbone = {key[len(BACKBONE):]: value for key, value in state_dict.items()
                if key.startswith(BACKBONE)}
    if not backbone:
        raise KeyError('no backbone.* keys: not a detector / segmentor checkpoint')
    converted = OrderedDict((BACKBONE + key, value)
                            for key, value in convert_backbone(backbone, trunk).items())
    converted.update((key, value) for key, value in state_dict.items()
                     if not key.startswith(BACKBONE))
    return converted


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('src', help='official checkpoint (.pth / .pth.tar)')
    parser.add_argument('dst', help='converted checkpoint to write')
    parser.add_argument('--config', required=True,
                        help='our adapter config whose model must load it strictly')
    args = parser.parse_args()
    checkpoint = safe_load(args.src, map_location='cpu')
    if not isinstance(checkpoint, dict):
        raise SystemExit(f'{args.src} holds a {type(checkpoint).__name__}, not a checkpoint dict')
    model = build_model(Config.fromfile(args.config), 'count')
    converted = convert(checkpoint.get('state_dict', checkpoint), model.backbone.trunk)
    model.load_state_dict(converted, strict=True)
    print(f'loads strictly into the model of {args.config}')
    meta = dict(checkpoint.get('meta') or {}, converted_from=args.src)
    meta.pop('config', None)  # an mmdet 2.x / mmseg 0.x config that our tools cannot read
    save_plain(dict(state_dict=converted, meta=meta), args.dst)
    print(f'wrote {len(converted)} tensors to {args.dst}')


if __name__ == '__main__':
    main()
