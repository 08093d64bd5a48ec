"""Time per iteration of torch's DDP and ``vitdense.CPUDistributedDataParallel`` in gloo
process groups on loopback, and whether a freshly built wrapper's first iteration reduces
the gradients of a long-running one bit for bit (what an exact resume needs).

For each process count (2 and 4 by default) the processes build a ViT-S/16 classifier twice
from one seed (22 M parameters, 224 px images, ``--batch`` images per process, one thread per
process) and wrap one copy in each wrapper. One iteration is forward, cross-entropy, backward
(the gradients' all-reduce) and an SGD step; both wrappers warm up (torch's DDP regroups its
buckets after its first iteration), then their iterations alternate in order, each started
at a barrier, and the medians are reported with their paired ratio. Then, for each wrapper,
a new one is built around a copy of the trained weights and both compute one batch's
gradients: equal bits means a run resumed there adds its gradients up as the uninterrupted
run does.

    OMP_NUM_THREADS=1 python -m benchmarks.benchmark_ddp_exactness
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import socket
import statistics
from pathlib import Path
from typing import Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from benchmarks.benchmark_lib import environment, paired_ratio, time_interleaved
from vitdense.engine import CPUDistributedDataParallel
from vitdense.models import ViT

WRAPPERS: dict[str, Callable[[nn.Module], nn.Module]] = {
    'torch DDP': DistributedDataParallel, 'CPUDistributedDataParallel': CPUDistributedDataParallel}
CLASSES = 1000


class Classifier(nn.Module):
    """ViT-S/16 with a linear head on its class token."""

    def __init__(self) -> None:
        super().__init__()
        self.backbone = ViT(arch='small', img_size=224, patch_size=16, out_type='cls_token')
        self.head = nn.Linear(384, CLASSES)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(images)[0])


def _batch(rank: int, size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1000 * seed + rank)
    return (torch.randn(size, 3, 224, 224, generator=generator),
            torch.randint(CLASSES, (size,), generator=generator))


def _gradients(wrapped: nn.Module, images: torch.Tensor, labels: torch.Tensor) -> list:
    wrapped.zero_grad(set_to_none=True)
    nn.functional.cross_entropy(wrapped(images), labels).backward()
    return [p.grad.clone() for p in wrapped.module.parameters()]


def _process(rank: int, world_size: int, port: int, args: argparse.Namespace,
             out: Path) -> None:
    """One process of the group; rank 0 writes ``out``."""
    os.environ.update(MASTER_ADDR='127.0.0.1', MASTER_PORT=str(port), GLOO_SOCKET_IFNAME='lo')
    torch.set_num_threads(1)
    dist.init_process_group('gloo', rank=rank, world_size=world_size)
    images, labels = _batch(rank, args.batch, 0)
    wrapped, steps = {}, {}
    for name, wrapper in WRAPPERS.items():
        torch.manual_seed(0)
        wrapped[name] = wrapper(Classifier())
        optimizer = torch.optim.SGD(wrapped[name].parameters(), lr=1e-3)

        def step(model: nn.Module = wrapped[name], optimizer=optimizer) -> None:
            optimizer.zero_grad(set_to_none=True)
            nn.functional.cross_entropy(model(images), labels).backward()
            optimizer.step()
        steps[name] = step
    load_start = os.getloadavg()
    samples = time_interleaved(steps, warmup=args.warmup, repeats=args.pairs, min_repeat_s=0,
                               sync=dist.barrier)
    load_end = os.getloadavg()
    same_bits = {}
    check_images, check_labels = _batch(rank, args.batch, 1)
    for name, wrapper in WRAPPERS.items():
        trained = _gradients(wrapped[name], check_images, check_labels)
        fresh = wrapper(copy.deepcopy(wrapped[name].module))
        first = _gradients(fresh, check_images, check_labels)
        same_bits[name] = all(torch.equal(a, b) for a, b in zip(trained, first))
        del fresh, wrapped[name]
    if rank == 0:
        ours, plain = samples['CPUDistributedDataParallel'], samples['torch DDP']
        result = dict(
            processes=world_size, batch_per_process=args.batch, load_average_start=load_start,
            load_average_end=load_end, seconds=samples,
            median_s={name: statistics.median(times) for name, times in samples.items()},
            paired_ratio=paired_ratio(ours, plain),
            first_iteration_same_bits=same_bits)
        out.write_text(json.dumps(result, indent=1))
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        return sock.getsockname()[1]


def measure(world_size: int, args: argparse.Namespace) -> dict:
    """The measurement in ``world_size`` processes."""
    out = args.out.with_suffix(f'.{world_size}.json')
    mp.start_processes(_process, args=(world_size, _free_port(), args, out),
                       nprocs=world_size, start_method='spawn')
    return json.loads(out.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--processes', type=int, nargs='+', default=[2, 4])
    parser.add_argument('--batch', type=int, default=1, help='images per process')
    parser.add_argument('--pairs', type=int, default=20, help='timed iterations per wrapper')
    parser.add_argument('--warmup', type=int, default=2)
    parser.add_argument('--out', type=Path, default=Path('benchmarks/results/ddp_exactness.json'))
    args = parser.parse_args()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    results = [measure(world_size, args) for world_size in args.processes]
    args.out.write_text(json.dumps(dict(environment=environment('cpu', 1), results=results),
                                   indent=1))
    print('| processes | torch DDP s/iter | CPUDistributedDataParallel s/iter | paired ratio '
          '| fresh wrapper = trained one, bit for bit (torch / ours) | load average |')
    print('|---|---|---|---|---|---|')
    for result in results:
        median, same = result['median_s'], result['first_iteration_same_bits']
        load = f'{result["load_average_start"][0]:.1f} -> {result["load_average_end"][0]:.1f}'
        print(f'| {result["processes"]} | {median["torch DDP"]:.3f} | '
              f'{median["CPUDistributedDataParallel"]:.3f} | {result["paired_ratio"]:.3f} | '
              f'{same["torch DDP"]} / {same["CPUDistributedDataParallel"]} | {load} |')


if __name__ == '__main__':
    main()
