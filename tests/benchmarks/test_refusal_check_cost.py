"""benchmarks/refusal_check_cost.py: the measured load is refused, its advice checked."""
import timm
import torch

from benchmarks.refusal_check_cost import measure


def test_a_small_bfloat16_file_is_refused_and_its_check_measured():
    """DINOv2-S's layout in bfloat16 into a ViT without LayerScale: refused with the
    LayerScale advice (checked on the file's tensors), the file's size and the check's
    cost reported."""
    result = measure('bfloat16', False, size='small')
    assert result['advice'].startswith('layer_scale=1e-5')
    with torch.device('meta'):
        source = timm.create_model('vit_small_patch14_dinov2', img_size=518)
    tensors = sum(t.numel() for t in source.state_dict().values())
    assert result['file_mb'] == round(tensors * 2 / 2 ** 20)
    assert result['cpu_s'] > 0 and result['peak_rise_mb'] >= 0
