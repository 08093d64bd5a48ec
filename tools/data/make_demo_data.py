"""Write the seeded demo datasets used by the ``*_demo-*`` configs.

    python tools/data/make_demo_data.py coco            # -> data/demo_coco (400 + 100 images)
    python tools/data/make_demo_data.py ade --seed 1    # -> data/demo_ade
"""
import argparse

from vitdense.demo_data import make_demo_ade, make_demo_coco

_MAKERS = {'coco': (make_demo_coco, 'data/demo_coco', 160),
           'ade': (make_demo_ade, 'data/demo_ade', 128)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('kind', choices=sorted(_MAKERS), help='COCO instances or ADE20k layout')
    parser.add_argument('--out', help='output folder (default data/demo_<kind>)')
    parser.add_argument('--num-train', type=int, default=400)
    parser.add_argument('--num-val', type=int, default=100)
    parser.add_argument('--size', type=int, help='image side in pixels (coco 160, ade 128)')
    parser.add_argument('--max-objects', type=int, default=4)
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--random-colours', action='store_true',
                        help='shapes in any colour (default: shades of a colour per class)')
    args = parser.parse_args()
    make, default_out, default_size = _MAKERS[args.kind]
    out = make(args.out or default_out, num_train=args.num_train, num_val=args.num_val,
               size=args.size or default_size, seed=args.seed, max_objects=args.max_objects,
               class_colours=not args.random_colours)
    print(f'wrote {args.kind} demo set: {out}')


if __name__ == '__main__':
    main()
