"""Sharded training (``vitdense.ShardedRunner`` + ``vitdense.FullyShardedModel``) against DDP
on the same tiny ViT, data and seed, in 2 gloo processes on loopback.

For AdamW and LAMB (mmpretrain's ``Lamb`` under DDP, ``vitdense.ShardedLamb`` sharded), both
with gradient clipping (``clip_grad.max_norm``, below the first iterations' norms), it
trains ``--iters`` iterations each way and reports the largest relative difference of the
losses and the largest weight difference at the end. Then a sharded run resumes from the
sharded AdamW run's checkpoint of the middle iteration, in a new work dir, and must repeat
the rest of that run exactly (losses and final weights, max difference 0); the sharded
checkpoint must hold the keys and full shapes of the DDP one.

With ``--lora`` the ViT's backbone gets rank-4 LoRA adapters (``peft``: frozen base weights
and trained adapters in each sharded block) and AdamW trains it both ways: the losses and
weights are compared as above, and the frozen tensors must end as they started while every
adapter tensor moves.

    python -m benchmarks.fsdp_parity --iters 10 --out work_dirs/fsdp_parity
    python -m benchmarks.fsdp_parity --lora --iters 10 --out work_dirs/fsdp_parity_lora
"""
from __future__ import annotations

import argparse
import json
import os
import socket
from pathlib import Path
from typing import Any, Optional

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from mmengine.hooks import Hook
from mmengine.model import BaseModel
from mmengine.runner import Runner
from torch import nn
from torch.utils.data import Dataset

import vitdense  # noqa: F401  (vitdense registries)
from vitdense.checkpoint_io import safe_load
from vitdense.engine import ShardedRunner
from vitdense.registry import MODELS

WORLD_SIZE = 2
MAX_GRAD_NORM = 0.5
ADAMW = dict(type='AdamW', lr=1e-3, weight_decay=0.05)
LAMB = dict(lr=4e-3, weight_decay=0.02)  # the A2 recipe's optimizer, at a tiny model's lr
LORA = dict(type='LoRA', r=4, alpha=8)  # on every block's qkv, proj, fc1 and fc2


class TinyViTRegressor(BaseModel):
    """A 4-block ViT of 32 channels on 16-px images, its class token regressed to 3 targets;
    with ``peft`` (the backbone's option) its trunk is frozen and adapters train."""

    def __init__(self, peft: Optional[dict] = None) -> None:
        super().__init__()
        self.backbone = MODELS.build(dict(
            type='vitdense.ViT', arch=dict(embed_dims=32, num_layers=4, num_heads=2),
            img_size=16, patch_size=4, out_type='cls_token', peft=peft))
        self.head = nn.Linear(32, 3)

    def forward(self, inputs: torch.Tensor, targets: Optional[torch.Tensor] = None,
                mode: str = 'loss') -> Any:
        out = self.head(self.backbone(inputs)[0])
        return dict(loss=((out - targets) ** 2).mean()) if mode == 'loss' else list(out)


class RandomImages(Dataset):
    """64 seeded random images and targets."""

    def __len__(self) -> int:
        return 64

    def __getitem__(self, index: int) -> dict:
        generator = torch.Generator().manual_seed(index)
        return dict(inputs=torch.randn(3, 16, 16, generator=generator),
                    targets=torch.randn(3, generator=generator))


class Record(Hook):
    """The weights training starts from (full tensors), each iteration's loss and gradient
    norm (before clipping)."""

    priority = 'LOWEST'

    def __init__(self) -> None:
        self.initial: dict[str, torch.Tensor] = {}
        self.losses: dict[int, float] = {}
        self.grad_norms: dict[int, float] = {}

    def before_train(self, runner) -> None:
        self.initial = _weights(runner)

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        self.losses[runner.iter + 1] = outputs['loss'].item()
        self.grad_norms[runner.iter + 1] = runner.message_hub.get_scalar(
            'train/grad_norm').current()


def train(work_dir: Path, sharded: bool, optimizer: dict, iters: int,
          resume_from: Optional[Path] = None,
          peft: Optional[dict] = None) -> tuple[Record, dict]:
    """``iters`` iterations (checkpoints every ``iters // 2``) in the process group, with
    ``peft`` on the backbone if given; the losses and the final weights (full tensors)."""
    record = Record()
    torch.manual_seed(0)
    wrapper = (dict(type='vitdense.FullyShardedModel') if sharded
               else dict(type='MMDistributedDataParallel', device_ids=None))
    runner = (ShardedRunner if sharded else Runner)(
        model=TinyViTRegressor(peft), work_dir=str(work_dir), launcher='pytorch',
        train_dataloader=dict(dataset=RandomImages(), batch_size=4,
                              collate_fn=dict(type='default_collate'),
                              sampler=dict(type='InfiniteSampler', shuffle=True)),
        optim_wrapper=dict(optimizer=optimizer, clip_grad=dict(max_norm=MAX_GRAD_NORM)),
        train_cfg=dict(by_epoch=False, max_iters=iters),
        default_hooks=dict(checkpoint=dict(type='vitdense.SafeCheckpointHook',
                                           by_epoch=False, interval=iters // 2)),
        custom_hooks=[dict(type='vitdense.ExactResumeHook'), record],
        resume=resume_from is not None,
        load_from=None if resume_from is None else str(resume_from),
        cfg=dict(model_wrapper_cfg=wrapper), randomness=dict(seed=0, deterministic=True),
        env_cfg=dict(dist_cfg=dict(backend='gloo')), log_level='WARNING',
        experiment_name=f'{work_dir.name}-{resume_from is not None}')
    runner.train()
    return record, _weights(runner)


def _weights(runner: Runner) -> dict[str, torch.Tensor]:
    """The model's state (full tensors: a collective under sharding), copied."""
    return {key: value.clone() for key, value in runner.model.module.state_dict().items()}


def _max_difference(first: dict, second: dict) -> float:
    return max((first[key] - second[key]).abs().max().item() for key in first)


def _relative_difference(first: dict, second: dict) -> float:
    return max(abs(first[i] - second[i]) / abs(first[i]) for i in first)


def _same_layout(first: Path, second: Path) -> bool:
    """Both checkpoints hold the same keys and shapes (model and optimizer state)."""
    shapes = []
    for path in (first, second):
        checkpoint = safe_load(str(path), map_location='cpu')
        model = {k: tuple(v.shape) for k, v in checkpoint['state_dict'].items()}
        optimizer = {(i, k): tuple(v.shape) for i, state in
                     checkpoint['optimizer']['state'].items() for k, v in state.items()}
        shapes.append((model, optimizer))
    return shapes[0] == shapes[1]


def _join(rank: int, port: int) -> None:
    """Join the gloo group of ``WORLD_SIZE`` processes on loopback as ``rank``."""
    os.environ.update(MASTER_ADDR='127.0.0.1', MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(WORLD_SIZE), LOCAL_RANK=str(rank))
    dist.init_process_group('gloo', rank=rank, world_size=WORLD_SIZE)
    torch.set_num_threads(1)  # one core per process: no thread oversubscription


def _compare(rank: int, port: int, out: Path, iters: int) -> None:
    """One process of the comparison; rank 0 writes ``results.json``."""
    _join(rank, port)
    from mmpretrain.engine.optimizers import Lamb
    results, sharded_runs = {}, {}
    runs = {'adamw': (ADAMW, ADAMW), 'lamb': (dict(LAMB, type=Lamb),
                                              dict(LAMB, type='vitdense.ShardedLamb'))}
    for name, (plain, sharded) in runs.items():
        ddp, ddp_weights = train(out / f'{name}_ddp', False, plain, iters)
        fsdp, fsdp_weights = train(out / f'{name}_fsdp', True, sharded, iters)
        sharded_runs[name] = fsdp, fsdp_weights
        results[name] = dict(
            ddp_losses=ddp.losses, fsdp_losses=fsdp.losses, grad_norms=ddp.grad_norms,
            fsdp_grad_norms=fsdp.grad_norms,
            loss_relative_difference=_relative_difference(ddp.losses, fsdp.losses),
            weight_difference=_max_difference(ddp_weights, fsdp_weights))
    middle = out / 'adamw_fsdp' / f'iter_{iters // 2}.pth'
    resumed, resumed_weights = train(out / 'adamw_fsdp_resumed', True, ADAMW, iters, middle)
    fsdp, fsdp_weights = sharded_runs['adamw']
    if rank == 0:
        results['resume'] = dict(
            losses=resumed.losses,
            loss_difference=max(abs(resumed.losses[i] - fsdp.losses[i])
                                for i in resumed.losses),
            weight_difference=_max_difference(fsdp_weights, resumed_weights))
        results['same_checkpoint_layout'] = _same_layout(
            out / 'adamw_ddp' / f'iter_{iters // 2}.pth', middle)
        (out / 'results.json').write_text(json.dumps(results, indent=1))
    dist.destroy_process_group()


def _compare_lora(rank: int, port: int, out: Path, iters: int) -> None:
    """One process of the LoRA comparison; rank 0 writes ``lora_results.json``."""
    _join(rank, port)
    ddp, ddp_weights = train(out / 'lora_ddp', False, ADAMW, iters, peft=LORA)
    fsdp, fsdp_weights = train(out / 'lora_fsdp', True, ADAMW, iters, peft=LORA)
    trained = {name for name, param in TinyViTRegressor(LORA).named_parameters()
               if param.requires_grad}
    frozen = [key for key in fsdp_weights if key not in trained]
    adapters = [key for key in trained if '.lora_' in key]
    if rank == 0:
        (out / 'lora_results.json').write_text(json.dumps(dict(
            ddp_losses=ddp.losses, fsdp_losses=fsdp.losses,
            loss_relative_difference=_relative_difference(ddp.losses, fsdp.losses),
            weight_difference=_max_difference(ddp_weights, fsdp_weights),
            frozen=len(frozen), adapters=len(adapters),
            frozen_change=_max_difference({k: fsdp.initial[k] for k in frozen},
                                          {k: fsdp_weights[k] for k in frozen}),
            adapter_changes={k: (fsdp_weights[k] - fsdp.initial[k]).abs().max().item()
                             for k in adapters}), indent=1))
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        return sock.getsockname()[1]


def compare(out: Path, iters: int = 10) -> dict:
    """Run the comparison in ``WORLD_SIZE`` processes; its results."""
    out.mkdir(parents=True, exist_ok=True)
    mp.spawn(_compare, args=(free_port(), out, iters), nprocs=WORLD_SIZE)
    return json.loads((out / 'results.json').read_text())


def compare_lora(out: Path, iters: int = 10) -> dict:
    """Run the LoRA comparison in ``WORLD_SIZE`` processes; its results."""
    out.mkdir(parents=True, exist_ok=True)
    mp.spawn(_compare_lora, args=(free_port(), out, iters), nprocs=WORLD_SIZE)
    return json.loads((out / 'lora_results.json').read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--iters', type=int, default=10)
    parser.add_argument('--out', type=Path, default=Path('work_dirs/fsdp_parity'))
    parser.add_argument('--lora', action='store_true',
                        help='compare LoRA (peft) training sharded and under DDP instead')
    args = parser.parse_args()
    if args.lora:
        lora = compare_lora(args.out, args.iters)
        changes = lora['adapter_changes'].values()
        print(f'LoRA: {args.iters} iterations, losses relative difference '
              f'{lora["loss_relative_difference"]:.2e}, weights max difference '
              f'{lora["weight_difference"]:.2e}; {lora["frozen"]} frozen tensors changed by at '
              f'most {lora["frozen_change"]}, {lora["adapters"]} adapter tensors by '
              f'{min(changes):.1e} to {max(changes):.1e}')
        return
    results = compare(args.out, args.iters)
    for name in ('adamw', 'lamb'):
        entry = results[name]
        clipped = sum(norm > MAX_GRAD_NORM for norm in entry['grad_norms'].values())
        print(f'{name}: {args.iters} iterations ({clipped} clipped), losses relative '
              f'difference {entry["loss_relative_difference"]:.2e}, weights max difference '
              f'{entry["weight_difference"]:.2e}')
    resume = results['resume']
    print(f'resumed from iteration {args.iters // 2}: losses max difference '
          f'{resume["loss_difference"]}, weights max difference {resume["weight_difference"]}; '
          f'checkpoint layout as DDP\'s: {results["same_checkpoint_layout"]}')


if __name__ == '__main__':
    main()
