"""benchmarks/benchmark_vitdet.py: each cell's config is its layout of the family's demo
recipe, trained for a fixed number of iterations with its seed; the tables report each cell
as the mean and spread of its seeds."""
import pytest

from benchmarks import benchmark_vitdet as tool


@pytest.mark.parametrize('family', tool.FAMILIES)
def test_cells_are_the_layouts_of_the_demo_recipe(family, tmp_path):
    configs = {layout: tool.cell_config('det', family, layout, 3, 80, tmp_path)
               for layout in tool.layouts_of(family)}
    assert configs['multilayer'].model.neck.type == 'FPN'
    assert configs['multilayer'].model.backbone.get('window_size', 0) == 0
    simple = configs['simple-global']
    assert simple.model.neck.type == 'vitdense.SimpleFeaturePyramid'
    assert simple.model.backbone.get('window_size', 0) == 0
    assert not simple.model.backbone.get('use_rel_pos', False)
    if family == 'xcit':
        assert 'simple-window' not in configs
    else:
        window = configs['simple-window'].model.backbone
        assert window.window_size == 5 and window.use_rel_pos
    for cfg in configs.values():
        assert cfg.randomness == dict(seed=3)
        assert cfg.train_cfg.max_iters == cfg.train_cfg.val_interval == 80
        # warmup kept, the decay ends at the last iteration
        assert [s.end for s in cfg.param_scheduler] == [50, 80]
        assert cfg.default_hooks.checkpoint.interval == 80


def test_a_run_shorter_than_the_warmup_is_refused(tmp_path):
    with pytest.raises(ValueError, match='40 iterations do not reach past the warmup'):
        tool.cell_config('seg', 'vit', 'multilayer', 0, 40, tmp_path)


def test_full_size_configs_compare_layouts_without_recomputation():
    config, options = tool.full_size_config('cait', 'simple-global')
    assert config.endswith('configs/cait/mask-rcnn_cait-s24-p16_vitdet_16xb4-lsj-100e_coco-'
                           '1024x1024.py')
    assert options == {'model.backbone.with_cp': False, 'model.backbone.window_size': 0,
                       'model.backbone.use_rel_pos': False}
    config, options = tool.full_size_config('xcit', 'multilayer')
    assert config.endswith('configs/xcit/mask-rcnn_xcit-s12-p16_fpn_3x_coco.py')
    assert options == {'model.backbone.with_cp': False}


def test_table_gives_mean_and_spread_of_the_seeds():
    rows = [dict(task='seg', family='vit', layout='multilayer', seed=seed, iters=120,
                 train_cpu_min=1.0, mIoU=value) for seed, value in ((0, 70.0), (1, 74.0), (2, 72.0))]
    rows += [dict(task='det', family='vit', layout='multilayer', seed=0, iters=100,
                  train_cpu_min=100 / 60, **{'coco/bbox_mAP': .3, 'coco/segm_mAP': .4})]
    table = tool.demo_table(rows).splitlines()
    assert len(table) == 3
    assert table[2] == ('| vit | multilayer | 0,1,2 | 30.0 | 40.0 | 72.0 ± 2.0 '
                        '| 100 / 120 | 1.00 / 0.50 |')
