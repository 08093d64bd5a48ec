"""The mmcv-op inventory resolves config types to the compiled functions their code calls:
exact for mmcv's op modules, through imports for the hosts' modules, and an op a module only
imports for ``isinstance`` is not counted."""
import pytest

from tools.mmcv_ops_inventory import HostModules, MmcvOps, markdown


@pytest.fixture(scope='module')
def modules() -> HostModules:
    import mmdet.models  # noqa: F401  (registers mmdet's modules)
    import mmseg.models  # noqa: F401
    return HostModules(MmcvOps())


def test_mmcv_op_modules_resolve_through_aliases_and_classes(modules):
    ops = modules.ops
    assert ops.reached('mmcv.ops.focal_loss', 'sigmoid_focal_loss') == {
        'sigmoid_focal_loss_forward', 'sigmoid_focal_loss_backward'}
    assert ops.reached('mmcv.ops', 'nms') == {'nms'}   # through the package, then NMSop
    # batched_nms calls the NMS a config's ``nms=dict(type=...)`` names: counted there
    assert modules.of_type('mmdet', 'nms') == {'nms'}
    assert ops.reached('mmcv.ops', 'soft_nms') == {'softnms'}
    assert ops.reached('mmcv.ops.point_sample', 'point_sample') == set()   # pure torch


def test_config_types_reach_what_their_code_calls(modules):
    assert modules.of_type('mmdet', 'DCNv2') == {'modulated_deform_conv_forward',
                                                 'modulated_deform_conv_backward'}
    assert {'sigmoid_focal_loss_forward', 'nms'} <= modules.of_type('mmdet', 'FocalLoss') | (
        modules.of_type('mmdet', 'RetinaHead'))
    assert 'ms_deform_attn_forward' in modules.of_type('mmdet', 'DINO')
    assert 'ms_deform_attn_backward' in modules.of_type('mmseg', 'mmdet.Mask2FormerHead')
    # mmdet's FCN mask head imports CARAFEPack only to skip it in init_weights
    assert not any(f.startswith('carafe') for f in modules.of_type('mmdet', 'FCNMaskHead'))
    assert modules.of_type('mmdet', 'NoSuchHead') == set()


def test_table_groups_an_ops_functions_and_marks_what_is_served():
    table = {'nms': {'mmdet': {'retinanet'}}, 'softnms': {'mmdet': {'cornernet'}},
             'psamask_forward': {'mmseg': {'psanet'}}, 'psamask_backward': {'mmseg': {'psanet'}}}
    lines = markdown(table, frozenset({'nms'})).splitlines()
    assert lines[2] == '| `nms` | yes | retinanet | - |'
    assert '| `psamask_backward`, `psamask_forward` | no | - | psanet |' in lines
    assert '| `softnms` | no | cornernet | - |' in lines
