"""Write a vitdense backbone (a plain backbone state dict, or a whole model's checkpoint with
its backbone under ``backbone.``) as the state dict of the family's timm model.

The ``timm.create_model(...)`` call is written from the backbone's options: the config an
mmengine checkpoint keeps (``meta['cfg']``), else ``--options``. Its ``num_classes`` is the
classes of a classifier's head (mmpretrain's ``head.fc``, written as timm's ``head``), else 0
(no head). Before the file is written, timm loads it strictly and both models run on one input:
the export is refused when their features differ. A dense model has no trained classification
stage (final norm, class-attention blocks): it is refused unless ``--fill-missing`` takes those
tensors from timm's initialisation. The dense pyramid is left out. The file is written
atomically and an existing one is kept unless ``--overwrite`` is given::

    python tools/model_converters/vitdense_to_timm.py cait work_dirs/run/epoch_300.pth \\
        cait_xxs24.pth
    python tools/model_converters/vitdense_to_timm.py xcit backbone.pth xcit.pth \\
        --options '{"arch": "small_12", "patch_size": 8}' --fill-missing
"""
import argparse
import json

from vitdense.checkpoint_convert import Converted, converter_main
from vitdense.checkpoint_io import safe_load
from vitdense.models import backbone_families
from vitdense.models.backbones.timm_export import to_timm


def argument_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('family', choices=sorted(backbone_families()))
    parser.add_argument('src', help='vitdense checkpoint')
    parser.add_argument('dst', help='where to write the timm state dict')
    parser.add_argument('--options', type=json.loads,
                        help="the backbone's constructor options as JSON, for a checkpoint "
                             'without config, e.g. \'{"arch": "xxs24", "out_type": '
                             '"cls_token"}\'')
    parser.add_argument('--timm-model', help="e.g. cait_xxs24_224 (default: from the family's "
                                             'timm_models table)')
    parser.add_argument('--timm-kwargs', type=json.loads, default={},
                        help='options of timm.create_model as JSON, over those written from '
                             "the backbone's options")
    parser.add_argument('--fill-missing', action='store_true',
                        help="take tensors the checkpoint lacks (a dense model's classification "
                             "stage) from timm's initialisation")
    return parser


def convert_file(args: argparse.Namespace) -> Converted:
    """The backbone of the checkpoint at ``args.src`` as its timm model's state dict, checked
    against the backbone's features."""
    family = backbone_families()[args.family]
    try:
        export = to_timm(family, safe_load(args.src, map_location='cpu'), args.timm_model,
                         args.timm_kwargs, args.fill_missing, args.options)
    except ValueError as error:
        raise SystemExit(f'{args.src}: {error}') from None
    note = (f' (features within {export.difference:.1e} of the backbone\'s): load with '
            f'{export.call}.load_state_dict(torch.load({args.dst!r}))')
    if export.filled:
        note += (f"\n{len(export.filled)} tensors from timm's initialisation, not trained: "
                 f'{", ".join(export.filled)}')
    return Converted(export.state_dict, len(export.state_dict), note)


def main() -> None:
    converter_main(argument_parser(), convert_file, keep_existing=True)


if __name__ == '__main__':
    main()
