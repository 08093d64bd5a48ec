"""benchmarks/benchmark_dense_demo.py builds each run's config: the family's demo recipe, ResNet-18
swapped in with matching neck / head widths, ablation options and another data root applied,
and the time budget in place of the schedule."""
import pytest

from benchmarks import benchmark_dense_demo as tool


def test_resnet18_row_swaps_only_the_backbone(tmp_path):
    det = tool.build_config('det', 'resnet18', 2.0, 'process', tmp_path)
    assert det.model.backbone.type == 'mmdet.ResNet' and det.model.backbone.depth == 18
    assert det.model.neck.in_channels == tool.RESNET18_CHANNELS
    xcit = tool.build_config('det', 'xcit', 2.0, 'process', tmp_path)
    assert det.model.roi_head == xcit.model.roi_head
    seg = tool.build_config('seg', 'resnet18', 2.0, 'process', tmp_path)
    assert seg.model.decode_head.in_channels == tool.RESNET18_CHANNELS
    assert seg.model.auxiliary_head.in_channels == tool.RESNET18_CHANNELS[2]


def test_ablation_options_data_root_and_budget(tmp_path):
    cfg = tool.build_config('det', 'xcit', 3.0, 'wall', tmp_path / 'work',
                            {'model.backbone.out_indices': [2, 3, 4, 5]}, str(tmp_path / 'd'))
    assert cfg.model.backbone.out_indices == [2, 3, 4, 5]
    assert cfg.train_dataloader.dataset.data_root == str(tmp_path / 'd')
    assert cfg.test_evaluator.ann_file == str(tmp_path / 'd/annotations/instances_val.json')
    budget = [hook for hook in cfg.custom_hooks if hook['type'] == 'vitdense.TimeBudgetHook']
    assert budget == [dict(type='vitdense.TimeBudgetHook', minutes=3.0, clock='wall')]
    assert cfg.param_scheduler == [] and cfg.work_dir == str(tmp_path / 'work')


def test_eomt_rows_anneal_the_masks_over_the_budget(tmp_path):
    """EoMT's masks are annealed at the recipe's fractions of its schedule, now of the
    budget (200-400 and 400-600 of 700 iterations)."""
    cfg = tool.build_config('eomt', 'xcit', 2.0, 'process', tmp_path)
    assert cfg.model.backbone.backbone.type == 'vitdense.XCiT'
    annealing = [hook for hook in cfg.custom_hooks
                 if hook['type'] == 'vitdense.EoMTMaskAnnealingHook']
    assert annealing == [dict(type='vitdense.EoMTMaskAnnealingHook', power=0.9,
                              start_fractions=[200 / 700, 400 / 700],
                              end_fractions=[400 / 700, 600 / 700])]


def test_mask2former_row_runs_the_vit_adapter_demo_and_only_it(tmp_path):
    """The Mask2Former task is the ViT demo in ViT-Adapter's layout on the set of the EoMT
    rows; a pair without a demo config is refused, naming what runs."""
    cfg = tool.build_config('mask2former', 'vit', 2.0, 'process', tmp_path)
    assert cfg.model.backbone.type == 'vitdense.ColumnarAdapter'
    assert cfg.model.decode_head.type == 'Mask2FormerHead'
    eomt = tool.build_config('eomt', 'vit', 2.0, 'process', tmp_path)
    assert cfg.train_dataloader.dataset.data_root == eomt.train_dataloader.dataset.data_root
    for task in ('mask2former', 'panoptic', 'eomt-panoptic'):
        assert [tool.has_config(task, family) for family in tool.FAMILIES] == \
            [family == 'vit' for family in tool.FAMILIES]
    assert not tool.has_config('eomt', 'resnet18') and tool.has_config('seg', 'resnet18')
    with pytest.raises(ValueError, match='Mask2Former and panoptic run on ViT only'):
        tool.build_config('mask2former', 'xcit', 2.0, 'process', tmp_path)


def test_eomt_panoptic_row_anneals_over_the_budget_and_is_scored_by_pq(tmp_path):
    cfg = tool.build_config('eomt-panoptic', 'vit', 2.0, 'process', tmp_path)
    assert cfg.model.backbone.type == 'vitdense.EoMT'
    assert cfg.test_evaluator.type == 'CocoPanopticMetric'
    assert tool.METRICS['eomt-panoptic'] == tool.METRICS['panoptic'] == ('coco_panoptic/PQ',)
    annealing = [hook for hook in cfg.custom_hooks
                 if hook['type'] == 'vitdense.EoMTMaskAnnealingHook']
    assert annealing[0]['start_fractions'] == [200 / 700, 400 / 700]
