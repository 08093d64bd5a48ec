"""Convert an official release (DeiT/CaiT, XCiT, ConViT ``.pth`` with a ``model`` key) or a
timm state dict into a vitdense checkpoint, offline.

The result is verified by loading it strictly into the backbone it is meant for. With
``--classifier`` it is written as an mmpretrain ImageClassifier checkpoint (``backbone.*``
and ``head.fc.*``), otherwise as a bare backbone state dict for ``init_cfg=Pretrained``.

    python tools/model_converters/timm_to_vitdense.py xcit xcit_small_12_p16_224.pth \\
        xcit-s12-p16_in1k.pth --arch small_12 --patch-size 16
"""
import argparse
import json

from vitdense.checkpoint_convert import Converted, converter_main, read_checkpoint
from vitdense.models import backbone_families


def argument_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('family', choices=sorted(backbone_families()))
    parser.add_argument('src', help='official or timm checkpoint')
    parser.add_argument('dst', help='where to write the vitdense checkpoint')
    parser.add_argument('--arch', required=True, help="arch name, e.g. 'small_12'")
    parser.add_argument('--patch-size', type=int, default=16)
    parser.add_argument('--img-size', type=int, default=224)
    parser.add_argument('--backbone-options', type=json.loads, default={},
                        help='extra backbone kwargs as JSON, e.g. \'{"num_parallel": 2}\'')
    parser.add_argument('--classifier', action='store_true',
                        help='write an mmpretrain classifier checkpoint (keeps the head)')
    return parser


def convert_file(args: argparse.Namespace) -> Converted:
    """The checkpoint at ``args.src`` converted and loaded strictly into the backbone of
    ``args``; with ``--classifier``, a classifier's checkpoint keeping its head."""
    cls = backbone_families()[args.family]
    source = read_checkpoint(args.src, 'state dict')
    source = source.get('model', source.get('state_dict', source))
    state_dict = cls.checkpoint_layout.convert(source)
    backbone = cls(args.arch, patch_size=args.patch_size, img_size=args.img_size,
                   out_type='cls_token', **args.backbone_options)
    backbone.load_state_dict(state_dict, strict=True)
    state_dict = backbone.state_dict()
    if args.classifier:
        head = {k: v for k, v in source.items() if k.startswith('head.')}
        if not head:
            raise SystemExit(f'{args.src} has no classifier head (head.*) to keep')
        state_dict = {**{f'backbone.{k}': v for k, v in state_dict.items()},
                      **{f'head.fc.{k[len("head."):]}': v for k, v in head.items()}}
    meta = dict(family=args.family, arch=args.arch, patch_size=args.patch_size,
                img_size=args.img_size, source=args.src)
    return Converted(dict(state_dict=state_dict, meta=meta), len(state_dict), f' ({meta})')


def main() -> None:
    converter_main(argument_parser(), convert_file)


if __name__ == '__main__':
    main()
