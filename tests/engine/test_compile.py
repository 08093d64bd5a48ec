"""torch.compile of the backbones and the host models (``vitdense.engine.compile``): every
family's forward and backward trace into one graph in each layout, multi-scale inputs
compile at most twice in the pyramid layout, and compiling changes neither the results nor
the module tree.

Graphs are counted by dynamo with the ``aot_eager`` backend (traced like inductor, run by
the eager kernels: no C++ compiler); one test runs inductor itself, on a graph with
symbolic sizes (the C++ compiler, about 90 s). Tracing time grows with the number of
blocks, not with the input: the models have as few blocks as their layout allows (the
pyramid takes 4 block outputs, ConViT at least one GPSA and one attention block, ViTDet's
layout one windowed and one global block), and the pyramid models are compiled once for
both tests that use them.
"""
from __future__ import annotations

import copy
import functools
import os
import shutil
import subprocess
import sys

import pytest
import torch
import torch._dynamo
from mmcv.image import rescale_size
from mmengine.config import Config
from torch import nn
from torch._dynamo.utils import counters

from vitdense.engine.compile import CompileHook, add_compile_hook, compile_model
from vitdense.models import backbone_families

ARCH = dict(embed_dims=32, num_heads=2)
ARCHS = {'cait': dict(ARCH, num_cls_layers=1), 'xcit': dict(ARCH, num_cls_layers=1),
         'convit': dict(ARCH, num_local_layers=1)}
# ViTDet's layout at toy size: 8 px patches, 4 × 4 windows in block 0, global block 1, relative
# positions everywhere; XCiT (attention linear in tokens) keeps global XCA, as its configs
WINDOWS = dict(patch_size=8, window_size=4, window_block_indexes=(0,), use_rel_pos=True,
               rel_pos_img_size=64)
LAYOUTS = {
    'cls': dict(out_type='cls_token', out_indices=(-1,), num_layers=1),
    'pyramid': dict(num_layers=4),
    'vitdet': dict(pyramid=False, out_indices=(-1,), dense_class_token=False,
                   pos_antialias=False, num_layers=2),
}
FAMILIES = sorted(backbone_families())
# 64 × 88: not a multiple of the patch, of the pyramid's 32 or of the windows
FIRST_SIZE = (64, 88)


def build(family: str, layout: str) -> nn.Module:
    options = dict(LAYOUTS[layout])
    num_layers = options.pop('num_layers')
    if family == 'convit':  # GPSA block(s), then at least one attention block
        num_layers = max(num_layers, 2)
    arch = dict(ARCHS.get(family, ARCH), num_layers=num_layers)
    if layout == 'vitdet' and family != 'xcit':
        options.update(WINDOWS)
    torch.manual_seed(0)
    return backbone_families()[family](arch=arch, img_size=64, **options).train()


def train_step(model: nn.Module, images: torch.Tensor) -> tuple[list, list]:
    """Outputs and parameter gradients of one forward + backward."""
    model.zero_grad(set_to_none=True)
    outputs = model(images)
    sum(out.square().mean() for out in outputs).backward()
    return [out.detach() for out in outputs], [p.grad for p in model.parameters()]


def compiled_backbone(model: nn.Module) -> None:
    """``model`` compiled in place as the hook compiles a host model's backbone."""
    torch._dynamo.reset()
    counters.clear()
    assert compile_model(nn.ModuleDict(dict(backbone=model)), backend='aot_eager') == \
        ['backbone']


def graphs() -> tuple[dict, int]:
    """Graph breaks and graphs compiled since :func:`compiled_backbone`."""
    return dict(counters['graph_break']), counters['stats']['unique_graphs']


def coco_multiscale_sizes() -> list[tuple[int, int]]:
    """Batch sizes of mmdet's multi-scale COCO training at a fifth of its scale: a 640 × 480
    image resized with kept ratio to short sides 96-224 (long side ≤ 266), as
    ``RandomChoiceResize`` does, and padded to a multiple of 32 as ``DetDataPreprocessor``."""
    sizes = []
    for short in (96, 128, 160, 192, 224):
        width, height = rescale_size((640, 480), (266, short))
        sizes.append((-(-height // 32) * 32, -(-width // 32) * 32))
    return sizes


def check_one_graph(model: nn.Module, images: torch.Tensor) -> dict:
    """Eager and compiled training steps of ``model`` on ``images`` and the graphs."""
    eager = train_step(model, images)
    compiled_backbone(model)
    return dict(eager=eager, compiled=train_step(model, images), graphs=graphs())


@functools.lru_cache(maxsize=None)
def pyramid_run(family: str) -> dict:
    """The pyramid layout's compiled model at :data:`FIRST_SIZE`, then at the five
    multi-scale sizes, compiled once for both tests (the run after the first size is the
    multi-scale one: its first size compiles the symbolic-size graph)."""
    model = build(family, 'pyramid')
    run = check_one_graph(model, torch.randn(2, 3, *FIRST_SIZE))
    for size in coco_multiscale_sizes():
        train_step(model, torch.randn(2, 3, *size))
    run['multiscale_graphs'] = graphs()
    return run


@pytest.mark.parametrize('layout', sorted(LAYOUTS))
@pytest.mark.parametrize('family', FAMILIES)
def test_backbone_trains_in_one_graph(family, layout):
    if layout == 'pyramid':
        run = pyramid_run(family)
    else:
        run = check_one_graph(build(family, layout), torch.randn(2, 3, *FIRST_SIZE))
    assert run['graphs'] == ({}, 1)
    (outputs, grads), (want_outputs, want_grads) = run['compiled'], run['eager']
    for got, want in zip(outputs + grads, want_outputs + want_grads):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize('family', FAMILIES)
def test_multiscale_training_compiles_at_most_twice(family):
    # the multi-scale COCO recipes use the pyramid layout; ViTDet's layout trains at a fixed
    # 1024² input (docs/compile.md)
    sizes = coco_multiscale_sizes()
    assert len(set(sizes)) == 5 and FIRST_SIZE not in sizes
    breaks, count = pyramid_run(family)['multiscale_graphs']
    assert breaks == {}
    assert count <= 2


@pytest.mark.skipif(shutil.which(os.environ.get('CXX', 'c++')) is None,
                    reason='inductor on CPU needs a C++ compiler')
@pytest.mark.parametrize('family', ['convit', 'cait'])
def test_inductor_compiles_symbolic_sizes(family):
    # Inductor's own lowering, which aot_eager does not run: one graph with symbolic sizes
    # serves two input sizes with the eager results. ConViT (a GPSA block, then an
    # attention block with the class token, one token map out) meets both failures that
    # INDUCTOR_OPTIONS work around: without them it does not compile, then its backward
    # fails at the second size. CaiT's talking heads run the CPU's own operator, whose
    # saved inputs and returned gradients keep the strides its fake kernels state.
    torch.manual_seed(0)
    model = backbone_families()[family](
        arch=dict(ARCHS[family], num_layers=2), img_size=64, pyramid=False,
        out_indices=(-1,)).train()
    compiled = copy.deepcopy(model)
    torch._dynamo.reset()
    compile_model(nn.ModuleDict(dict(backbone=compiled)), backend='inductor', dynamic=True)
    for size in coco_multiscale_sizes()[:2]:
        images = torch.randn(2, 3, *size)
        (outputs, grads), (want_outputs, want_grads) = (train_step(compiled, images),
                                                        train_step(model, images))
        for got, want in zip(outputs + grads, want_outputs + want_grads):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


# compiled by a fresh process at the vector level ATEN_CPU_CAPABILITY gives it (unset: the
# CPU's widest), with the compile cache shared between processes
CACHED_COMPILE = '''
import torch
from vitdense.engine.compile import compile_function
def attend(x, w):
    return (torch.softmax(x @ w, -1) * x.sum(-1, keepdim=True)).tanh()
torch.manual_seed(0)
x, w = torch.randn(3, 37, 61), torch.randn(61, 61)
got = compile_function(attend, dynamic=True)(x, w)
print((got - attend(x, w)).abs().max().item())
'''


def lower_vector_level() -> str:
    """An ``ATEN_CPU_CAPABILITY`` below the level inductor picks here: AVX2 under AVX-512,
    else none."""
    from torch._inductor.cpu_vec_isa import pick_vec_isa
    return 'avx2' if pick_vec_isa().bit_width() > 256 else 'default'


@pytest.mark.skipif(shutil.which(os.environ.get('CXX', 'c++')) is None,
                    reason='inductor on CPU needs a C++ compiler')
def test_inductor_cache_serves_each_vector_level_its_own_code(tmp_path):
    # torch's compile cache does not key on the vector ISA: without the width in the options,
    # the second process takes the first one's AVX-512 code and computes 2.0 off (at AVX2)
    # or fails to build it (at none)
    from torch._inductor.cpu_vec_isa import pick_vec_isa
    if not pick_vec_isa():
        pytest.skip('inductor vectorizes nothing on this CPU')
    env = {key: value for key, value in os.environ.items() if key != 'ATEN_CPU_CAPABILITY'}
    env.update(TORCHINDUCTOR_CACHE_DIR=str(tmp_path), OMP_NUM_THREADS='1')
    for level in (None, lower_vector_level()):
        run = subprocess.run([sys.executable, '-c', CACHED_COMPILE], capture_output=True,
                             text=True, timeout=600, cwd=os.getcwd(),
                             env=env if level is None else {**env, 'ATEN_CPU_CAPABILITY': level})
        assert run.returncode == 0, run.stderr[-3000:]
        assert float(run.stdout.split()[-1]) < 1e-5, (level, run.stdout)


class Heads(nn.Module):
    """The parts of a two-stage detector and of a segmentor that get compiled, and one
    (the data preprocessor) that does not."""

    def __init__(self) -> None:
        super().__init__()
        self.data_preprocessor = nn.Identity()
        self.backbone = nn.Linear(4, 4)
        self.roi_head = nn.Module()
        self.roi_head.bbox_head = nn.Linear(4, 2)
        self.auxiliary_head = nn.ModuleList([nn.Linear(4, 3), nn.Linear(4, 1)])


def test_compile_model_compiles_the_parts_in_place():
    model = Heads()
    keys = list(model.state_dict())
    assert compile_model(model, backend='aot_eager') == [
        'backbone', 'roi_head.bbox_head', 'auxiliary_head.0', 'auxiliary_head.1']
    assert compile_model(model, backend='aot_eager') == []
    assert list(model.state_dict()) == keys
    assert 'forward' not in vars(model.data_preprocessor)
    x = torch.randn(3, 4)
    torch._dynamo.reset()
    counters.clear()
    want = nn.functional.linear(x, model.roi_head.bbox_head.weight, model.roi_head.bbox_head.bias)
    torch.testing.assert_close(model.roi_head.bbox_head(x), want)
    torch.testing.assert_close(model.roi_head.bbox_head.forward(x), want)
    assert counters['stats']['unique_graphs'] == 1


def test_hook_compiles_the_runner_model_and_the_tools_add_it_once():
    runner = type('Runner', (), dict(model=Heads()))()
    CompileHook(backend='aot_eager').before_run(runner)
    assert 'forward' in vars(runner.model.backbone)

    cfg = Config(dict(custom_hooks=[dict(type='vitdense.CompileHook', mode='max-autotune')]))
    add_compile_hook(cfg, 'aot_eager')
    assert cfg.custom_hooks == [dict(type='vitdense.CompileHook', mode='max-autotune',
                                     backend='aot_eager')]
    cfg = Config(dict())
    add_compile_hook(cfg, 'inductor')
    assert cfg.custom_hooks == [dict(type='vitdense.CompileHook', backend='inductor')]


def test_a_deep_copy_of_a_compiled_model_runs_its_own_weights():
    model = Heads()
    compile_model(model, backend='aot_eager')
    x = torch.randn(3, 4)
    before = model.backbone(x)
    twin = copy.deepcopy(model)
    with torch.no_grad():
        for param in twin.parameters():
            param.zero_()
    assert torch.equal(twin.backbone(x), torch.zeros(3, 4))
    assert torch.equal(twin.roi_head.bbox_head.forward(x), torch.zeros(3, 2))
    assert torch.equal(model.backbone(x), before)
    assert compile_model(twin, backend='aot_eager') == []  # the copy is compiled already


def test_an_inductor_option_the_installed_torch_lacks_is_named(monkeypatch):
    from vitdense.engine import compile as compile_module
    monkeypatch.setattr(compile_module, 'INDUCTOR_OPTIONS',
                        {**compile_module.INDUCTOR_OPTIONS, 'no_such_option': True})
    with pytest.warns(RuntimeWarning, match=r'no inductor option no_such_option: compiling '
                                            r'without it'):
        compile_module.compile_function(nn.Linear(2, 2))
