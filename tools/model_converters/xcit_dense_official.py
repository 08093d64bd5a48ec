"""Convert the official XCiT dense checkpoints to the models of our configs.

The XCiT authors released Mask R-CNN (mmdet 2.x) and UperNet / Semantic FPN (mmseg 0.x)
checkpoints. Their necks and heads already carry mmdet 3.x / mmseg 1.x names; only the
backbone differs: official block names (``gamma1``, ``norm3``, ``local_mp``, ``pos_embeder``)
and the pyramid at ``backbone.fpn1..4``. ``XCiT.convert_checkpoint`` knows the block names;
the pyramid moves under ``backbone.pyramid``.

    python tools/model_converters/xcit_dense_official.py maskrcnn_xcit_small_12_p16.pth \\
        xcit-s12-p16_mask-rcnn_coco.pth \\
        --config configs/xcit/mask-rcnn_xcit-s12-p16_fpn_3x_coco.py
    python tools/test.py configs/xcit/mask-rcnn_xcit-s12-p16_fpn_3x_coco.py \\
        xcit-s12-p16_mask-rcnn_coco.pth
"""
from __future__ import annotations

import argparse
import re
from collections import OrderedDict

from mmengine.config import Config

import vitdense  # noqa: F401  (vitdense registries)
from vitdense.checkpoint_io import safe_load, save_plain
from vitdense.engine.hosts import build_model
from vitdense.models import XCiT

BACKBONE = 'backbone.'


def convert(state_dict: dict) -> OrderedDict:
    """Official dense state dict (``backbone.*`` plus neck / heads) -> our key layout."""
    backbone = {key[len(BACKBONE):]: value for key, value in state_dict.items()
                if key.startswith(BACKBONE)}
    if not backbone:
        raise KeyError('no backbone.* keys: not a detector / segmentor checkpoint')
    backbone = {re.sub(r'^(fpn[1-4])\.', r'pyramid.\1.', key): value
                for key, value in backbone.items()}
    converted = OrderedDict((BACKBONE + key, value)
                            for key, value in XCiT.convert_checkpoint(backbone).items())
    converted.update((key, value) for key, value in state_dict.items()
                     if not key.startswith(BACKBONE))
    return converted


def check_against_config(state_dict: dict, config: str) -> None:
    """Build the config's model and load ``state_dict`` strictly (raises on any mismatch)."""
    model = build_model(Config.fromfile(config), 'count')
    model.load_state_dict(state_dict, strict=True)
    print(f'loads strictly into the model of {config}')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('src', help='official checkpoint (.pth)')
    parser.add_argument('dst', help='converted checkpoint to write')
    parser.add_argument('--config', help='our config whose model must load it strictly')
    args = parser.parse_args()
    checkpoint = safe_load(args.src, map_location='cpu')
    if not isinstance(checkpoint, dict):
        raise SystemExit(f'{args.src} holds a {type(checkpoint).__name__}, not a checkpoint dict')
    state_dict = checkpoint.get('state_dict', checkpoint)
    converted = convert(state_dict)
    if args.config:
        check_against_config(converted, args.config)
    meta = dict(checkpoint.get('meta') or {}, converted_from=args.src)
    meta.pop('config', None)  # an mmdet 2.x / mmseg 0.x config that our tools cannot read
    save_plain(dict(state_dict=converted, meta=meta), args.dst)
    print(f'wrote {len(converted)} tensors to {args.dst}')


if __name__ == '__main__':
    main()
