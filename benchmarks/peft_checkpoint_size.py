"""What a training checkpoint of a recipe holds with and without LoRA, counted from the model.

Full fine-tuning's checkpoint holds the model's state dict (parameters and persistent
buffers) and AdamW's two moments of every parameter; a LoRA run's
(``vitdense.PeftCheckpointHook``) the state dict without the frozen tensors that the base
supplies (``frozen_keys``) and the moments of the parameters that train. The models are
built on the meta device (no memory, no weights), so L-size recipes count in seconds; the
loop state, the message hub and the metadata (a few kB) are left out of both.

    python -m benchmarks.peft_checkpoint_size                 # LoRA r=16 on qkv/proj/fc1/fc2
    python -m benchmarks.peft_checkpoint_size --rank 8 --recipes upernet-vitdet-L
"""
from __future__ import annotations

import argparse
from pathlib import Path

from mmengine.config import Config
from torch import nn

import vitdense  # noqa: F401  (vitdense registries)
from vitdense.engine.hooks.peft_checkpoint import frozen_keys, peft_backbones
from vitdense.model_factory import build_model
from vitdense.models.backbones.peft_tuning import ADAPTER_KEY

ROOT = Path(__file__).resolve().parents[1]
#: ViTDet's ViT-L setting: 14×14 windows in all blocks but 5, 11, 17, 23
VITDET_L = dict(arch='large', window_block_indexes=tuple(
    i for i in range(24) if i % 6 != 5))
#: recipe name -> (shipped config, changes making it the L-size recipe); the first is the
#: full fine-tuning recipe beside the shipped DINOv3-L LoRA recipe, at its rank-16 LoRA
RECIPES = {
    'mask-rcnn-vitdet-dinov3-L': (
        'configs/vit/mask-rcnn_vit-l-p16-dinov3_vitdet_16xb4-lsj-100e_coco-1024x1024.py', {}),
    'mask-rcnn-vitdet-L': ('configs/vit/mask-rcnn_vit-b-p16_vitdet_16xb4-lsj-100e_coco-1024x1024.py',
                           dict(backbone=VITDET_L, neck=dict(in_channels=1024))),
    'upernet-vitdet-L': ('configs/vit/upernet_vit-b-p16_vitdet_8xb2-160k_ade20k-512x512.py',
                         dict(backbone=VITDET_L, neck=dict(in_channels=1024))),
    'upernet-L': ('configs/vit/upernet_vit-b-p16_8xb2-160k_ade20k-512x512.py',
                  dict(backbone=dict(arch='large'), decode_head=dict(in_channels=[1024] * 4),
                       auxiliary_head=dict(in_channels=1024))),
    'upernet-B': ('configs/vit/upernet_vit-b-p16_8xb2-160k_ade20k-512x512.py', {}),
    'upernet-demo': ('configs/vit/upernet_vit-d6-p8_demo-ade.py', {}),
}
ADAM_MOMENTS = 2  # exp_avg and exp_avg_sq, each the size of its parameter


def checkpoint_bytes(model: nn.Module) -> dict[str, int]:
    """Bytes of a training checkpoint of ``model``, by part: the adapters, the rest of its
    ``backbone``, the rest of the model (neck, heads), the optimizer state. Tensors that
    :class:`~vitdense.engine.hooks.peft_checkpoint.PeftCheckpointHook` leaves out of a run
    of a peft backbone (its base's frozen tensors) do not count."""
    left_out = {prefix + key for prefix, backbone, _ in peft_backbones(model)
                for key in frozen_keys(backbone)}
    parts = dict(adapters=0, backbone=0, rest=0, optimizer=0)
    for key, tensor in model.state_dict(keep_vars=True).items():
        if key in left_out:
            continue
        size = tensor.numel() * tensor.element_size()
        part = ('adapters' if ADAPTER_KEY.search(key) else
                'backbone' if key.startswith('backbone.') else 'rest')
        parts[part] += size
        if isinstance(tensor, nn.Parameter) and tensor.requires_grad:
            parts['optimizer'] += ADAM_MOMENTS * size
    return parts


def recipe_config(name: str, peft: dict | None) -> Config:
    """The L-size (or shipped) config of recipe ``name`` with ``peft`` on its backbone."""
    path, changes = RECIPES[name]
    cfg = Config.fromfile(str(ROOT / path))
    cfg.merge_from_dict(dict(model=changes))
    cfg.model.backbone.peft = peft
    return cfg


def measure(name: str, peft: dict) -> dict:
    """Parameters and checkpoint bytes of recipe ``name``, fully fine-tuned and with ``peft``."""
    row = dict(recipe=name)
    for mode, option in (('full', None), ('peft', peft)):
        model = build_model(recipe_config(name, option), 'count', device='meta')
        params = list(model.parameters())
        row[mode] = dict(params=sum(p.numel() for p in params),
                         trainable=sum(p.numel() for p in params if p.requires_grad),
                         **checkpoint_bytes(model))
    return row


def table(rows: list[dict]) -> str:
    """Markdown: one row per recipe."""
    lines = ['| recipe | params | trained with LoRA | full checkpoint MB | LoRA checkpoint MB | '
             'LoRA / full | LoRA ckpt: adapters / other backbone / neck + heads / optimizer MB |',
             '|---|---|---|---|---|---|---|']
    for row in rows:
        full, peft = (sum(v for k, v in row[m].items() if k not in ('params', 'trainable'))
                      for m in ('full', 'peft'))
        parts = ' / '.join(f"{row['peft'][k] / 1e6:.1f}"
                           for k in ('adapters', 'backbone', 'rest', 'optimizer'))
        lines.append(f"| {row['recipe']} | {row['full']['params'] / 1e6:.1f}M | "
                     f"{row['peft']['trainable'] / 1e6:.2f}M | {full / 1e6:.1f} | "
                     f"{peft / 1e6:.1f} | {peft / full:.1%} | {parts} |")
    return '\n'.join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--recipes', nargs='+', choices=sorted(RECIPES), default=list(RECIPES))
    parser.add_argument('--rank', type=int, default=16)
    parser.add_argument('--targets', nargs='+', default=['qkv', 'proj', 'fc1', 'fc2'])
    args = parser.parse_args()
    peft = dict(type='LoRA', r=args.rank, alpha=2 * args.rank, targets=tuple(args.targets))
    print(table([measure(name, peft) for name in args.recipes]))


if __name__ == '__main__':
    main()
