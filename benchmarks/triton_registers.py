"""Registers, spills and shared memory of talking heads' Triton kernels on sm_90a, on any
machine (no GPU needed): every configuration the autotuner can choose for the given head
counts, compiled by Triton for an sm_90a target, then read back by its bundled
``ptxas -arch=sm_90a -v``; and whether a kernel's PTX holds atomics (``atom`` / ``red``).

    python -m benchmarks.triton_registers --heads 8 4   # CaiT-S24 and CaiT-XXS24 (48 wide)

One line per kernel and configuration:
``kernel heads dtype BLOCK_MxBLOCK_N stages registers=N spill_bytes=N shared_bytes=N
atomics=N`` (spill bytes: ptxas' spill stores plus loads, per thread; shared bytes: Triton's
dynamic shared memory plus ptxas' static). Compiling a large unrolled backward kernel takes
tens of seconds on a small CPU.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
from typing import Iterator, NamedTuple

import torch
import triton
from triton.backends.compiler import GPUTarget

from vitdense.models.layers import talking_heads_triton as kernels

#: Hopper (H100 / H200), the GPUs the kernels are laid out for
TARGET = GPUTarget('cuda', 90, 32)
PTXAS = os.path.join(os.path.dirname(triton.__file__), 'backends', 'nvidia', 'bin', 'ptxas')
#: Triton's names of the operand dtypes
TRITON_DTYPES = {torch.bfloat16: 'bf16', torch.float16: 'fp16', torch.float32: 'fp32'}
DTYPES = {'bfloat16': torch.bfloat16, 'float16': torch.float16, 'float32': torch.float32}
#: instructions that add into memory atomically
ATOMICS = re.compile(r'^\s*(?:@!?%p\d+\s+)?(atom|red)\.', re.MULTILINE)


class Resources(NamedTuple):
    """What one compiled kernel uses per thread (registers, spills) and per program."""
    registers: int
    spill_bytes: int
    shared_bytes: int
    atomics: int


def compile_for_sm90(kernel: triton.JITFunction, pointer_dtypes: dict[str, str],
                     constants: dict, num_warps: int, num_stages: int):
    """``kernel`` compiled by Triton for sm_90a with ``constants`` for its compile-time
    arguments, pointers of the given Triton dtypes (16-byte aligned, as torch allocates),
    32-bit integers for the rest."""
    signature, attrs = {}, {}
    for index, name in enumerate(kernel.arg_names):
        if name in constants:
            signature[name] = 'constexpr'
        elif name in pointer_dtypes:
            signature[name] = '*' + pointer_dtypes[name]
            attrs[(index,)] = [['tt.divisibility', 16]]
        else:
            signature[name] = 'i32'
    source = triton.compiler.ASTSource(fn=kernel, signature=signature,
                                       constexprs={(kernel.arg_names.index(n),): v
                                                   for n, v in constants.items()},
                                       attrs=attrs)
    return triton.compile(source, target=TARGET,
                          options=dict(num_warps=num_warps, num_stages=num_stages))


def ptxas_resources(compiled) -> Resources:
    """Registers and spills as ``ptxas -arch=sm_90a -v`` reports them for ``compiled``'s
    PTX, its shared memory, and its count of atomic instructions."""
    ptx = compiled.asm['ptx']
    result = subprocess.run([PTXAS, '-arch=sm_90a', '-v', '-', '-o', os.devnull], input=ptx,
                            capture_output=True, text=True, check=True)
    report = result.stdout + result.stderr
    registers = re.search(r'Used (\d+) registers', report)
    spills = re.search(r'(\d+) bytes spill stores, (\d+) bytes spill loads', report)
    static_shared = re.search(r'(\d+) bytes smem', report)
    if registers is None or spills is None:
        raise RuntimeError(f'ptxas -v printed no register report:\n{report}')
    return Resources(int(registers[1]), int(spills[1]) + int(spills[2]),
                     compiled.metadata.shared + int(static_shared[1] if static_shared else 0),
                     len(ATOMICS.findall(ptx)))


def choosable(heads: int, width: int, dims: int, dtype: torch.dtype
              ) -> Iterator[tuple[str, triton.Config, dict]]:
    """Every (kernel name, configuration, compile-time constants) the autotuner may choose
    for ``heads`` heads of queries ``width`` and values ``dims`` wide in ``dtype``."""
    for name, launch in kernels.launches(heads, width, dims, dtype, 1, 1, 1).items():
        for config in launch.configs:
            constants = {key: value for key, value in launch.sizes.items()
                         if key in launch.kernel.fn.arg_names and key != 'TOKENS_P2'}
            yield name, config, dict(constants, **config.kwargs)


def report(heads: int, width: int, dims: int, dtype: torch.dtype
           ) -> Iterator[tuple[str, triton.Config, Resources]]:
    """Each choosable kernel's configuration and its resources on sm_90a."""
    launches = kernels.launches(heads, width, dims, dtype, 1, 1, 1)
    for name, config, constants in choosable(heads, width, dims, dtype):
        fn = launches[name].kernel.fn
        pointers = {arg: 'fp32' if arg in kernels.FLOAT32_POINTERS else TRITON_DTYPES[dtype]
                    for arg in fn.arg_names if arg.endswith('_ptr')}
        compiled = compile_for_sm90(fn, pointers, constants, config.num_warps,
                                    config.num_stages)
        yield name, config, ptxas_resources(compiled)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--heads', type=int, nargs='+', default=[8, 4])
    parser.add_argument('--width', type=int, default=48,
                        help="the queries' and keys' width (head width plus any logit terms)")
    parser.add_argument('--dims', type=int, default=48, help="the values' width")
    parser.add_argument('--dtypes', nargs='+', choices=tuple(DTYPES),
                        default=['bfloat16', 'float32'])
    args = parser.parse_args(argv)
    for heads in args.heads:
        for dtype_name in args.dtypes:
            for name, config, used in report(heads, args.width, args.dims,
                                             DTYPES[dtype_name]):
                blocks = f"{config.kwargs['BLOCK_M']}x{config.kwargs['BLOCK_N']}"
                print(f'{name:8s} heads={heads} width={args.width} dims={args.dims} '
                      f'{dtype_name:8s} blocks={blocks} stages={config.num_stages} '
                      f'registers={used.registers} spill_bytes={used.spill_bytes} '
                      f'shared_bytes={used.shared_bytes} atomics={used.atomics}', flush=True)


if __name__ == '__main__':
    main()
