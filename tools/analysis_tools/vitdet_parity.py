"""Compare our ViT with window attention + simple feature pyramid with detectron2's ViTDet
(``modeling/backbone/vit.py``: ``ViT`` + ``SimpleFeaturePyramid`` + ``LastLevelMaxPool``),
built from its own source on the same random weights (moved into our layout by
``convert_detectron2_vitdet``): the five pyramid levels (the backbone's outputs) and the last
block's map, each held to ``--tolerance`` (max absolute difference), on the CPU.

Needs ``detectron2`` importable (a checkout on PYTHONPATH is enough: only its pure-python
``layers`` and ``modeling/backbone`` are used). Every tensor of detectron2's model gets
random noise on top of its init, so LayerNorm affines and the zero-initialised relative
position tables are compared with values that matter. ``--dtype float64`` runs both models in
double precision, to tell float32 rounding from differences in what is computed.

    PYTHONPATH=$PWD:/path/to/detectron2 python tools/analysis_tools/vitdet_parity.py \\
        --sizes 1024x1024 1024x640
"""
import argparse
import json
from functools import partial

import torch
import torch.nn as nn

from vitdense.models import SimpleFeaturePyramid, ViT
from vitdense.models.backbones.checkpoint_vit import convert_detectron2_vitdet

#: ViTDet's ViT-B (``projects/ViTDet/configs/common/coco_loader_lsj.py`` + ``mask_rcnn_vitdet``)
WINDOW_BLOCKS = (0, 1, 3, 4, 6, 7, 9, 10)


def build_detectron2(arch: dict, img_size: int, window: int):
    """detectron2's ViTDet backbone as ViTDet's ``mask_rcnn_vitdet`` config builds it (LayerNorm
    eps 1e-6, as ours; detectron2's ``ViT`` defaults to 1e-5): ViT + SimpleFeaturePyramid
    with the stride-64 level."""
    from detectron2.modeling.backbone.fpn import LastLevelMaxPool
    from detectron2.modeling.backbone.vit import SimpleFeaturePyramid as D2Pyramid
    from detectron2.modeling.backbone.vit import ViT as D2ViT
    net = D2ViT(img_size=img_size, patch_size=16, embed_dim=arch['embed_dims'],
                depth=arch['num_layers'], num_heads=arch['num_heads'], window_size=window,
                mlp_ratio=4, qkv_bias=True, norm_layer=partial(nn.LayerNorm, eps=1e-6),
                window_block_indexes=WINDOW_BLOCKS, use_rel_pos=True, pretrain_img_size=224,
                pretrain_use_cls_token=True, out_feature='last_feat')
    return D2Pyramid(net, 'last_feat', out_channels=256, scale_factors=(4.0, 2.0, 1.0, 0.5),
                     top_block=LastLevelMaxPool(), norm='LN')


def build_ours(arch_name: str, img_size: int, window: int) -> tuple[ViT, SimpleFeaturePyramid]:
    backbone = ViT(arch_name, img_size=224, pyramid=False, out_indices=(-1,),
                   dense_class_token=False, window_size=window,
                   window_block_indexes=WINDOW_BLOCKS, use_rel_pos=True, rel_pos_img_size=img_size,
                   pos_antialias=False)
    return backbone, SimpleFeaturePyramid(backbone.embed_dims, 256, num_outs=5)


def compare(arch_name: str, sizes: list[tuple[int, int]], img_size: int, window: int,
            seed: int, noise: float = .05, dtype: torch.dtype = torch.float32) -> list[dict]:
    torch.manual_seed(seed)
    reference = build_detectron2(ViT.arch_zoo[arch_name], img_size, window).eval()
    with torch.no_grad():
        for param in reference.parameters():
            param.add_(torch.randn_like(param) * noise)
    reference.to(dtype)
    state = convert_detectron2_vitdet(
        {f'backbone.{k}': v for k, v in reference.state_dict().items()})
    backbone, neck = build_ours(arch_name, img_size, window)
    for module, prefix in ((backbone, 'backbone.'), (neck, 'neck.')):
        part = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
        module.load_state_dict(part, strict=True)
        module.to(dtype).eval()
    rows = []
    for height, width in sizes:
        image = torch.randn(1, 3, height, width, dtype=dtype)
        with torch.no_grad():
            expected = reference(image)
            expected_map = reference.net(image)['last_feat']
            feature = backbone(image)
            levels = neck(feature)
        diffs = {}
        for name, level in zip(expected, levels):
            if level.shape != expected[name].shape:
                raise AssertionError(f'{name}: ours {tuple(level.shape)} vs detectron2 '
                                     f'{tuple(expected[name].shape)}')
            diffs[name] = (level - expected[name]).abs().max().item()
        scale = max(expected[name].abs().max().item() for name in expected)
        rows.append(dict(arch=arch_name, size=f'{height}x{width}', window=window, noise=noise,
                         dtype=str(dtype).removeprefix('torch.'),
                         max_abs_diff=max(diffs.values()), max_abs_output=scale, **diffs,
                         last_block=(feature[-1] - expected_map).abs().max().item(),
                         last_block_max_abs=expected_map.abs().max().item()))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--arch', default='base', choices=sorted(ViT.arch_zoo))
    parser.add_argument('--sizes', nargs='+', default=['1024x1024', '1024x640'],
                        help='input sizes HxW (multiples of 32)')
    parser.add_argument('--img-size', type=int, default=1024,
                        help="detectron2's img_size: the global blocks' relative tables")
    parser.add_argument('--window', type=int, default=14)
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--noise', type=float, default=.05,
                        help='std of the normal noise added to every tensor of the reference')
    parser.add_argument('--dtype', choices=['float32', 'float64'], default='float32')
    parser.add_argument('--tolerance', type=float, default=1e-4)
    args = parser.parse_args()
    try:
        import detectron2  # noqa: F401
    except ImportError as error:
        raise SystemExit(f'detectron2 is not importable ({error}): put a checkout on '
                         f'PYTHONPATH') from error
    sizes = [tuple(int(v) for v in size.split('x')) for size in args.sizes]
    rows = compare(args.arch, sizes, args.img_size, args.window, args.seed, args.noise,
                   getattr(torch, args.dtype))
    for row in rows:
        print(json.dumps(row))
    worst = max(max(row['max_abs_diff'], row['last_block']) for row in rows)
    if worst > args.tolerance:
        raise SystemExit(f'max |difference| {worst:.3g} > tolerance {args.tolerance:g}')
    print(f'all pyramid levels and the last block within {args.tolerance:g} '
          f'(max |difference| {worst:.3g})')


if __name__ == '__main__':
    main()
