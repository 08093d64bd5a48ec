"""Rewrite a checkpoint so that ``torch.load`` reads it with torch's defaults.

Checkpoints that mmengine wrote hold the message hub's ``HistoryBuffer`` s and numpy values
as objects, which ``torch.load`` (``weights_only=True`` since torch 2.6) refuses. This reads
such a file with vitdense's allow-list (nothing in it can run) and writes the same content as
tensors and Python builtins, as ``vitdense.SafeCheckpointHook`` saves today; resuming from the
result is exact. The output is written atomically and an existing file is kept unless
``--overwrite`` is given::

    python tools/model_converters/plain_checkpoint.py work_dirs/run/iter_100.pth
    python tools/model_converters/plain_checkpoint.py OLD.pth OLD.pth --overwrite  # in place
"""
from __future__ import annotations

import argparse
import os.path as osp

from vitdense.checkpoint_io import plain_checkpoint


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('src', help='checkpoint to read')
    parser.add_argument('dst', nargs='?',
                        help='where to write it (default: SRC with _plain before the suffix)')
    parser.add_argument('--overwrite', action='store_true',
                        help='replace DST if it exists (DST may be SRC)')
    args = parser.parse_args()
    stem, suffix = osp.splitext(args.src)
    dst = args.dst or f'{stem}_plain{suffix}'
    try:
        plain_checkpoint(args.src, dst, overwrite=args.overwrite)
    except FileExistsError as err:
        raise SystemExit(str(err)) from None
    print(f'wrote {dst}')


if __name__ == '__main__':
    main()
