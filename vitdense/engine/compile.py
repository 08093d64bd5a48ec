"""``torch.compile`` for the models of the three host libraries, part by part.

A detector, segmentor or classifier is compiled where its work is tensor arithmetic of a
steady shape: the backbone, the neck and the heads' ``forward`` (:data:`COMPILED_PARTS`).
Everything between them stays eager: the data preprocessor, anchor / proposal / RoI
sampling, target assignment and loss assembly, whose Python logic and data-dependent sizes
would break a graph at every step. mmengine's own ``cfg.compile`` compiles the whole
``train_step`` (optimizer step included) and only for training; :class:`CompileHook` serves
training, validation and testing alike and is chosen by the config like any hook.

Each part's ``forward`` is replaced in place by its compiled version
(:class:`CompiledForward`), so the module tree, the state dict keys and checkpoints stay as
they are, and calls through ``module(x)`` or ``module.forward(x)`` (mmseg's heads call the
latter, which ``nn.Module.compile`` would leave eager) both run compiled. A deep copy of a
compiled model (an EMA model, a teacher, a model soup) compiles its own forward: it runs its
own weights, as after ``nn.Module.compile``. Input sizes vary in
multi-scale training: with ``dynamic=None`` (torch's automatic dynamic shapes) the first
size compiles a static graph and the second a graph with symbolic sizes that serves every
later size. Every compile goes through :func:`compile_function`, which gives inductor the
settings (:data:`INDUCTOR_OPTIONS`) without which torch 2.14 fails on symbolic sizes, and
the vector width of the CPU code it generates (:func:`vector_width_option`).
"""
from __future__ import annotations

import argparse
import copy
import warnings
from typing import Any, Callable, Optional

import torch
from mmengine.config import Config
from mmengine.hooks import Hook
from mmengine.logging import print_log
from mmengine.model import is_model_wrapper
from torch import nn

from vitdense.registry import HOOKS

#: dotted paths of the submodules compiled when the model has them: mmdet (backbone, neck,
#: RPN, RoI box and mask heads), mmseg (decode and auxiliary heads), mmpretrain (head)
COMPILED_PARTS = ('backbone', 'neck', 'rpn_head', 'roi_head.bbox_head', 'roi_head.mask_head',
                  'decode_head', 'auxiliary_head', 'head')
#: the ``torch.compile`` backend of ``--compile`` without a value
DEFAULT_BACKEND = 'inductor'
#: inductor settings of every compile made here, each working around a failure of torch
#: 2.14's inductor once sizes turn symbolic (multi-scale training from its second input size):
#: ``strict_output_strides``: views that a graph outputs (activations kept for backward among
#: them) get eager's exact strides; ordering them instead needs the token count to be at
#: least one, which inductor cannot tell for a count derived from padded image sizes, and
#: CaiT, XCiT and ConViT fail to compile ("cannot determine truth value of Relational").
#: ``layout_optimization=False``: no channels-last copies of conv inputs; with them, the
#: backward graph of every family checks the image's strides against an earlier size and
#: fails from the third size on ("expected size 2==2, stride ...").
INDUCTOR_OPTIONS = {'strict_output_strides': True, 'layout_optimization': False}


def compile_function(function: Callable, backend: str = DEFAULT_BACKEND,
                     mode: Optional[str] = None, dynamic: Optional[bool] = None) -> Callable:
    """``torch.compile(function, backend=backend, mode=mode, dynamic=dynamic)``, with
    :data:`INDUCTOR_OPTIONS` where the backend is inductor (``mode`` then given as the
    options it stands for: torch takes a mode or options, not both)."""
    if backend != 'inductor':
        return torch.compile(function, backend=backend, mode=mode, dynamic=dynamic)
    from torch._inductor import config, list_mode_options
    missing = sorted(key for key in INDUCTOR_OPTIONS if not hasattr(config, key))
    if missing:
        warnings.warn(f'torch {torch.__version__} has no inductor option {", ".join(missing)}: '
                      f'compiling without it; if compiling then fails at symbolic sizes, use '
                      f'the torch of requirements/constraints.txt', RuntimeWarning)
    options = {**list_mode_options(mode or 'default', dynamic),
               **{key: value for key, value in INDUCTOR_OPTIONS.items() if key not in missing},
               **vector_width_option()}
    return torch.compile(function, backend=backend, dynamic=dynamic, options=options)


def vector_width_option() -> dict[str, int]:
    """Inductor's ``cpp.simdlen`` set to the width of the vector ISA it picks now, unless set.

    Inductor picks the CPU's widest vector ISA, or the one ``ATEN_CPU_CAPABILITY`` forces, but
    torch 2.14's compile cache does not key on it: code generated for AVX-512 and cached is
    then built for AVX2 (a forced level, or a cache directory shared by machines of two CPU
    generations) and computes wrong values (softmax 2.0 off; NaN in CaiT's and ConViT's
    backward), or fails to build at ``default``. The width, stated, is part of the key and
    picks the same ISA (the first of that width, as the automatic choice)."""
    from torch._inductor import config
    from torch._inductor.cpu_vec_isa import pick_vec_isa
    if config.cpp.simdlen is not None:
        return {}
    return {'cpp.simdlen': pick_vec_isa().bit_width()}


class CompiledForward:
    """A module's ``forward`` compiled by :func:`compile_function`, set as the module's
    ``forward`` attribute. ``copy.deepcopy`` of the module gives the copy a compiled forward
    of its own (compiled on its first call), where a compiled bound method would keep
    running the original's weights."""

    def __init__(self, module: nn.Module, **options: Any) -> None:
        self.module = module
        self.options = options
        self.compiled = compile_function(type(module).forward.__get__(module), **options)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.compiled(*args, **kwargs)

    def __deepcopy__(self, memo: dict) -> 'CompiledForward':
        return CompiledForward(copy.deepcopy(self.module, memo), **self.options)


def _submodule(model: nn.Module, path: str) -> Optional[nn.Module]:
    for name in path.split('.'):
        model = getattr(model, name, None)
        if not isinstance(model, nn.Module):
            return None
    return model


def compile_model(model: nn.Module, backend: str = DEFAULT_BACKEND, mode: Optional[str] = None,
                  dynamic: Optional[bool] = None,
                  parts: tuple[str, ...] = COMPILED_PARTS) -> list[str]:
    """Compile the ``forward`` of each of ``parts`` that ``model`` (or the model inside a
    wrapper such as DDP) has, in place; returns the compiled paths. A list of heads
    (mmseg's auxiliary heads) is compiled head by head; a part compiled before is left
    as it is, so calling this twice compiles nothing more."""
    if is_model_wrapper(model):
        model = model.module
    compiled = []
    for path in parts:
        part = _submodule(model, path)
        if part is None:
            continue
        members = ([(f'{path}.{i}', m) for i, m in enumerate(part)]
                   if isinstance(part, nn.ModuleList) else [(path, part)])
        for name, module in members:
            if isinstance(vars(module).get('forward'), CompiledForward):
                continue
            module.forward = CompiledForward(module, backend=backend, mode=mode,
                                             dynamic=dynamic)
            compiled.append(name)
    return compiled


@HOOKS.register_module()
class CompileHook(Hook):
    """Compile the runner's model (:func:`compile_model`) before training, validation or
    testing runs.

    It runs after the other hooks' ``before_run`` (lowest priority): a copy made there, such
    as an EMA hook's averaged model, stays eager. A copy made later compiles its own forward
    (:class:`CompiledForward`).

    Args:
        backend: ``torch.compile`` backend: 'inductor' (generated kernels), 'aot_eager'
            (traced and run by eager kernels: no compiler needed, for checking graphs).
        mode: ``torch.compile`` mode, e.g. 'max-autotune-no-cudagraphs'; None: default.
        dynamic: ``torch.compile``'s ``dynamic``; None: static first, symbolic sizes
            from the first change of input size on.
    """

    priority = 'LOWEST'

    def __init__(self, backend: str = DEFAULT_BACKEND, mode: Optional[str] = None,
                 dynamic: Optional[bool] = None) -> None:
        self.options = dict(backend=backend, mode=mode, dynamic=dynamic)

    def before_run(self, runner) -> None:
        compiled = compile_model(runner.model, **self.options)
        if compiled:
            print_log(f'torch.compile ({self.options["backend"]}): {", ".join(compiled)}; '
                      f'the first iterations (and the first of each new input size) compile',
                      logger='current')


def add_compile_argument(parser: argparse.ArgumentParser) -> None:
    """``--compile [BACKEND]``, the same in every tool."""
    parser.add_argument('--compile', nargs='?', const=DEFAULT_BACKEND, metavar='BACKEND',
                        help='torch.compile the backbone, neck and heads (backend: default '
                             f'{DEFAULT_BACKEND}; aot_eager needs no C++ compiler)')


def add_compile_hook(cfg: Config, backend: str) -> None:
    """Have the runner of ``cfg`` compile its model with ``backend`` (:class:`CompileHook`);
    a hook the config has already keeps its other options."""
    hooks = list(cfg.get('custom_hooks') or [])
    present = [hook for hook in hooks if str(hook.get('type')).split('.')[-1] == 'CompileHook']
    if not present:
        present = [dict(type='vitdense.CompileHook')]
        hooks += present
    present[0]['backend'] = backend
    cfg.custom_hooks = hooks
