"""Records ``data/vit_adapter_official.pt``, the reference of
``test_vit_adapter_official.py``, by running the official ViT-Adapter (a working tree of
czczup/ViT-Adapter, not shipped with vitdense) on the test's weights and input:

    PYTHONPATH=. python tests/tools/model_converters/record_vit_adapter_official.py \
        /path/to/ViT-Adapter

For each release (``detection``: ``detection/mmdet_custom/models/backbones/vit_adapter.py``,
``segmentation``: ``segmentation/mmseg_custom/models/backbones/vit_adapter.py``) it builds the
official ``ViTAdapter`` at the test's tiny size in float64 and eval mode, loads
``seeded_state_dict`` in the official layout and stores the four output maps and the gradients
of a fixed weighting of them by the input and by every parameter (the latter converted to our
layout), each as its projections on the test's probes. The official files import mmcv 1.x,
mmdet 2.x / mmseg 0.x and a compiled deformable attention: those few names are stood in for
here (a registry that registers nothing, a logger, mmcv's ``BaseModule`` as ``nn.Module``, and
the deformable attention served by ``vitdense.compat``).
"""
import argparse
import importlib
import sys
import types
from pathlib import Path

import torch
import torch.nn as nn

from test_vit_adapter_official import (FIXTURE, OFFICIAL_SETTINGS, fixture_input,
                                       gradient_probes, output_weighting, project,
                                       seeded_state_dict, tiny_adapter)
from tools.model_converters.vit_adapter_official import convert_backbone
from vitdense.compat import mmcv_ext

#: each release's folder of the official code and the host library it imports
RELEASES = {'detection': ('detection/mmdet_custom', 'mmdet'),
            'segmentation': ('segmentation/mmseg_custom', 'mmseg')}


def _module(name: str, **attributes) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__dict__.update(attributes)
    sys.modules[name] = module
    return module


def _deformable_attention_ext() -> None:
    """The official ops' ``MultiScaleDeformableAttention`` extension, served by ours."""
    def backward(value, shapes, starts, locations, weights, grad_output, im2col_step):
        grads = [torch.zeros_like(t) for t in (value, locations, weights)]
        mmcv_ext.ms_deform_attn_backward(value, shapes, starts, locations, weights,
                                         grad_output.contiguous(), *grads,
                                         im2col_step=im2col_step)
        return tuple(grads)
    _module('MultiScaleDeformableAttention',
            ms_deform_attn_forward=mmcv_ext.ms_deform_attn_forward,
            ms_deform_attn_backward=backward)


class _Registry:
    def register_module(self, *args, **kwargs):
        return lambda cls: cls


class _BaseModule(nn.Module):
    def __init__(self, init_cfg=None) -> None:
        super().__init__()


def official_adapter(root: Path, release: str) -> nn.Module:
    """The official ``ViTAdapter`` of ``release`` at the test's settings (not initialised:
    the caller loads weights)."""
    folder, host = RELEASES[release]
    _deformable_attention_ext()
    _module('mmcv.runner', BaseModule=_BaseModule)
    _module('mmcv_custom', my_load_checkpoint=None)
    _module(f'{host}.utils', get_root_logger=lambda: None)
    _module(f'{host}.models.builder', BACKBONES=_Registry())
    sys.path.insert(0, str(root / 'detection'))  # the compiled ops' Python side
    package = f'official_{release}'
    for name in (package, f'{package}.base'):
        sys.modules.pop(name, None)
    _module(package, __path__=[str(root / folder / 'models' / 'backbones')])
    _module(f'{package}.base', __path__=[str(root / folder / 'models' / 'backbones' / 'base')])
    official = importlib.import_module(f'{package}.vit_adapter')
    return official.ViTAdapter(**OFFICIAL_SETTINGS)


def record(root: Path, release: str) -> dict:
    model = official_adapter(root, release).double()
    shapes = [(key, tuple(value.shape)) for key, value in model.state_dict().items()]
    model.load_state_dict(seeded_state_dict(shapes), strict=True)
    model.eval()
    image = fixture_input().requires_grad_()
    outputs = model(image)
    sum((out * weight).sum() for out, weight in zip(outputs, output_weighting(outputs))
        ).backward()
    # into our layout as a checkpoint goes (the load drops the position table's class row)
    ours = tiny_adapter().double()
    ours.load_state_dict(dict(ours.state_dict(), **convert_backbone(
        {key: value.grad for key, value in model.named_parameters()}, ours.trunk)))
    grads = dict(((key, value.detach()) for key, value in ours.named_parameters()),
                 input=image.grad)
    return dict(outputs=[out.detach() for out in outputs],
                grads=project(grads, gradient_probes(grads)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('official_root', type=Path, help='a working tree of ViT-Adapter')
    parser.add_argument('--out', type=Path, default=FIXTURE)
    args = parser.parse_args()
    releases = {release: record(args.official_root, release) for release in RELEASES}
    shapes = [(key, tuple(value.shape)) for key, value in
              official_adapter(args.official_root, 'detection').state_dict().items()]
    torch.save(dict(official_shapes=shapes, **releases), args.out)
    print(f'wrote {args.out} ({args.out.stat().st_size / 1e3:.0f} KB)')


if __name__ == '__main__':
    main()
