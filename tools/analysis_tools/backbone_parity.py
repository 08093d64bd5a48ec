"""Regenerate the parity table: for every arch in the tables, parameters (ours / timm),
max |logit difference| and max |block-output difference| at ``out_indices`` against timm
on the same random weights (fp32, CPU).

    python tools/analysis_tools/backbone_parity.py --out work_dirs/parity.json
    python tools/analysis_tools/backbone_parity.py --families xcit --max-params 30
"""
import argparse
import json
import time

from vitdense.analysis.timm_parity import REFERENCE_MODELS, compare_with_timm


def _fmt(value, spec: str) -> str:
    return '—' if value is None else format(value, spec)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--families', nargs='*', help='subset of vit cait xcit convit')
    parser.add_argument('--max-params', type=float, default=None,
                        help='skip models above this many million parameters')
    parser.add_argument('--out', help='also write the rows as JSON here')
    args = parser.parse_args()

    rows = []
    print('| family | arch | options | timm model | params ours (M) | params timm (M) '
          '| max logit diff | max feature diff |')
    print('|---|---|---|---|---|---|---|---|')
    for family, arch, options, timm_name in REFERENCE_MODELS:
        if args.families and family not in args.families:
            continue
        start = time.time()
        row = compare_with_timm(family, arch, None, **options)  # cheap: size only
        if args.max_params and row['params_ours'] / 1e6 > args.max_params:
            continue
        if timm_name is not None:
            row = compare_with_timm(family, arch, timm_name, **options)
        row['seconds'] = round(time.time() - start, 1)
        rows.append(row)
        timm_params = row['params_timm'] and row['params_timm'] / 1e6
        print(f"| {family} | {arch} | {options or ''} | {timm_name or '—'} "
              f"| {row['params_ours'] / 1e6:.2f} | {_fmt(timm_params, '.2f')} "
              f"| {_fmt(row['logit_diff'], '.1e')} | {_fmt(row['feature_diff'], '.1e')} |",
              flush=True)
    if args.out:
        with open(args.out, 'w') as f:
            json.dump(rows, f, indent=1, default=str)


if __name__ == '__main__':
    main()
