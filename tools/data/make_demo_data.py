"""Write the seeded demo data sets that the ``*_demo-*`` configs read.

    python tools/data/make_demo_data.py coco        # -> data/demo_coco (400 + 100 images)
    python tools/data/make_demo_data.py ade         # -> data/demo_ade (400 + 100 images)
    python tools/data/make_demo_data.py panoptic    # -> data/demo_coco_panoptic (400 + 100)
    python tools/data/make_demo_data.py imagenet    # -> data/demo_in10 (300 + 50 per class)
"""
import argparse
import inspect

from vitdense.demo_data import DEMO_SET_MAKERS, default_folder

#: options of the shape sets (coco, ade, panoptic) only
SHAPE_OPTIONS = ('max_objects', 'random_colours')


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('kind', choices=sorted(DEMO_SET_MAKERS),
                        help='COCO instances, ADE20k semantic maps, COCO panoptic or ImageNet '
                             'classes')
    parser.add_argument('--out', help='output folder (default: the demo configs\' data_root)')
    parser.add_argument('--num-train', type=int,
                        help='training images (imagenet: per class); default 400 (300)')
    parser.add_argument('--num-val', type=int,
                        help='validation images (imagenet: per class); default 100 (50)')
    parser.add_argument('--size', type=int, help='image side in pixels (coco 160, ade and '
                                                 'panoptic 128, imagenet 72)')
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--max-objects', type=int, help='shapes per image (coco, ade, panoptic; '
                                                          'default 4)')
    parser.add_argument('--random-colours', action='store_true',
                        help='shapes in any colour (coco, ade, panoptic; default: shades of '
                             'a colour per class)')
    args = parser.parse_args(argv)
    make = DEMO_SET_MAKERS[args.kind]
    takes = inspect.signature(make).parameters
    given = {name: value for name, value in vars(args).items()
             if name in SHAPE_OPTIONS and value not in (None, False)}
    if given and 'max_objects' not in takes:
        parser.error(f'--{"/--".join(n.replace("_", "-") for n in given)}: the {args.kind} '
                     f'demo set has no shapes to place')
    options = {'num_train': args.num_train, 'num_val': args.num_val, 'size': args.size,
               'seed': args.seed, 'max_objects': args.max_objects}
    options = {name: value for name, value in options.items() if value is not None}
    if args.random_colours:
        options['class_colours'] = False
    out = make(args.out or default_folder(args.kind), **options)
    print(f'wrote {args.kind} demo set: {out}')


if __name__ == '__main__':
    main()
