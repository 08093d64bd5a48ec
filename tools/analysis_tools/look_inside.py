"""The papers' analysis figures for any vitdense backbone: a PNG and the numbers as JSON.

    python tools/analysis_tools/look_inside.py ANALYSIS (--config CFG | --timm NAME)
        [--checkpoint CKPT] [--image FILE_OR_FOLDER] [--out-dir DIR]

ANALYSIS is one of
  class-attention      CaiT / XCiT: the class token's attention over the patches, per head and
                       mean, overlaid on the image (CaiT Fig. 5, XCiT Fig. 4)
  attention            trunk attention of one query (the class token by default) per block
                       and head (ViT / CaiT / ConViT)
  rollout              attention rollout of the class token (Abnar & Zuidema, 2020); with a
                       class-attention stage, its mean map carried through the trunk
  attention-distance   mean attention distance per head against depth (ViT Fig. 7 right)
  position-similarity  cosine similarity of the position encodings (ViT Fig. 7 centre)
  patch-filters        principal components of the patch-embedding filters (ViT Fig. 7 left)
  convit               σ(λ) per GPSA layer and head, and the nonlocality per layer (ConViT
                       Figs. 5-6)
  features             the dense pyramid's levels projected to RGB by PCA

The backbone is ``model.backbone`` of a vitdense config, or the arch matching a timm model
name; weights come from --checkpoint (ours, timm or official), or for --timm without one
from timm's random initialisation. Images are resized to the pretraining size unless
--img-size says otherwise; a folder gives one picture per image and numbers over all.
"""
from __future__ import annotations

import argparse
import json
import os
import os.path as osp
from typing import Callable, Optional

import matplotlib.pyplot as plt
import numpy as np
import torch
from PIL import Image

import vitdense  # noqa: F401  (registers the backbones)
from vitdense.analysis import (attention_rollout, build_backbone, class_attention_maps,
                               filter_components, gating_strengths, image_to_tensor,
                               mean_attention_distance, nonlocality, patch_embedding_filters,
                               pca_rgb, position_encodings, position_similarity,
                               query_attention_maps, record_attention, upsample_maps)
from vitdense.analysis.loading import IMAGE_SUFFIXES


def read_images(path: Optional[str]) -> list[tuple[str, np.ndarray]]:
    """(name, RGB uint8 array) of an image file or of every image in a folder."""
    if path is None:
        raise SystemExit('this analysis needs --image FILE_OR_FOLDER')
    if osp.isdir(path):
        files = sorted(osp.join(path, f) for f in os.listdir(path)
                       if f.lower().endswith(IMAGE_SUFFIXES))
        if not files:
            raise SystemExit(f'no images ({", ".join(IMAGE_SUFFIXES)}) in folder {path}')
    elif osp.isfile(path):
        files = [path]
    else:
        raise SystemExit(f'image not found: {path}')
    return [(osp.splitext(osp.basename(f))[0], np.asarray(Image.open(f).convert('RGB')))
            for f in files]


def model_input(model, image: np.ndarray, img_size: Optional[list[int]]) -> tuple:
    """The network input and the image as shown (both at the analysed size)."""
    if img_size:
        size = (img_size[0], img_size[-1])
    else:
        size = tuple(g * model.patch_size for g in model.pretrain_grid)
    shown = np.asarray(Image.fromarray(image).resize(size[::-1], Image.BICUBIC))
    return image_to_tensor(image, size), shown


def as_list(tensor: torch.Tensor, digits: int = 5):
    return np.round(tensor.detach().cpu().double().numpy(), digits).tolist()


def overlay(axis, image: np.ndarray, heat: Optional[torch.Tensor], title: str) -> None:
    axis.imshow(image)
    if heat is not None:
        axis.imshow(heat.numpy(), cmap='inferno', alpha=0.6)
    axis.set_title(title, fontsize=7)
    axis.axis('off')


def grid_figure(rows: int, cols: int, size: float = 1.4):
    fig, axes = plt.subplots(rows, cols, figsize=(cols * size, rows * size + 0.4),
                             squeeze=False)
    for axis in axes.flat:
        axis.axis('off')
    return fig, axes


# ---------------------------------------------------------------------- analyses
def class_attention(model, args) -> dict:
    if model.cls_blocks is None:
        raise SystemExit(f'{type(model).__name__} has no class-attention stage '
                         f'(CaiT and XCiT do); try `attention` or `rollout`')
    results = {}
    for name, image in read_images(args.image):
        x, shown = model_input(model, image, args.img_size)
        record = record_attention(model, x)
        weights = record.class_attention[args.cls_block]
        maps = class_attention_maps(weights, record.grid)[0]
        heads = maps.shape[0]
        up = upsample_maps(torch.cat([maps.mean(0, keepdim=True), maps]), shown.shape[:2])
        fig, axes = grid_figure(1, heads + 2)
        overlay(axes[0, 0], shown, None, name)
        overlay(axes[0, 1], shown, up[0], 'mean of heads')
        for head in range(heads):
            overlay(axes[0, head + 2], shown, up[head + 1], f'head {head}')
        save_figure(fig, args, name)
        results[name] = dict(grid=record.grid, class_token_self_weight=as_list(weights[0, :, 0]),
                             maps=as_list(maps))
    return dict(block=args.cls_block, images=results)


def _query_index(record, block: int, query: Optional[str]) -> int:
    prefix = record.num_prefix_tokens(block)
    if query in (None, 'cls'):
        if prefix:
            return 0
        rows, cols = record.grid  # no class token at this block: the central patch
        return rows // 2 * cols + cols // 2
    if ',' in query:
        row, col = (int(v) for v in query.split(','))
        return prefix + row * record.grid[1] + col
    return int(query)


def attention(model, args) -> dict:
    results = {}
    for name, image in read_images(args.image):
        x, shown = model_input(model, image, args.img_size)
        record = record_attention(model, x)
        if not record.trunk:
            raise SystemExit(f'{type(model).__name__} has no token attention in its trunk '
                             f'(XCiT attends over channels); try `class-attention`')
        blocks = args.blocks or sorted(record.trunk)
        heads = record.trunk[blocks[0]].shape[1]
        fig, axes = grid_figure(len(blocks), heads + 1)
        per_block = {}
        for row, block in enumerate(blocks):
            query = _query_index(record, block, args.query)
            maps = query_attention_maps(record.trunk[block], record.grid, query)[0]
            up = upsample_maps(maps, shown.shape[:2])
            overlay(axes[row, 0], shown, None, f'block {block}, query {query}')
            for head in range(heads):
                overlay(axes[row, head + 1], shown, up[head], f'head {head}')
            per_block[block] = dict(query=query, maps=as_list(maps))
        save_figure(fig, args, name)
        results[name] = dict(grid=record.grid, blocks=per_block)
    return dict(images=results)


def rollout(model, args) -> dict:
    results = {}
    for name, image in read_images(args.image):
        x, shown = model_input(model, image, args.img_size)
        record = record_attention(model, x)
        num_patches = record.grid[0] * record.grid[1]
        trunk = [record.trunk[i] for i in sorted(record.trunk)]
        if record.class_attention:
            # the class token reads the last trunk tokens: carry its mean map (renormalised
            # over the patches) back through the trunk's rollout, if the trunk has one
            cls = record.class_attention[-1].mean(1)[:, 1:]
            flow = cls / cls.sum(-1, keepdim=True)
            if trunk:
                flow = flow @ attention_rollout(trunk)
            source = 'class attention (last block) x trunk rollout'
        elif trunk and record.num_prefix_tokens(len(trunk) - 1):
            flow = attention_rollout(trunk)[:, 0]
            source = 'trunk rollout, class token row'
        else:
            raise SystemExit(f'{type(model).__name__} has no class token to roll out')
        flow_map = flow[0, -num_patches:].reshape(record.grid)
        fig, axes = grid_figure(1, 2, 2.2)
        overlay(axes[0, 0], shown, None, name)
        overlay(axes[0, 1], shown, upsample_maps(flow_map, shown.shape[:2]), 'rollout')
        save_figure(fig, args, name)
        results[name] = dict(grid=record.grid, source=source, map=as_list(flow_map))
    return dict(images=results)


def attention_distance(model, args) -> dict:
    images = read_images(args.image)
    totals: dict[int, torch.Tensor] = {}
    for _, image in images:
        record = record_attention(model, model_input(model, image, args.img_size)[0])
        if not record.trunk:
            raise SystemExit(f'{type(model).__name__} has no token attention in its trunk')
        for block, weights in record.trunk.items():
            distance = mean_attention_distance(weights, record.grid, model.patch_size)
            totals[block] = totals.get(block, 0) + distance / len(images)
    fig, axis = plt.subplots(figsize=(4, 3))
    for block, distance in totals.items():
        axis.scatter([block] * len(distance), distance.numpy(), s=10, color='tab:blue')
    side = max(record.grid) * model.patch_size
    axis.set(xlabel='block', ylabel='mean attention distance (pixels)', ylim=(0, side),
             title=f'{args.label}: {len(images)} image(s), {side}px side')
    save_figure(fig, args)
    return dict(unit='pixels', num_images=len(images),
                per_block={block: as_list(d, 3) for block, d in totals.items()})


def position_similarity_grid(model, args) -> dict:
    hw = None
    if args.img_size:
        hw = (args.img_size[0] // model.patch_size, args.img_size[-1] // model.patch_size)
    vectors, hw = position_encodings(model, hw)
    similarity = position_similarity(vectors, hw)
    # one mosaic of rows x cols tiles, a blank line between tiles
    mosaic = torch.full(((hw[0] + 1) * hw[0], (hw[1] + 1) * hw[1]), float('nan'))
    for row in range(hw[0]):
        for col in range(hw[1]):
            top, left = row * (hw[0] + 1), col * (hw[1] + 1)
            mosaic[top:top + hw[0], left:left + hw[1]] = similarity[row, col]
    fig, axis = plt.subplots(figsize=(4.5, 4))
    image = axis.imshow(mosaic.numpy(), vmin=-1, vmax=1, cmap='viridis',
                        interpolation='nearest')
    axis.axis('off')
    fig.colorbar(image, ax=axis, shrink=0.8, label='cosine similarity')
    axis.set_title(f'{args.label}: position encodings, {hw[0]}x{hw[1]} patches', fontsize=8)
    save_figure(fig, args)
    return dict(grid=hw, similarity=as_list(similarity, 4))


def patch_filters(model, args) -> dict:
    filters = patch_embedding_filters(model)
    components, explained = filter_components(filters, min(args.num_components,
                                                           min(filters.flatten(1).shape)))
    cols = min(7, len(components))
    rows = -(-len(components) // cols)
    fig, axes = grid_figure(rows, cols, 0.8)
    for index, component in enumerate(components):
        low, high = component.min(), component.max()
        tile = ((component - low) / (high - low).clamp_min(1e-12)).permute(1, 2, 0)
        axes.flat[index].imshow(tile.numpy() if tile.shape[-1] == 3 else tile[..., 0].numpy(),
                                interpolation='nearest')
        axes.flat[index].set_title(f'{explained[index] * 100:.1f}%', fontsize=6)
    fig.suptitle(f'{args.label}: patch-embedding filters {tuple(filters.shape)}', fontsize=8)
    save_figure(fig, args)
    return dict(filters_shape=list(filters.shape), explained_variance=as_list(explained),
                components=as_list(components, 4))


def convit(model, args) -> dict:
    gates = gating_strengths(model)
    layers = sorted(gates)
    stacked = torch.stack([gates[i] for i in layers])
    images = read_images(args.image) if args.image else []
    per_layer: dict[int, float] = {}
    for _, image in images:
        record = record_attention(model, model_input(model, image, args.img_size)[0])
        for block, weights in record.trunk.items():
            per_layer[block] = per_layer.get(block, 0.) + nonlocality(
                weights, record.grid) / len(images)
    fig, axes = plt.subplots(1, 2 if per_layer else 1, figsize=(8 if per_layer else 4, 3),
                             squeeze=False)
    for head in range(stacked.shape[1]):
        axes[0, 0].plot(layers, stacked[:, head].numpy(), marker='.', alpha=0.6)
    axes[0, 0].plot(layers, stacked.mean(1).numpy(), color='black', linewidth=2,
                    label='mean of heads')
    axes[0, 0].set(xlabel='GPSA block', ylabel='σ(λ) (1 = positional)', ylim=(0, 1),
                   title=f'{args.label}: gates')
    axes[0, 0].legend(fontsize=7)
    if per_layer:
        axes[0, 1].plot(list(per_layer), list(per_layer.values()), marker='o')
        axes[0, 1].set(xlabel='block', ylabel='nonlocality (patches)',
                       title=f'nonlocality, {len(images)} image(s)')
    fig.tight_layout()
    save_figure(fig, args)
    return dict(gates={i: as_list(gates[i]) for i in layers},
                nonlocality_patches={i: round(v, 5) for i, v in per_layer.items()})


def features(model, args) -> dict:
    results = {}
    for name, image in read_images(args.image):
        x, shown = model_input(model, image, args.img_size)
        with torch.no_grad():
            levels = model(x)
        fig, axes = grid_figure(1, len(levels) + 1, 2)
        overlay(axes[0, 0], shown, None, name)
        explained = []
        for index, level in enumerate(levels):
            colours, ratio = pca_rgb(level[0])
            axes[0, index + 1].imshow(colours.numpy(), interpolation='nearest')
            axes[0, index + 1].set_title(f'level {index}: {tuple(level.shape[-2:])}',
                                         fontsize=7)
            explained.append(as_list(ratio))
        save_figure(fig, args, name)
        results[name] = dict(shapes=[list(level.shape[1:]) for level in levels],
                             explained_variance_rgb=explained)
    return dict(images=results)


ANALYSES: dict[str, tuple[Callable, str]] = {
    'class-attention': (class_attention, 'cls_token'),
    'attention': (attention, 'cls_token'),
    'rollout': (rollout, 'cls_token'),
    'attention-distance': (attention_distance, 'cls_token'),
    'position-similarity': (position_similarity_grid, 'cls_token'),
    'patch-filters': (patch_filters, 'cls_token'),
    'convit': (convit, 'cls_token'),
    'features': (features, 'featmap'),
}


def save_figure(fig, args, image_name: Optional[str] = None) -> None:
    stem = args.name if image_name is None else f'{args.name}_{image_name}'
    path = osp.join(args.out_dir, f'{stem}.png')
    fig.savefig(path, dpi=args.dpi, bbox_inches='tight')
    plt.close(fig)
    print(f'wrote {path}')


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('analysis', choices=list(ANALYSES))
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument('--config', help='vitdense config; its model.backbone is analysed')
    source.add_argument('--timm', help='timm model name; our matching arch is analysed')
    parser.add_argument('--checkpoint', help='our, timm or official checkpoint')
    parser.add_argument('--image', help='image file or folder of images')
    parser.add_argument('--img-size', type=int, nargs='+', help='analyse at H [W] pixels')
    parser.add_argument('--out-dir', default='work_dirs/look_inside')
    parser.add_argument('--name', help='file stem of the outputs (default: the analysis)')
    parser.add_argument('--label', help='model name in titles (default: config or timm name)')
    parser.add_argument('--query', help="attention: 'cls', a token index or 'row,col'")
    parser.add_argument('--blocks', type=int, nargs='+', help='attention: trunk blocks')
    parser.add_argument('--cls-block', type=int, default=0,
                        help='class-attention: which class-attention block (default the '
                        'first, as in CaiT Fig. 5)')
    parser.add_argument('--num-components', type=int, default=28,
                        help='patch-filters: principal components to show')
    parser.add_argument('--dpi', type=int, default=100)
    args = parser.parse_args(argv)
    args.name = args.name or args.analysis
    args.label = args.label or args.timm or osp.splitext(osp.basename(args.config))[0]
    return args


def main(argv: Optional[list[str]] = None) -> dict:
    args = parse_args(argv)
    plt.switch_backend('agg')  # files only, no display
    analyse, out_type = ANALYSES[args.analysis]
    model = build_backbone(args.config, args.timm, args.checkpoint, out_type)
    os.makedirs(args.out_dir, exist_ok=True)
    with torch.no_grad():
        result = analyse(model, args)
    result = dict(analysis=args.analysis, model=args.label, checkpoint=args.checkpoint,
                  **result)
    path = osp.join(args.out_dir, f'{args.name}.json')
    with open(path, 'w') as f:
        json.dump(result, f)
    print(f'wrote {path}')
    return result


if __name__ == '__main__':
    main()
