"""benchmarks/benchmark_data_pipeline.py compares the shipped split pipeline with mmpretrain's
all-CPU one built from the same recipe, on JPEGs of ImageNet's sizes, and times its device
part against a ViT-S training step."""
import json

import pytest
import torch
from mmengine.config import Config
from PIL import Image

from benchmarks import benchmark_data_pipeline as tool


def test_all_cpu_pipeline_is_the_recipe_s_augments_in_the_worker():
    cfg = tool.to_all_cpu(Config.fromfile(tool.ROOT / tool.RECIPE))
    steps = [step['type'] for step in cfg.train_dataloader.dataset.pipeline]
    assert steps == ['LoadImageFromFile', 'RandomResizedCrop', 'RandomFlip', 'RandAugment',
                     'RandomErasing', 'PackInputs']
    assert cfg.data_preprocessor.type == 'ClsDataPreprocessor'
    assert 'augments' not in cfg.data_preprocessor


def test_generated_jpegs_have_imagenet_sizes(tmp_path):
    for path in tool.make_jpegs(tmp_path, 6):
        width, height = Image.open(path).size
        assert (height, width) in tool.IMAGE_SIZES


def test_speed_measures_every_pipeline(tmp_path, capsys):
    args = tool.parse_args(['speed', '--images', '3', '--batch', '2', '--rounds', '1',
                            '--work-dir', str(tmp_path)])
    tool.init_default_scope('mmpretrain')
    result = tool.speed(args)
    assert set(result['worker_images_per_core_s']) == {
        'split (decode in worker)', 'split (decode on GPU)', 'all-CPU (mmpretrain)'}
    assert all(rate > 0 for rate in result['worker_images_per_core_s'].values())
    assert result['device_s_per_batch']['split'] > 0
    assert '| ViT-S/16 (5000) |' in capsys.readouterr().out


def test_coco_measures_both_training_pipelines(tmp_path, capsys):
    result = tool.coco(tool.parse_args(['coco', '--images', '2', '--work-dir', str(tmp_path)]))
    assert set(result['images_per_core_s']) == set(tool.COCO_PIPELINES)
    assert all(rate > 0 for rate in result['images_per_core_s'].values())
    assert '| ViTDet LSJ 1024 |' in capsys.readouterr().out


def test_worker_batch_gets_mixup_and_cutmix_on_the_device(tmp_path):
    cfg = Config.fromfile(tool.ROOT / tool.RECIPE)
    tool.init_default_scope('mmpretrain')
    torch.manual_seed(0)
    paths = tool.make_jpegs(tmp_path, 4, image_sizes={(40, 56): 1.0})
    batch = tool.worker_batch(tool.worker_pipelines(cfg)['split (decode in worker)'], paths)
    out = tool.device_preprocessor(cfg)(tool.fresh(batch), training=True)
    assert out['inputs'].shape == (4, 3, 224, 224)
    scores = torch.stack([sample.gt_score for sample in out['data_samples']])
    assert scores.shape == (4, 1000) and torch.allclose(scores.sum(1), torch.ones(4))
    assert (scores > 0).sum(1).max() == 2  # labels mixed with another image's
    assert all('gt_score' not in sample for sample in batch['data_samples'])


def test_device_part_against_a_vit_s_step_on_the_cpu(tmp_path, capsys):
    out = tmp_path / 'device.json'
    tool.main(['device', '--device', 'cpu', '--batch', '4', '--rounds', '1', '--image-size',
               '48', '64', '--gpu-decode', '--work-dir', str(tmp_path), '--out', str(out)])
    printed = capsys.readouterr().out
    result = json.loads(out.read_text())
    assert result['vit_s_config'] == 'configs/vit/vit-s-p16_8xb256-a2_in1k.py'
    assert (result['device'], result['step_dtype'], result['batch']) == ('cpu', 'float32', 4)
    assert result['input'] == [3, 224, 224] and result['image_sizes'] == {'48x64': 1.0}
    part, step = result['device_part_ms']['device part'], result['vit_s_step_ms']
    assert part > 0 and step > 0
    assert result['device_part_percent']['device part'] == pytest.approx(100 * part / step)
    assert result['samples_ms']['ViT-S step'] == [step]  # one round after the warm-up
    assert list(result['device_part_ms']) == ['device part']  # no GPU decode on the CPU
    assert result['gpu_decode_skipped'] == tool.GPU_DECODE_ON_CPU
    assert tool.GPU_DECODE_ON_CPU in printed
    assert f"| device part | {part:.1f} | {100 * part / step:.1f} % |" in printed
