"""Convert a detectron2 ViTDet checkpoint's ViT backbone and simple feature pyramid to the
models of our ``*_vitdet_*`` ViT configs (``backbone.*``, ``neck.*``).

detectron2 keeps the ViT at ``backbone.net`` and the pyramid stages at
``backbone.simfp_<log2 stride>``; the key table is data next to the ViT family
(``vitdense.models.backbones.checkpoint_vit.DETECTRON2_VITDET_KEYS``). Its RPN and RoI heads have other
layouts than mmdet's and are left out: those train from their initialisation. Reads
detectron2's ``.pkl`` (numpy arrays, read with a loader that accepts numpy arrays only) and
``.pth`` files.

    python tools/model_converters/detectron2_vitdet.py model_final_61ccd1.pkl \\
        vitdet-b_backbone_neck.pth \\
        --config configs/vit/mask-rcnn_vit-b-p16_vitdet_16xb4-lsj-100e_coco-1024x1024.py
"""
from __future__ import annotations

import argparse
import pickle

import numpy as np
import torch
from mmengine.config import Config

from vitdense.checkpoint_convert import Converted, converter_entry, require_dict
from vitdense.checkpoint_io import safe_load
from vitdense.model_factory import build_model
from vitdense.models.backbones.checkpoint_vit import convert_detectron2_vitdet

#: what a detectron2 .pkl may hold besides plain containers and numbers
NUMPY_GLOBALS = {('numpy.core.multiarray', '_reconstruct'), ('numpy._core.multiarray', '_reconstruct'),
                 ('numpy', 'ndarray'), ('numpy', 'dtype'), ('collections', 'OrderedDict')}


class _NumpyUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if (module, name) not in NUMPY_GLOBALS:
            raise pickle.UnpicklingError(f'{module}.{name} is not a numpy array part: refusing '
                                         f'to load it from a checkpoint')
        return super().find_class(module, name)


def read_detectron2(path: str) -> dict:
    """The state dict of a detectron2 checkpoint as tensors."""
    if path.endswith('.pkl'):
        try:
            with open(path, 'rb') as file:
                checkpoint = _NumpyUnpickler(file, encoding='latin1').load()
        except (pickle.UnpicklingError, EOFError) as err:
            raise SystemExit(f'refused to load {path}: {err or "the pickle ends early"}. '
                             'Nothing from the file was executed.') from None
    else:
        checkpoint = safe_load(path, map_location='cpu')
    state_dict = require_dict(checkpoint, path).get('model', checkpoint)
    return {key: torch.from_numpy(np.ascontiguousarray(value)) if isinstance(value, np.ndarray)
            else value for key, value in state_dict.items()}


def check_against_config(state_dict: dict, config: str) -> None:
    """Build the config's model and load ``state_dict``: every backbone and neck tensor must
    be there with its shape (raises otherwise); the heads keep their initialisation."""
    model = build_model(Config.fromfile(config), 'count')
    result = model.load_state_dict(state_dict, strict=False)
    missing = [k for k in result.missing_keys if k.startswith(('backbone.', 'neck.'))]
    if missing or result.unexpected_keys:
        raise SystemExit(f'{config}: missing {missing[:8]}, unexpected '
                         f'{result.unexpected_keys[:8]}')
    print(f'backbone and neck load into the model of {config}; '
          f'{len(result.missing_keys)} head tensors keep their initialisation')


def convert_file(args: argparse.Namespace) -> Converted:
    """The ViTDet checkpoint at ``args.src`` converted (backbone and neck checked against
    ``args.config``'s model); detectron2's heads are left out."""
    source = read_detectron2(args.src)
    converted = convert_detectron2_vitdet(source)
    if not any(key.startswith('neck.') for key in converted):
        raise SystemExit(f'{args.src}: no backbone.simfp_* tensors: not a ViTDet checkpoint')
    if args.config:
        check_against_config(converted, args.config)
    return Converted(dict(state_dict=converted, meta=dict(converted_from=args.src)),
                     len(converted),
                     f' ({len(source) - len(converted)} head tensors of detectron2 left out)')


main = converter_entry(convert_file, __doc__, 'detectron2 ViTDet checkpoint (.pkl or .pth)',
                       'our config whose backbone and neck must load it')


if __name__ == '__main__':
    main()
