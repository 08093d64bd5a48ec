"""Parameters and FLOPs of the model of any config, FLOPs as the papers count them: multiply-adds
(see :mod:`vitdense.analysis.complexity` for what is counted and at which input size).

    python tools/analysis_tools/get_flops.py configs/xcit/xcit-s12-p16_8xb128_in1k.py
    python tools/analysis_tools/get_flops.py \\
        configs/xcit/mask-rcnn_xcit-s12-p16_fpn_3x_coco.py --shape 1024 1024
"""
import argparse
import json

from vitdense.analysis.complexity import analyse


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('config')
    parser.add_argument('--shape', type=int, nargs=2, metavar=('H', 'W'),
                        help='input size; default: the test crop (classification), the '
                             'padded test resize (detection), the training crop (segmentation)')
    parser.add_argument('--json', action='store_true', help='print one JSON line')
    args = parser.parse_args()
    result = analyse(args.config, args.shape)
    if args.json:
        print(json.dumps(result))
        return
    height, width = result['shape']
    print(f'{args.config}\ninput: 3 x {height} x {width}\n'
          f'params: {result["params"] / 1e6:.2f} M\n'
          f'FLOPs (multiply-adds): {result["flops"] / 1e9:.2f} G')


if __name__ == '__main__':
    main()
