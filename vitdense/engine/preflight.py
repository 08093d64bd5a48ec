"""Data checks before training, and bad samples named (or skipped) during it.

Without them a broken data set fails deep in a library and late: an annotation file that is
not JSON in pycocotools' parser, an empty data set as numpy's "need at least one array to
concatenate", a zero-byte image or truncated label map at whatever iteration first draws it,
none of them naming the file. :func:`check_data` runs before the Runner is built and
:class:`CheckedDataset` wraps the training set so that a sample which fails later names its
files, or is skipped and counted when the user asked for that.

A truncated JPEG decodes without an error (libjpeg fills the missing rows with grey), so
:class:`CheckedDataset` first checks that a JPEG ends with its end-of-image marker, and
decodes one that does not with Pillow's strict decoder (trailing bytes after a complete
image are allowed, a missing end is an error naming the file).
"""
from __future__ import annotations

import json
import logging
import os
import os.path as osp
from typing import Any

from mmengine.config import Config, ConfigDict
from mmengine.logging import print_log
from mmengine.registry import DATASETS as MMENGINE_DATASETS
from mmengine.registry import DefaultScope
from PIL import Image, ImageFile
from torch.utils.data import Dataset

from vitdense.demo_data import default_folder, demo_set_at
from vitdense.registry import DATASETS


class DataError(ValueError):
    """A data set, annotation file or sample that cannot be used, named with its files."""


JPEG_SUFFIXES = ('.jpg', '.jpeg')
_JPEG_END = b'\xff\xd9'  # the end-of-image marker (JPEG, ITU T.81 B.2.1)


def _sample_files(dataset: Any, index: int) -> list[str]:
    """The files of sample ``index`` (image, label map) as far as the data set lists them."""
    try:
        info = dataset.get_data_info(index)
    except Exception:  # noqa: BLE001  (a data set without file records; name the index only)
        return []
    files = []
    for key in ('img_path', 'seg_map_path', 'img_path_list'):
        value = info.get(key)
        files += [str(v) for v in value] if isinstance(value, (list, tuple)) else (
            [str(value)] if value else [])
    return files


def _describe(index: int, files: list[str]) -> str:
    return f'sample {index} ({", ".join(files)})' if files else f'sample {index}'


def check_jpeg_complete(path: str) -> None:
    """Raise :class:`DataError` if the JPEG file ``path`` is truncated.

    A file that ends with the end-of-image marker (zero padding allowed) passes on reading
    its last bytes; any other is decoded strictly by Pillow, which accepts trailing data
    after a complete image and refuses a missing end.
    """
    size = osp.getsize(path)
    with open(path, 'rb') as f:
        f.seek(max(0, size - 64))
        if f.read().rstrip(b'\0').endswith(_JPEG_END):
            return
    strict = ImageFile.LOAD_TRUNCATED_IMAGES
    ImageFile.LOAD_TRUNCATED_IMAGES = False
    try:
        with Image.open(path) as image:
            image.load()
    except (OSError, SyntaxError, ValueError) as err:
        raise DataError(f'image {path} is truncated or damaged ({size} bytes, no JPEG '
                        f'end-of-image marker; Pillow: {err})') from None
    finally:
        ImageFile.LOAD_TRUNCATED_IMAGES = strict


@DATASETS.register_module()
class CheckedDataset(Dataset):
    """A data set whose failing samples name their files, or are skipped and counted.

    With ``skip_bad=False`` (the default) a sample whose loading raises stops training with
    a :class:`DataError` naming the image / label map. With ``skip_bad=True`` the next
    sample is served instead, a warning names the skipped one, and ``skipped`` counts them;
    more than ``max_skipped`` in all stop the run (a data set that is mostly broken is not
    one to train on).
    """

    def __init__(self, dataset: dict | ConfigDict | Dataset, skip_bad: bool = False,
                 max_skipped: int = 100) -> None:
        self.dataset = (MMENGINE_DATASETS.build(dataset) if isinstance(dataset, dict)
                        else dataset)
        self.skip_bad = skip_bad
        self.max_skipped = max_skipped
        self.skipped: list[str] = []

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Any:
        for attempt in range(len(self)):
            current = (index + attempt) % len(self)
            files = _sample_files(self.dataset, current)
            try:
                for path in files:
                    if path.lower().endswith(JPEG_SUFFIXES) and osp.isfile(path):
                        check_jpeg_complete(path)
                return self.dataset[current]
            except Exception as err:  # noqa: BLE001  (any loader error is named, not hidden)
                where = _describe(current, files)
                if not self.skip_bad:
                    raise DataError(f'{where} failed to load: {type(err).__name__}: {err} '
                                    '(use --skip-bad-samples to skip and count such '
                                    'samples)') from err
                self.skipped.append(where)
                print_log(f'skipped {where}: {type(err).__name__}: {err} '
                          f'({len(self.skipped)} skipped so far)', logger='current',
                          level=logging.WARNING)
                if len(self.skipped) > self.max_skipped:
                    raise DataError(f'more than {self.max_skipped} samples failed to load, '
                                    f'the last {where}: {err}') from err
        raise DataError(f'no sample of the {len(self)} could be loaded')

    def __getattr__(self, name: str) -> Any:
        if name == 'dataset':  # not yet set: avoid recursing during unpickling
            raise AttributeError(name)
        return getattr(self.dataset, name)


def _missing_demo_set(data_root: str | None) -> str | None:
    """The message for a demo set's folder that does not exist, naming the command that writes
    it; None for any other folder (whose own files are checked one by one)."""
    kind = demo_set_at(data_root)
    if kind is None or osp.isdir(data_root):
        return None
    out = '' if osp.normpath(data_root) == default_folder(kind) else f' --out {data_root}'
    return (f'the demo {kind} set is not at {data_root}: write it with '
            f'`python tools/data/make_demo_data.py {kind}{out}`')


def check_annotation_file(path: str) -> None:
    """The file exists and is not empty (whether it parses, the data set's build tells)."""
    if not osp.isfile(path):
        raise DataError(f'annotation file {path} does not exist')
    if osp.getsize(path) == 0:
        raise DataError(f'annotation file {path} is empty (0 bytes)')


def _check_parses(path: str) -> None:
    """A JSON annotation file parses; called only once building its data set failed, so a
    good file (COCO's are hundreds of MB) is parsed once, by the data set."""
    if path.endswith('.json'):
        try:
            with open(path) as f:
                json.load(f)
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise DataError(f'annotation file {path} is not valid JSON: {err}') from None


def _image_dir(leaf: ConfigDict) -> str | None:
    """The image folder a data set config reads (``data_root`` / ``data_prefix``), if any."""
    prefix = leaf.get('data_prefix') or {}
    folder = prefix.get('img_path', prefix.get('img')) if isinstance(prefix, dict) else None
    if folder is None:
        return None
    return folder if osp.isabs(folder) else osp.join(leaf.get('data_root') or '', folder)


def _dataset_cfgs(dataset: ConfigDict) -> list[ConfigDict]:
    """The leaf data set configs below wrappers (RepeatDataset, ConcatDataset, ours)."""
    if 'datasets' in dataset:
        return [leaf for inner in dataset.datasets for leaf in _dataset_cfgs(inner)]
    if 'dataset' in dataset:
        return _dataset_cfgs(dataset.dataset)
    return [dataset]


def check_data(cfg: Config, num_batches: int = 2, skip_bad: bool = False) -> None:
    """Before training: every split's annotation files parse, its data set is not empty,
    and the first ``num_batches`` training batches load. The training set is then wrapped
    in :class:`CheckedDataset` so that a sample failing later is named (or skipped)."""
    splits = [name for name in ('train_dataloader', 'val_dataloader')
              if cfg.get(name) and cfg.get(name.replace('dataloader', 'cfg')) is not None]
    with DefaultScope.overwrite_default_scope(cfg.get('default_scope')):
        for split in splits:
            _check_split(cfg, split, num_batches, skip_bad)
    cfg.train_dataloader.dataset = ConfigDict(type='vitdense.CheckedDataset',
                                              dataset=cfg.train_dataloader.dataset,
                                              skip_bad=skip_bad)
    print_log(f'data check passed: {", ".join(splits)}', logger='current')


def _check_split(cfg: Config, split: str, num_batches: int, skip_bad: bool) -> None:
    """Annotation files, emptiness and (training split) the first batches of one split."""
    ann_files = [leaf.ann_file if osp.isabs(leaf.ann_file)
                 else osp.join(leaf.get('data_root') or '', leaf.ann_file)
                 for leaf in _dataset_cfgs(cfg[split].dataset) if leaf.get('ann_file')]
    leaf = _dataset_cfgs(cfg[split].dataset)[0]
    missing_set = _missing_demo_set(leaf.get('data_root'))
    if missing_set:
        raise DataError(missing_set)
    for ann_file in ann_files:
        check_annotation_file(ann_file)
    where = (f'data_root={leaf.get("data_root")!r}, ann_file={leaf.get("ann_file")!r}, '
             f'data_prefix={leaf.get("data_prefix")!r}')
    image_dir = _image_dir(leaf)
    if image_dir is not None and (not osp.isdir(image_dir) or not os.listdir(image_dir)):
        raise DataError(f'{split}: the data set is empty ({where}): image folder '
                        f'{image_dir} {"is empty" if osp.isdir(image_dir) else "does not exist"}')
    try:
        dataset = MMENGINE_DATASETS.build(cfg[split].dataset)
    except DataError:
        raise
    except Exception as err:  # noqa: BLE001  (the library's error, with the files named)
        for ann_file in ann_files:
            _check_parses(ann_file)
        raise DataError(f'{split}: the data set ({where}) could not be built: '
                        f'{type(err).__name__}: {err}') from err
    if len(dataset) == 0:
        raise DataError(f'{split}: the data set is empty ({where})')
    if split == 'train_dataloader':
        checked = CheckedDataset(dataset, skip_bad=skip_bad)
        count = min(len(dataset), num_batches * cfg[split].get('batch_size', 1))
        for index in range(count):
            checked[index]
