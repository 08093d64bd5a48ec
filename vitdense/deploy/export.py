"""Export a module with torch's own exporter, to ONNX or a ``torch.export`` program, and run
the file again: what ``tools/deployment/export.py`` and the parity tests share.

Height and width are exported as dynamic dimensions (``Dim.DYNAMIC``): torch.export keeps
them symbolic unless the model branches on them, in which case it raises instead of
specialising the graph to the example's size.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
import torch.nn as nn

FORMATS = ('onnx', 'torch-export')
SUFFIXES = {'onnx': '.onnx', 'torch-export': '.pt2'}
#: smallest side a dynamic graph is traced for: the pyramid's stride-32 level then has at
#: least two rows and columns (torch.export treats sizes 0 and 1 apart)
MIN_SIDE = 64


def dynamic_image_shapes(batch_dynamic: bool = False) -> tuple[dict, ...]:
    """``dynamic_shapes`` for a module taking one image batch (B, C, H, W): H and W free
    from :data:`MIN_SIDE` pixels, B free too when ``batch_dynamic``."""
    side = torch.export.Dim.DYNAMIC(min=MIN_SIDE)
    dims = {2: side, 3: side}
    if batch_dynamic:
        dims[0] = torch.export.Dim.DYNAMIC(min=1)
    return (dims,)


def export_module(module: nn.Module, example: torch.Tensor, out: str | os.PathLike,
                  fmt: str = 'onnx', dynamic: bool = True, batch_dynamic: bool = False,
                  overwrite: bool = False) -> Path:
    """Export ``module`` (in eval mode) traced on ``example`` to ``out``.

    The file is written next to ``out`` under a temporary name and moved into place, so a
    failed export leaves nothing behind; an existing ``out`` is an error unless
    ``overwrite``.
    """
    if fmt not in FORMATS:
        raise ValueError(f'unknown export format {fmt!r}; expected one of {FORMATS}')
    out = Path(out)
    if out.exists() and not overwrite:
        raise FileExistsError(f'{out} exists; choose another --out or allow overwriting')
    out.parent.mkdir(parents=True, exist_ok=True)
    module = module.eval()
    shapes = dynamic_image_shapes(batch_dynamic) if dynamic else None
    fd, tmp = tempfile.mkstemp(suffix=out.suffix, dir=out.parent, prefix=f'.{out.name}.')
    os.close(fd)
    try:
        with torch.no_grad():
            # traced here rather than by torch.onnx.export, whose own tracing treats sizes
            # 0 and 1 alike ("backed size oblivious") and then finds the pyramid's size
            # arithmetic inconsistent
            program = torch.export.export(module, (example,), dynamic_shapes=shapes,
                                          strict=False)
            if dynamic:
                _check_any_size(program, example)
            if fmt == 'onnx':
                torch.onnx.export(program, (example,), dynamo=True,
                                  verbose=False).save(tmp, external_data=False)
            else:
                torch.export.save(program, tmp)
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out


def _check_any_size(program: torch.export.ExportedProgram, example: torch.Tensor) -> None:
    """Run the program at another size: a layer that turned a size into a Python number
    leaves a guard that fails there. ONNX drops such guards and would compute with the
    traced size, so this is an error, not a warning."""
    other = example.new_zeros(*example.shape[:2], example.shape[2] + 19, example.shape[3] + 37)
    try:
        program.module()(other)
    except AssertionError as error:
        raise ValueError(f'the exported graph holds for the traced size only ({error}); a '
                         f'layer computes a size in Python: replace it for export') from error


class ExportedModel:
    """An exported file as a callable: tensors in, a tuple of tensors out.

    ``.onnx`` files run in onnxruntime (CPU), ``.pt2`` files as the exported program's
    module in PyTorch.
    """

    def __init__(self, path: str | os.PathLike, threads: int | None = None) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f'no exported model at {self.path}')
        if self.path.suffix == '.onnx':
            try:
                import onnxruntime
            except ImportError as error:
                raise ImportError('running an ONNX file needs onnxruntime: '
                                  'bash tools/install.sh --deploy') from error
            options = onnxruntime.SessionOptions()
            # idle threads sleep instead of spinning, which would take the cores from
            # whatever runs next (PyTorch, in a comparison)
            options.add_session_config_entry('session.intra_op.allow_spinning', '0')
            if threads:
                options.intra_op_num_threads = threads
            self.session = onnxruntime.InferenceSession(
                str(self.path), options, providers=['CPUExecutionProvider'])
            self.program = None
        elif self.path.suffix == '.pt2':
            self.session = None
            self.program = torch.export.load(str(self.path)).module()
        else:
            raise ValueError(f'{self.path}: expected a .onnx or .pt2 file')

    def __call__(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if self.program is not None:
            with torch.no_grad():
                outs = self.program(*inputs)
            return tuple(outs) if isinstance(outs, (tuple, list)) else (outs,)
        feeds = {arg.name: tensor.detach().cpu().numpy()
                 for arg, tensor in zip(self.session.get_inputs(), inputs)}
        return tuple(torch.from_numpy(np.asarray(out)) for out in self.session.run(None, feeds))


def max_abs_differences(expected: Sequence[torch.Tensor],
                        actual: Sequence[torch.Tensor]) -> list[float]:
    """Largest absolute difference of each floating output pair; shapes must agree."""
    if len(expected) != len(actual):
        raise ValueError(f'{len(expected)} outputs expected, got {len(actual)}')
    diffs = []
    for index, (ref, out) in enumerate(zip(expected, actual)):
        if tuple(ref.shape) != tuple(out.shape):
            raise ValueError(f'output {index}: shape {tuple(out.shape)}, expected '
                             f'{tuple(ref.shape)}')
        diffs.append(float((ref.double() - out.double()).abs().max()) if ref.numel() else 0.)
    return diffs
