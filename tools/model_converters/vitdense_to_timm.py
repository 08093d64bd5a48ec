"""Write a vitdense backbone (a plain backbone state dict, or a whole model's checkpoint with
its backbone under ``backbone.``) as the state dict of the family's timm model.

The result is loaded strictly by ``timm.create_model(TIMM_MODEL, num_classes=N)`` before it is
written: N is the classes of a classifier's head (mmpretrain's ``head.fc``, written as timm's
``head``), else 0 (no head). A dense model has no trained classification stage (final norm,
class-attention blocks): it is refused unless ``--fill-missing`` takes those tensors from
timm's initialisation. The dense pyramid is left out. The file is written atomically and an
existing one is kept unless ``--overwrite`` is given::

    python tools/model_converters/vitdense_to_timm.py cait work_dirs/run/epoch_300.pth \\
        cait_xxs24.pth --arch xxs24
    python tools/model_converters/vitdense_to_timm.py xcit backbone.pth xcit.pth \\
        --timm-model xcit_small_12_p8_224 --fill-missing
"""
import argparse
import json
import os.path as osp

from vitdense.checkpoint_io import safe_load, save_plain
from vitdense.models import backbone_families
from vitdense.models.backbones.timm_export import timm_model_name, to_timm


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('family', choices=sorted(backbone_families()))
    parser.add_argument('src', help='vitdense checkpoint')
    parser.add_argument('dst', help='where to write the timm state dict')
    parser.add_argument('--timm-model', help='e.g. cait_xxs24_224 (default: from --arch)')
    parser.add_argument('--arch', help="the backbone's arch name, e.g. 'xxs24'")
    parser.add_argument('--patch-size', type=int, default=16)
    parser.add_argument('--img-size', type=int, default=224)
    parser.add_argument('--timm-kwargs', type=json.loads, default={},
                        help='options of timm.create_model as JSON (a custom arch), e.g. '
                             '\'{"embed_dim": 256, "depth": 6, "num_heads": 4}\'')
    parser.add_argument('--fill-missing', action='store_true',
                        help="take tensors the checkpoint lacks (a dense model's classification "
                             "stage) from timm's initialisation")
    parser.add_argument('--overwrite', action='store_true', help='replace DST if it exists')
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    if osp.exists(args.dst) and not args.overwrite:
        raise SystemExit(f'{args.dst} exists; pass --overwrite to replace it')
    if not args.timm_model and not args.arch:
        raise SystemExit('name the timm model (--timm-model) or the arch (--arch)')
    family = backbone_families()[args.family]
    try:
        timm_model = args.timm_model or timm_model_name(
            family, args.arch, patch_size=args.patch_size, img_size=args.img_size)
        state_dict, filled = to_timm(family, safe_load(args.src, map_location='cpu'),
                                     timm_model, args.timm_kwargs, args.fill_missing)
    except ValueError as error:
        raise SystemExit(f'{args.src}: {error}') from None
    save_plain(state_dict, args.dst)
    head = 'head.weight' in state_dict
    print(f'wrote {len(state_dict)} tensors to {args.dst}: load with timm.create_model('
          f'{timm_model!r}, num_classes={state_dict["head.weight"].shape[0] if head else 0}'
          f'{"".join(f", {k}={v!r}" for k, v in args.timm_kwargs.items())})'
          f'.load_state_dict(torch.load({args.dst!r}))')
    if filled:
        print(f"{len(filled)} tensors from timm's initialisation, not trained: "
              f'{", ".join(filled)}')


if __name__ == '__main__':
    main()
