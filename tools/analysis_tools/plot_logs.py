"""Plot a run's training curves (loss, lr, ...) and validation metrics from its logs.

    python tools/analysis_tools/plot_logs.py RUN [RUN ...] [--keys loss lr accuracy/top1]
        [--legend A B] [--out curves.png] [--json summary.json]

RUN is an mmengine work dir (its latest run is read), a ``vis_data/scalars.json`` (what
mmengine's LocalVisBackend writes, one JSON record per logging step) or a text ``.log``
(``Epoch(train) [e][i/n] ... loss: ...`` lines, for runs logged without the local
backend). Without --keys every loss, the learning rate and every validation metric get a
panel; several runs share the panels. The summary gives per run and key the first, last,
minimum and maximum values, and the mean seconds per training iteration.
"""
from __future__ import annotations

import argparse
import glob
import json
import os.path as osp
import re
from typing import Optional

import matplotlib.pyplot as plt

Series = dict[str, list[tuple[float, float]]]  # key -> [(step, value)]
NUMBER = r'-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?'
PAIR = re.compile(rf'([A-Za-z_][\w/.\-]*): ({NUMBER})(?=\s|$)')
TRAIN_LINE = re.compile(r'(Epoch|Iter)\(train\)\s+(?:\[(\d+)\])?\s*\[\s*(\d+)/(\d+)\]')
VAL_LINE = re.compile(r'(Epoch|Iter)\(val\)\s+(?:\[(\d+)\])?\s*\[\s*(\d+)/(\d+)\]')
NOT_CURVES = {'epoch', 'iter', 'step', 'data_time', 'memory', 'eta'}


def find_log(run: str) -> str:
    """The scalars.json (or failing that the text log) of a run dir's latest run."""
    if osp.isfile(run):
        return run
    if not osp.isdir(run):
        raise SystemExit(f'no such run, scalars file or log: {run}')
    for pattern in ('*/vis_data/scalars.json', 'vis_data/scalars.json', 'scalars.json',
                    '*/*.log', '*.log'):
        found = sorted(glob.glob(osp.join(run, pattern)))
        if found:
            return found[-1]
    raise SystemExit(f'{run}: no vis_data/scalars.json or .log of an mmengine run in it')


def read_scalars(path: str) -> tuple[Series, Series]:
    """(train, val) series of a scalars.json: records with a learning rate or a loss are
    training steps (at ``step`` = iteration); the others are validation (at ``step``)."""
    train: Series = {}
    val: Series = {}
    with open(path) as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise SystemExit(f'{path}:{number}: not a JSON record ({error})') from None
            is_train = 'lr' in record or any(k.startswith('loss') for k in record)
            target = train if is_train else val
            step = record.get('step', record.get('iter', number))
            for key, value in record.items():
                if key not in NOT_CURVES and isinstance(value, (int, float)):
                    target.setdefault(key, []).append((float(step), float(value)))
    return train, val


def read_text_log(path: str) -> tuple[Series, Series]:
    """(train, val) series of an mmengine text log; training steps are counted in
    iterations (epoch-based runs: (epoch - 1) · iterations per epoch + iteration), and
    validation at the epoch (or iteration) it ran after."""
    train: Series = {}
    val: Series = {}
    with open(path) as f:
        for line in f:
            match = TRAIN_LINE.search(line)
            if match:
                kind, epoch, index, total = match.groups()
                step = (int(epoch) - 1) * int(total) + int(index) if epoch else int(index)
                target = train
            else:
                match = VAL_LINE.search(line)
                if not match or int(match.group(3)) != int(match.group(4)):
                    continue
                step = int(match.group(2) or match.group(3))
                target = val
            for key, value in PAIR.findall(line[match.end():]):
                if key not in NOT_CURVES:
                    target.setdefault(key, []).append((float(step), float(value)))
    if not train and not val:
        raise SystemExit(f'{path}: no Epoch/Iter(train) or (val) lines with values')
    return train, val


def read_run(run: str) -> tuple[str, Series, Series]:
    path = find_log(run)
    train, val = read_scalars(path) if path.endswith('.json') else read_text_log(path)
    return path, train, val


def default_keys(train: Series, val: Series) -> list[str]:
    losses = sorted(k for k in train if k.startswith('loss'))
    return losses + [k for k in ('lr',) if k in train] + sorted(
        k for k in val if k not in NOT_CURVES and k != 'time')


def summarise(train: Series, val: Series) -> dict:
    summary = {}
    for split, series in (('train', train), ('val', val)):
        for key, points in series.items():
            values = [v for _, v in points]
            summary[f'{split}/{key}'] = dict(first=values[0], last=values[-1],
                                             min=min(values), max=max(values),
                                             points=len(values))
    if 'time' in train:
        times = [v for _, v in train['time']]
        summary['seconds_per_iter'] = sum(times) / len(times)
    return summary


def plot(runs: list[tuple[str, Series, Series]], keys: list[str], out: str,
         title: Optional[str]) -> None:
    fig, axes = plt.subplots(1, len(keys), figsize=(3.6 * len(keys), 3), squeeze=False)
    for axis, key in zip(axes[0], keys):
        for label, train, val in runs:
            series, split = (train, 'train') if key in train else (val, 'val')
            points = series.get(key)
            if not points:
                continue
            steps, values = zip(*points)
            axis.plot(steps, values, marker='o' if split == 'val' else None,
                      markersize=3, label=label)
        axis.set(title=key, xlabel='iteration' if key in runs[0][1] else 'validation step')
        if key == 'lr':
            axis.ticklabel_format(axis='y', style='sci', scilimits=(-2, 2))
        if len(runs) > 1:
            axis.legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


def main(argv: Optional[list[str]] = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('runs', nargs='+', help='work dirs, scalars.json or .log files')
    parser.add_argument('--keys', nargs='+', help='curves to plot (default: losses, lr, '
                        'validation metrics)')
    parser.add_argument('--legend', nargs='+', help='one label per run')
    parser.add_argument('--title')
    parser.add_argument('--out', default='curves.png', help='PNG to write')
    parser.add_argument('--json', help='also write the summary here')
    args = parser.parse_args(argv)
    plt.switch_backend('agg')  # files only, no display
    if args.legend and len(args.legend) != len(args.runs):
        raise SystemExit(f'--legend gives {len(args.legend)} labels for {len(args.runs)} runs')
    loaded = [read_run(run) for run in args.runs]
    labels = args.legend or [run.rstrip('/') for run in args.runs]
    keys = args.keys or default_keys(loaded[0][1], loaded[0][2])
    missing = [k for k in keys if not any(k in t or k in v for _, t, v in loaded)]
    if missing or not keys:
        known = sorted({k for _, t, v in loaded for k in (*t, *v)})
        raise SystemExit(f'no values for keys {missing} in these logs; they have: {known}')
    plot([(label, train, val) for label, (_, train, val) in zip(labels, loaded)], keys,
         args.out, args.title)
    summary = {label: dict(log=path, **summarise(train, val))
               for label, (path, train, val) in zip(labels, loaded)}
    print(json.dumps(summary, indent=1))
    print(f'wrote {args.out}')
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(summary, f, indent=1)
    return summary


if __name__ == '__main__':
    main()
