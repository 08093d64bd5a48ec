"""The flow every checkpoint converter of ``tools/model_converters`` shares, once: parse the
command line, read the source safely, convert and check it (the converter's part), write it
atomically (keeping an existing file where the converter offers ``--overwrite``), report
what was written."""
from __future__ import annotations

import argparse
import os.path as osp
from collections import OrderedDict
from typing import Any, Callable, Mapping, NamedTuple

from vitdense.checkpoint_io import safe_load, save_plain


class Converted(NamedTuple):
    """A conversion's result: what to write (a state dict, or a dict of ``state_dict`` and
    ``meta``), how many tensors it holds, and what the report adds after that number."""
    checkpoint: Any
    tensors: int
    note: str = ''


def require_dict(checkpoint: Any, path: str, holds: str = 'checkpoint dict') -> dict:
    """``checkpoint``, read from ``path``; exits naming what it is where it is no dict."""
    if not isinstance(checkpoint, dict):
        raise SystemExit(f'{path} holds a {type(checkpoint).__name__}, not a {holds}')
    return checkpoint


def read_checkpoint(path: str, holds: str = 'checkpoint dict') -> dict:
    """The dict saved at ``path``, loaded safely (no code of the file runs)."""
    return require_dict(safe_load(path, map_location='cpu'), path, holds)


def converted_meta(checkpoint: dict, src: str, **extra: Any) -> dict:
    """The source's ``meta`` with ``converted_from=src`` and ``extra``, less its ``config``
    (an mmdet 2.x / mmseg 0.x config that our tools cannot read)."""
    meta = dict(checkpoint.get('meta') or {}, converted_from=src, **extra)
    meta.pop('config', None)
    return meta


def convert_prefixed(state_dict: Mapping[str, Any],
                     convert_part: Callable[[dict], Mapping[str, Any]],
                     prefix: str = 'backbone.') -> OrderedDict:
    """``state_dict`` with its ``prefix`` part (a detector's or segmentor's backbone) converted
    by ``convert_part``, which sees its keys without the prefix; the rest (necks, heads) is
    kept as it is."""
    part = {key[len(prefix):]: value for key, value in state_dict.items()
            if key.startswith(prefix)}
    if not part:
        raise KeyError(f'no {prefix}* keys: not a detector / segmentor checkpoint')
    converted = OrderedDict((prefix + key, value) for key, value in convert_part(part).items())
    converted.update((key, value) for key, value in state_dict.items()
                     if not key.startswith(prefix))
    return converted


def converter_parser(description: str, src_help: str, config_help: str,
                     config_required: bool = False) -> argparse.ArgumentParser:
    """The command line of a converter of detector / segmentor checkpoints: ``src``, ``dst``
    and the ``--config`` whose model the result must load into."""
    parser = argparse.ArgumentParser(description=description,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('src', help=src_help)
    parser.add_argument('dst', help='converted checkpoint to write')
    parser.add_argument('--config', required=config_required, help=config_help)
    return parser


def converter_main(parser: argparse.ArgumentParser,
                   convert: Callable[[argparse.Namespace], Converted],
                   keep_existing: bool = False) -> None:
    """Run a converter whose ``parser`` has the ``src`` and ``dst`` arguments: ``convert``
    reads, converts and checks (exiting or raising on what it refuses), then its result is
    written to ``dst`` atomically.  ``keep_existing`` adds ``--overwrite`` and refuses an
    existing ``dst`` without it, before anything is read."""
    if keep_existing:
        parser.add_argument('--overwrite', action='store_true', help='replace DST if it exists')
    args = parser.parse_args()
    if keep_existing and osp.exists(args.dst) and not args.overwrite:
        raise SystemExit(f'{args.dst} exists; pass --overwrite to replace it')
    result = convert(args)
    save_plain(result.checkpoint, args.dst)
    print(f'wrote {result.tensors} tensors to {args.dst}{result.note}')


def converter_entry(convert: Callable[[argparse.Namespace], Converted], description: str,
                    src_help: str, config_help: str) -> Callable[[], None]:
    """The ``main`` of a converter whose command line is :func:`converter_parser`'s:
    :func:`converter_main` with that parser and ``convert``."""
    def main() -> None:
        converter_main(converter_parser(description, src_help, config_help), convert)
    return main
