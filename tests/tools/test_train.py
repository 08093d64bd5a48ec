"""tools/train.py, tools/test.py and tools/dist_train.sh as a user runs them: train, resume,
evaluate with saved predictions and pictures, and train with 2 CPU processes (gloo)."""
import json
import runpy
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from mmengine.runner import Runner
from PIL import Image

from vitdense.checkpoint_io import safe_load
from vitdense.model_factory import build_model
from vitdense.models.layers.embed import PositionKernel

from common import CHECKOUT_ENV, REPO_ROOT, free_port, load_tool_config, perturb_

CONFIG = 'configs/xcit/upernet_xcit-d6-p8_demo-ade.py'
DET_CONFIG = 'configs/xcit/mask-rcnn_xcit-d6-p8_fpn_demo-coco.py'


def _data_roots(root: Path) -> list:
    """--cfg-options pointing every split's data set at ``root``."""
    return [f'{split}_dataloader.dataset.data_root={root}' for split in ('train', 'val', 'test')]


def _options(root: Path, iters: int, seeded: bool = True) -> list:
    """--cfg-options for a few 64 px iterations on ``root``; ``seeded``: seed 0 for every
    run, else each run draws its seed as the shipped runtime has it."""
    seed = ['randomness.seed=0', 'randomness.deterministic=True'] if seeded else []
    return ['--cfg-options', *_data_roots(root), f'train_cfg.max_iters={iters}',
            f'train_cfg.val_interval={iters}', f'default_hooks.checkpoint.interval={iters}',
            'model.data_preprocessor.size=(64,64)', 'train_dataloader.batch_size=2',
            'train_dataloader.num_workers=0', 'train_dataloader.persistent_workers=False',
            'val_dataloader.num_workers=0', 'val_dataloader.persistent_workers=False',
            'test_dataloader.num_workers=0', 'test_dataloader.persistent_workers=False',
            *seed, 'default_hooks.logger.interval=1']


def _run(*args: str, env: dict | None = None) -> str:
    """Run a tool; its idle OpenMP threads sleep instead of spinning (``OMP_WAIT_POLICY``
    changes no result): a second thread spinning on a core that the suite's other worker
    uses would take its time, up to four times the CPU of the run itself. A variable of
    ``env`` set to None is left out."""
    variables = {**CHECKOUT_ENV, 'OMP_WAIT_POLICY': 'PASSIVE', **(env or {})}
    result = subprocess.run([str(a) for a in args], cwd=REPO_ROOT, capture_output=True, text=True,
                            env={name: value for name, value in variables.items()
                                 if value is not None})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout + result.stderr


def _losses(work_dir: Path) -> dict[int, float]:
    return {entry['iter']: entry['loss'] for path in work_dir.rglob('scalars.json')
            for entry in map(json.loads, path.read_text().splitlines()) if 'loss' in entry}


def test_train_resume_and_test(demo_ade_root, tmp_path):
    # A run stopped after iteration 2 (its checkpoint of iteration 2 alone in a work dir) and
    # resumed repeats the uninterrupted 4-iteration run exactly: the losses of iterations 3-4
    # and the final weights. Each run draws its seed (the shipped runtime): the resumed one
    # takes the checkpoint's.
    full = tmp_path / 'full'
    _run(sys.executable, 'tools/train.py', CONFIG, '--work-dir', full,
         *_options(demo_ade_root, 4, seeded=False), 'default_hooks.checkpoint.interval=2',
         'default_hooks.checkpoint.max_keep_ckpts=2')
    work = tmp_path / 'work'
    work.mkdir()
    shutil.copy(full / 'iter_2.pth', work)
    log = _run(sys.executable, 'tools/train.py', CONFIG, '--work-dir', work, '--resume',
               *_options(demo_ade_root, 4, seeded=False))
    assert f'resuming from {work / "iter_2.pth"}' in log and (work / 'iter_4.pth').exists()
    assert {i: _losses(full)[i] for i in (3, 4)} == {i: _losses(work)[i] for i in (3, 4)}
    ours = safe_load(work / 'iter_4.pth')['state_dict']
    reference = safe_load(full / 'iter_4.pth')['state_dict']
    assert all(torch.equal(ours[key], reference[key]) for key in reference)

    out, show = tmp_path / 'pred', tmp_path / 'show'
    log = _run(sys.executable, 'tools/test.py', CONFIG, work / 'iter_4.pth', '--work-dir', work,
               '--out', out, '--show-dir', show, *_options(demo_ade_root, 4))
    assert 'mIoU' in log
    assert len(list(out.glob('*.png'))) == 2
    assert len(list(show.rglob('*.png'))) == 2
    logged = [json.loads(line) for p in work.rglob('*.json') for line in p.read_text().split('\n')
              if line]
    assert any('mIoU' in entry for entry in logged)


def test_unknown_scope_is_refused(tmp_path, monkeypatch):
    # in this process: the error that the command line ends with (and prints), before any
    # model is built
    config = tmp_path / 'other.py'
    config.write_text("default_scope = 'mmocr'\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, 'argv', ['tools/train.py', str(config)])
    with pytest.raises(ValueError, match="default_scope='mmocr'"):
        runpy.run_path(str(REPO_ROOT / 'tools/train.py'), run_name='__main__')


def test_dist_train_two_cpu_processes(demo_ade_root, tmp_path):
    work = tmp_path / 'dist'
    log = _run('bash', 'tools/dist_train.sh', CONFIG, '2', '--work-dir', work,
               *_options(demo_ade_root, 2), env=dict(PYTHON=sys.executable, PORT=str(free_port())))
    assert 'Distributed training: True' in log and 'rank 0 of 2 runs on CPU with the gloo' in log
    assert (work / 'iter_2.pth').exists()


def _det_options(root: Path, iters: int, seeded: bool = True) -> list:
    """--cfg-options for the demo Mask R-CNN on ``root``'s 64 px images; ``seeded`` as
    for :func:`_options`."""
    annotations = root / 'annotations' / 'instances_val.json'
    seed = ['randomness.seed=0', 'randomness.deterministic=True'] if seeded else []
    return ['--cfg-options', *_data_roots(root), f'val_evaluator.ann_file={annotations}',
            f'test_evaluator.ann_file={annotations}',
            'train_dataloader.dataset.pipeline.2.scale=(64,64)',
            f'train_cfg.max_iters={iters}', 'train_dataloader.batch_size=2',
            'train_dataloader.num_workers=0', 'train_dataloader.persistent_workers=False',
            *seed, 'default_hooks.logger.interval=1']


def test_demo_mask_rcnn_resumes_exactly_with_its_drawn_seed(demo_coco_root, tmp_path):
    # The shipped runtime's randomness (each run draws its seed; proposal sampling and
    # flips draw from it): resumed from the checkpoint of iteration 2, the run ends with the
    # uninterrupted run's weights, bit for bit.
    full, work = tmp_path / 'full', tmp_path / 'work'
    options = [*_det_options(demo_coco_root, 4, seeded=False), 'train_cfg.val_begin=5',
               'default_hooks.checkpoint.interval=2', 'default_hooks.checkpoint.max_keep_ckpts=2']
    _run(sys.executable, 'tools/train.py', DET_CONFIG, '--work-dir', full, *options)
    work.mkdir()
    shutil.copy(full / 'iter_2.pth', work)
    _run(sys.executable, 'tools/train.py', DET_CONFIG, '--work-dir', work, '--resume', *options)
    ours = safe_load(work / 'iter_4.pth')['state_dict']
    reference = safe_load(full / 'iter_4.pth')['state_dict']
    assert all(torch.equal(ours[key], reference[key]) for key in reference)


def _relative_gaps(losses: dict[int, float], reference: dict[int, float]) -> dict[int, float]:
    return {i: abs(losses[i] - reference[i]) / abs(reference[i]) for i in reference}


def _another_isa_and_thread_count() -> dict:
    """The environment of an eager run whose kernels round otherwise than this process's:
    two threads instead of one, and ATen's kernels at another instruction-set level (the
    scalar ``default`` ones, or the CPU's own where this process is forced to ``default``)."""
    forced_default = torch.backends.cpu.get_cpu_capability() == 'DEFAULT'
    return dict(OMP_NUM_THREADS='2', ATEN_CPU_CAPABILITY=None if forced_default else 'default')


@pytest.mark.parametrize('config', [DET_CONFIG, CONFIG], ids=['mask-rcnn', 'upernet'])
def test_compiled_training_has_the_eager_losses(config, demo_coco_root, demo_ade_root,
                                                tmp_path):
    # aot_eager traces backbone, neck and heads as inductor would and runs the graphs with
    # the eager kernels: the graphs are checked without a C++ build on the CPU
    # no evaluation; UperNet's heads without dropout: compiled graphs draw their masks in
    # another order than eager modules, so only the arithmetic is compared
    options = (_det_options(demo_coco_root, 20) if config == DET_CONFIG else
               _options(demo_ade_root, 20) + ['model.decode_head.dropout_ratio=0',
                                              'model.auxiliary_head.dropout_ratio=0']
               ) + ['train_cfg.val_begin=21']
    # one thread each, as the suite runs every process: a second thread waits for a core
    # that the suite's other worker holds
    runs = [('eager', {'OMP_NUM_THREADS': '1'}, ()),
            ('compiled', {'OMP_NUM_THREADS': '1'}, ('--compile', 'aot_eager')),
            ('eager-elsewhere', _another_isa_and_thread_count(), ())]
    losses, logs = {}, {}
    for name, env, compile_options in runs:
        logs[name] = _run(sys.executable, 'tools/train.py', config, '--work-dir',
                          tmp_path / name, *compile_options, *options, env=env)
        losses[name] = _losses(tmp_path / name)
        assert sorted(losses[name]) == list(range(1, 21)), name
    assert 'torch.compile (aot_eager): backbone, ' in logs['compiled']
    # Training a detector or a segmentor is chaotic: AdamW's first steps (nearly the
    # gradient's sign), proposal sampling and NMS ties turn rounding into real differences
    # that grow from iteration to iteration. Eager itself, run on two threads with ATen's
    # scalar kernels, moves the losses by up to ~1e-3 by iteration 20 (Mask R-CNN 8.3e-4 on
    # an AVX-512 CPU, where the compiled run moves 4.6e-7); the compiled run stays within
    # twice that spread, measured here on this CPU.
    compiled = _relative_gaps(losses['compiled'], losses['eager'])
    spread = _relative_gaps(losses['eager-elsewhere'], losses['eager'])
    assert max(compiled.values()) <= 2 * max(spread.values()), (compiled, spread)


VIT_CONFIG = 'configs/vit/upernet_vit-d6-p8_demo-ade.py'
#: input sizes off the position table's own 16 x 16 grid (128 px), where the kernel matters
KERNEL_SIZES = ((64, 64), (96, 160), (136, 200))


def _mmseg_vit_checkpoint(path: Path) -> Path:
    """An mmseg ViT of the demo's widths pretrained at 64 px (an 8 x 8 table), saved in
    mmseg's layout: mmseg resamples tables with plain bicubic, so a model loading it does."""
    from mmseg.models.backbones import VisionTransformer as MMSegViT
    torch.manual_seed(0)
    mmseg_vit = MMSegViT(img_size=64, patch_size=8, embed_dims=128, num_layers=6, num_heads=4)
    torch.save(perturb_(mmseg_vit).state_dict(), path)
    return path


def test_a_model_trained_from_an_mmseg_checkpoint_keeps_its_kernel_in_test_and_export(
        demo_ade_root, tmp_path):
    # The position kernel is chosen when the pretrained checkpoint loads (init_weights), which
    # the test, val and deploy paths skip: the saved checkpoint carries it, so each computes
    # what the training-time model did at sizes where the kernels differ (by 2e-3 and more).
    pretrained = _mmseg_vit_checkpoint(tmp_path / 'mmseg_vit_64.pth')
    config = tmp_path / 'upernet_vit-d6-p8_mmseg-pretrained_demo-ade.py'
    # norm_eps: the LayerNorm eps of the mmseg ViT that wrote the file (its default)
    config.write_text(f"_base_ = '{REPO_ROOT / VIT_CONFIG}'\nmodel = dict(backbone=dict("
                      f"norm_eps=1e-5, init_cfg=dict(_delete_=True, type='Pretrained', "
                      f"checkpoint='{pretrained}')))\n")
    work = tmp_path / 'work'
    _run(sys.executable, 'tools/train.py', config, '--work-dir', work,
         *_options(demo_ade_root, 2))
    checkpoint = work / 'iter_2.pth'
    weights = safe_load(checkpoint)['state_dict']
    assert weights['backbone.pos_embed.kernel'].tolist() == [0, 0]  # plain bicubic, saved

    cfg = load_tool_config(str(config), None, 'none', str(tmp_path / 'test'))
    # the training-time model: the kernel its init_weights chose, the trained tensors
    trained = build_model(cfg, 'train')
    trained.init_weights()
    trained.load_state_dict({k: v for k, v in weights.items() if k != 'backbone.pos_embed.kernel'})
    # the test and val path (tools/test.py: load_from, then Runner.test's load_or_resume)
    cfg.load_from = str(checkpoint)
    runner = Runner.from_cfg(cfg)
    runner.load_or_resume()
    deployed = build_model(cfg, 'deploy', str(checkpoint))
    with torch.no_grad():
        for height, width in KERNEL_SIZES:
            images = torch.randn(1, 3, height, width)
            expected = trained.eval().backbone(images)
            for model in (runner.model, deployed):
                for ours, reference in zip(model.backbone(images), expected):
                    assert torch.equal(ours, reference), (height, width)
            antialiased = deployed.backbone.pos_embed
            antialiased.use_kernel(PositionKernel())
            assert (deployed.backbone(images)[0] - expected[0]).abs().max() > 1e-4
            antialiased.use_kernel(PositionKernel(antialias=False))

    images = []
    for height, width in KERNEL_SIZES:
        images.append(tmp_path / f'{height}x{width}.png')
        Image.fromarray(np.random.default_rng(0).integers(
            0, 255, (height, width, 3), dtype=np.uint8)).save(images[-1])
    exported = tmp_path / 'backbone.pt2'
    log = _run(sys.executable, 'tools/deployment/export.py', config, checkpoint, '--part',
               'backbone', '--dynamic', '--format', 'torch-export', '--out', exported,
               '--atol', '0', '--image', *images)
    # --atol 0: the tool exits 1 unless the program equals the model built from the checkpoint
    checks = [line for line in log.splitlines() if line.startswith('image ')]
    assert len(checks) == 3 and 'exported model matches PyTorch' in log.splitlines(), log
