"""Convert the official ViT-Adapter checkpoints (Chen et al., ICLR 2023) to the models of our
adapter configs.

The authors released Mask R-CNN (mmdet 2.x) and UperNet (mmseg 0.x) checkpoints whose
necks and heads already carry mmdet 3.x / mmseg 1.x names. The backbone's adapter modules
(``spm``, ``interactions``, ``level_embed``, ``up``, ``norm1..4``) have our names too; its
DeiT trunk (``patch_embed``, ``pos_embed``, ``blocks``) moves under ``backbone.trunk`` through
the trunk's family's layout (:func:`vitdense.models.adapt_checkpoint`: timm's block
names, the class token and its position row dropped: the official adapter carries none).

The two releases' backbones differ in one line that no tensor shows: the detection code adds
the trunk's last map to every level, the segmentation code the map after interaction i to
level i. The release is read from the checkpoint (mmdet's or mmseg's version in its ``meta``,
detector or segmentor heads among its tensors; ``--release`` where these are missing) and the
config's adapter must compute what it computed (``vit_features``), or the conversion stops.

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
from vitdense.checkpoint_convert import (Converted, convert_prefixed, converted_meta,
                                         converter_main, converter_parser,
                                         read_checkpoint)
from vitdense.model_factory import build_model
from vitdense.models import ColumnarBackbone, adapt_checkpoint

#: our adapter's ``vit_features`` that computes what each official release's backbone does
RELEASE_FEATURES = {'detection': 'last', 'segmentation': 'per_interaction'}
#: the official backbone's trunk tensors; every other backbone tensor is the adapter's
TRUNK_KEYS = re.compile(r'^(patch_embed\.|pos_embed$|cls_token$|blocks\.)')


def convert_backbone(state_dict: dict, trunk: ColumnarBackbone) -> OrderedDict:
    """The official ``ViTAdapter``'s state dict (no prefix) -> our ``ColumnarAdapter``'s,
    its trunk's part made to fit ``trunk`` exactly (raises naming any mismatch)."""
    trunk_part = {key: value for key, value in state_dict.items() if TRUNK_KEYS.match(key)}
    converted = OrderedDict(
        (f'trunk.{key}', value)
        for key, value in adapt_checkpoint(trunk, trunk_part, strict=True).items())
    converted.update((key, value) for key, value in state_dict.items()
                     if not TRUNK_KEYS.match(key))
    return converted


def convert(state_dict: dict, trunk: ColumnarBackbone) -> OrderedDict:
    """Official detector / segmentor state dict -> our key layout (necks and heads kept)."""
    return convert_prefixed(state_dict, lambda backbone: convert_backbone(backbone, trunk))


def official_release(checkpoint: dict) -> str:
    """``'detection'`` or ``'segmentation'``: the official release a checkpoint comes from,
    by the host library named in its ``meta`` and the heads among its tensors."""
    meta = checkpoint.get('meta') or {}
    state_dict = checkpoint.get('state_dict', checkpoint)
    signs = {'detection': ['mmdet_version' in meta,
                           any(key.startswith(('rpn_head.', 'roi_head.')) for key in state_dict)],
             'segmentation': ['mmseg_version' in meta,
                              any(key.startswith('decode_head.') for key in state_dict)]}
    found = [release for release, seen in signs.items() if any(seen)]
    if len(found) != 1:
        raise ValueError(
            f'cannot tell which official release the checkpoint comes from (signs of '
            f'{" and ".join(found) or "neither"}: mmdet_version / mmseg_version in its meta, '
            f'rpn_head / roi_head or decode_head tensors): give --release detection or '
            f'--release segmentation')
    return found[0]


def check_vit_features(release: str, vit_features: str) -> None:
    """Raises unless our adapter's ``vit_features`` computes what ``release``'s backbone
    computes."""
    expected = RELEASE_FEATURES[release]
    if vit_features != expected:
        adds, recipes = (('the last trunk map to every level', 'Mask R-CNN') if expected == 'last'
                         else ('the trunk map after interaction i to level i', 'UperNet'))
        raise ValueError(
            f"a checkpoint of the official {release} release adds {adds}, the config's adapter "
            f"has vit_features={vit_features!r}: use a config with backbone "
            f"vit_features={expected!r} (the {recipes} adapter recipes)")


def convert_file(args: argparse.Namespace) -> Converted:
    """The official checkpoint at ``args.src`` converted for, and loaded strictly by, the
    model of ``args.config``."""
    checkpoint = read_checkpoint(args.src)
    cfg = Config.fromfile(args.config)
    try:
        release = args.release or official_release(checkpoint)
        check_vit_features(release, cfg.model.backbone.get('vit_features', 'last'))
    except ValueError as error:
        raise SystemExit(f'{args.src}: {error}') from None
    model = build_model(cfg, 'count')
    converted = convert(checkpoint.get('state_dict', checkpoint), model.backbone.trunk)
    model.load_state_dict(converted, strict=True)
    print(f'loads strictly into the model of {args.config}')
    meta = converted_meta(checkpoint, args.src, official_release=release)
    return Converted(dict(state_dict=converted, meta=meta), len(converted))


def main() -> None:
    parser = converter_parser(__doc__, 'official checkpoint (.pth / .pth.tar)',
                              'our adapter config whose model must load it strictly',
                              config_required=True)
    parser.add_argument('--release', choices=sorted(RELEASE_FEATURES),
                        help='the official release the checkpoint comes from, where its meta '
                             'and tensors do not say')
    converter_main(parser, convert_file)


if __name__ == '__main__':
    main()
