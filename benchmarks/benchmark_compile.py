"""What ``torch.compile`` costs and gives per backbone, on the machine at hand.

    python -m benchmarks.benchmark_compile [--models vit_small_patch16_224 ...] [--batch 8]
        [--size 224] [--second-size 256] [--backend inductor] [--dtype float32]
        [--out work_dirs/benchmark_compile.json]

Per model (timm names; ours, in the multi-layer pyramid layout that the dense recipes
train): the first compiled training step (forward, a scalar loss over the outputs,
backward), which is the compile time (inductor's on-disk caches off, as on a first run);
the first step at a second input size, which compiles the graph with symbolic sizes that
multi-scale training reuses; the eager and compiled steps timed interleaved; and dynamo's
graph and graph-break counts. The GPU report (``benchmarks/gpu_report.py``) measures
compiled steps on a GPU within its wider report; this script answers on any device, the
CPU included.
"""
from __future__ import annotations

import argparse
import statistics
from pathlib import Path
from typing import Optional

import torch
import torch._inductor.config

from benchmarks.benchmark_lib import (OURS, backbone_specs, environment, first_call_s,
                                      make_step, paired_ratio, synchronizer,
                                      time_interleaved, write_json)
from vitdense.engine.compile import compile_function

DEFAULT_MODELS = ('vit_small_patch16_224', 'cait_xxs24_224', 'xcit_small_12_p16_224',
                  'convit_small')
DTYPES = {'float32': None, 'bfloat16': torch.bfloat16, 'float16': torch.float16}


def build_pyramid_backbone(name: str, size: int) -> torch.nn.Module:
    """Our backbone of timm model ``name`` with the multi-layer pyramid, for ``size``²."""
    from vitdense.models import backbone_families

    spec = backbone_specs()[name]
    torch.manual_seed(0)
    return backbone_families()[spec.family](spec.arch, out_type='featmap', pyramid=True,
                                            **{**spec.options, 'img_size': size})


def measure(name: str, batch: int, size: int, second_size: int, backend: str,
            dtype: Optional[torch.dtype], device: str, repeats: int) -> dict:
    """Compile times, graph counts and the eager / compiled step of one model."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    model = build_pyramid_backbone(name, size).to(device)
    images = {s: torch.randn(batch, 3, s, s, device=device) for s in (size, second_size)}
    compiled = compile_function(model, backend)
    eager_step = make_step(model, images[size], 'train', dtype=dtype)
    compiled_step = make_step(compiled, images[size], 'train', dtype=dtype)
    record = dict(model=name, batch=batch, size=size, second_size=second_size)
    # a first compile: nothing reused from inductor's on-disk caches of earlier runs
    with torch._inductor.config.patch(force_disable_caches=True):
        record.update(compile_s=first_call_s(compiled_step, device),
                      second_size_compile_s=first_call_s(
                          make_step(compiled, images[second_size], 'train', dtype=dtype),
                          device))
    record.update(graphs=counters['stats']['unique_graphs'],
                  graph_breaks=sum(counters['graph_break'].values()))
    samples = time_interleaved({'eager': eager_step, 'compiled': compiled_step}, warmup=1,
                               repeats=repeats, sync=synchronizer(device))
    record.update(eager_s=statistics.median(samples['eager']),
                  compiled_s=statistics.median(samples['compiled']),
                  speed_up=paired_ratio(samples['eager'], samples['compiled']))
    return record


def main(argv: Optional[list[str]] = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--models', nargs='+', default=DEFAULT_MODELS, metavar='TIMM_NAME')
    parser.add_argument('--batch', type=int, default=8)
    parser.add_argument('--size', type=int, default=224)
    parser.add_argument('--second-size', type=int, default=256)
    parser.add_argument('--backend', default='inductor')
    parser.add_argument('--dtype', choices=sorted(DTYPES), default='float32',
                        help='autocast type of the steps (float32: no autocast)')
    parser.add_argument('--repeats', type=int, default=5)
    parser.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    parser.add_argument('--out', type=Path, default=Path('work_dirs/benchmark_compile.json'))
    args = parser.parse_args(argv)
    unknown = sorted(set(args.models) - set(backbone_specs()))
    if unknown:
        raise SystemExit(f'unknown models {unknown}; choose from {sorted(backbone_specs())}')
    meta = environment(args.device, torch.get_num_threads())
    meta.update(backend=args.backend, dtype=args.dtype, layout=f'{OURS} multi-layer pyramid')
    results = []
    for name in args.models:
        record = measure(name, args.batch, args.size, args.second_size, args.backend,
                         DTYPES[args.dtype], args.device, args.repeats)
        print(record, flush=True)
        results.append(record)
    write_json(args.out, meta, results)
    return results


if __name__ == '__main__':
    main()
