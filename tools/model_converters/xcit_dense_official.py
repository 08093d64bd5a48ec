"""Convert the official XCiT dense checkpoints to the models of our configs.

The XCiT authors released Mask R-CNN (mmdet 2.x) and UperNet / Semantic FPN (mmseg 0.x)
checkpoints. Their necks and heads already carry mmdet 3.x / mmseg 1.x names; only the
backbone differs: official block names (``gamma1``, ``norm3``, ``local_mp``, ``pos_embeder``)
and the pyramid at ``backbone.fpn1..4``. ``XCiT.checkpoint_layout.convert`` knows the block names;
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
from vitdense.checkpoint_convert import (Converted, convert_prefixed, converted_meta,
                                         converter_entry, read_checkpoint)
from vitdense.model_factory import build_model
from vitdense.models import XCiT


def convert(state_dict: dict) -> OrderedDict:
    """Official dense state dict (``backbone.*`` plus neck / heads) -> our key layout."""
    def convert_backbone(backbone: dict) -> OrderedDict:
        return XCiT.checkpoint_layout.convert({
            re.sub(r'^(fpn[1-4])\.', r'pyramid.\1.', key): value
            for key, value in backbone.items()})
    return convert_prefixed(state_dict, convert_backbone)


def check_against_config(state_dict: dict, config: str) -> None:
    """Build the config's model and load ``state_dict`` strictly (raises on any mismatch)."""
    model = build_model(Config.fromfile(config), 'count')
    model.load_state_dict(state_dict, strict=True)
    print(f'loads strictly into the model of {config}')


def convert_file(args: argparse.Namespace) -> Converted:
    """The official checkpoint at ``args.src`` converted (and loaded by ``args.config``)."""
    checkpoint = read_checkpoint(args.src)
    converted = convert(checkpoint.get('state_dict', checkpoint))
    if args.config:
        check_against_config(converted, args.config)
    return Converted(dict(state_dict=converted, meta=converted_meta(checkpoint, args.src)),
                     len(converted))


main = converter_entry(convert_file, __doc__, 'official checkpoint (.pth)',
                       'our config whose model must load it strictly')


if __name__ == '__main__':
    main()
