"""Write the seeded demo ImageNet (10 procedurally drawn classes) in mmpretrain's layout.

    python tools/data/gen_demo_imagenet.py data/demo_in10 --train-per-class 300 --val-per-class 50
"""
from __future__ import annotations

import argparse

from vitdense.demo_data import DEMO_IMAGENET_CLASSES, make_demo_imagenet


def main() -> None:
    parser = argparse.ArgumentParser(description='Write the seeded demo ImageNet.')
    parser.add_argument('root', nargs='?', default='data/demo_in10')
    parser.add_argument('--train-per-class', type=int, default=300)
    parser.add_argument('--val-per-class', type=int, default=50)
    parser.add_argument('--size', type=int, default=72, help='image side in pixels')
    parser.add_argument('--seed', type=int, default=0)
    args = parser.parse_args()
    root = make_demo_imagenet(args.root, num_train=args.train_per_class,
                              num_val=args.val_per_class, size=args.size, seed=args.seed)
    print(f'demo ImageNet ({len(DEMO_IMAGENET_CLASSES)} classes) written to {root}')


if __name__ == '__main__':
    main()
