"""benchmarks/benchmark_data_pipeline.py compares the shipped split pipeline with mmpretrain's
all-CPU one built from the same recipe, on JPEGs of ImageNet's sizes."""
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
