"""tools/model_converters/detectron2_vitdet.py on a checkpoint synthesised in detectron2's
layout (``modeling/backbone/vit.py``: ViT at ``backbone.net``, pyramid stages
``backbone.simfp_<log2 stride>.<index>``, a class-token row in the position table, numpy
arrays in a .pkl), converted back and loaded into the ViT-B ViTDet config's model."""
import pickle
import re
import subprocess
import sys

import torch
from mmengine.config import Config

from vitdense.model_factory import build_model

from common import CHECKOUT_ENV, REPO_ROOT

CONVERTER = REPO_ROOT / 'tools' / 'model_converters' / 'detectron2_vitdet.py'
CONFIG = REPO_ROOT / 'configs/vit/mask-rcnn_vit-b-p16_vitdet_16xb4-lsj-100e_coco-1024x1024.py'
# our name -> detectron2's, written independently of the converter's rules
TO_DETECTRON2 = (
    (r'^backbone\.pos_embed\.weight$', 'backbone.net.pos_embed'),
    (r'^backbone\.(?!net\.)', 'backbone.net.'),
    (r'\.attn\.rel_pos\.height$', '.attn.rel_pos_h'),
    (r'\.attn\.rel_pos\.width$', '.attn.rel_pos_w'),
    (r'^neck\.rescales\.0\.', 'backbone.simfp_2.'),
    (r'^neck\.rescales\.1\.0\.', 'backbone.simfp_3.0.'),
    (r'^neck\.(lateral|fpn)_convs\.(\d)\.conv\.weight$', r'neck.\1_convs.\2.weight'),
    (r'^neck\.lateral_convs\.0\.', 'backbone.simfp_2.4.'),
    (r'^neck\.fpn_convs\.0\.', 'backbone.simfp_2.5.'),
    (r'^neck\.lateral_convs\.1\.', 'backbone.simfp_3.1.'),
    (r'^neck\.fpn_convs\.1\.', 'backbone.simfp_3.2.'),
    (r'^neck\.lateral_convs\.2\.', 'backbone.simfp_4.0.'),
    (r'^neck\.fpn_convs\.2\.', 'backbone.simfp_4.1.'),
    (r'^neck\.lateral_convs\.3\.', 'backbone.simfp_5.1.'),
    (r'^neck\.fpn_convs\.3\.', 'backbone.simfp_5.2.'),
)


def test_detectron2_checkpoint_converts_to_the_vitdet_config(tmp_path):
    small = tmp_path / 'small.py'  # ViT-B's layout at width 32: every key, small tensors
    small.write_text(f"_base_ = '{CONFIG}'\nmodel = dict(backbone=dict(arch=dict(_delete_=True, "
                     f"embed_dims=32, num_layers=12, num_heads=2)), neck=dict(in_channels=32))\n")
    torch.manual_seed(0)
    model = build_model(Config.fromfile(str(small)), 'count')
    # every tensor detectron2 saves (not our records of the position kernel and the table's
    # grid, buffers of ours)
    ours = {k: v for k, v in model.state_dict().items()
            if k.startswith(('backbone.', 'neck.')) and
            k not in ('backbone.pos_embed.kernel', 'backbone.pos_embed.table_grid')}
    with torch.no_grad():
        for value in ours.values():
            value.normal_()
    detectron2 = {}
    for key, value in ours.items():
        for pattern, replacement in TO_DETECTRON2:
            key = re.sub(pattern, replacement, key)
        if key == 'backbone.net.pos_embed':  # detectron2 keeps the class token's row
            value = torch.cat([torch.zeros(1, 1, 32), value], dim=1)
        detectron2[key] = value.numpy()
    detectron2['roi_heads.box_predictor.cls_score.weight'] = torch.zeros(81, 1024).numpy()
    src, dst = tmp_path / 'model_final.pkl', tmp_path / 'converted.pth'
    src.write_bytes(pickle.dumps(dict(model=detectron2)))
    result = subprocess.run([sys.executable, str(CONVERTER), str(src), str(dst), '--config',
                             str(small)], capture_output=True, text=True, env=CHECKOUT_ENV)
    assert result.returncode == 0, result.stderr
    assert 'backbone and neck load' in result.stdout and '1 head tensors' in result.stdout
    converted = torch.load(dst, weights_only=True)['state_dict']
    model.load_state_dict(converted, strict=False)
    for key, value in ours.items():
        assert torch.equal(model.state_dict()[key], value), key


def test_objects_other_than_arrays_are_refused(tmp_path, run_command):
    src = tmp_path / 'evil.pkl'
    src.write_bytes(pickle.dumps(dict(model={'x': print})))
    result = run_command(CONVERTER, str(src), str(tmp_path / 'o.pth'))
    assert result.returncode != 0
    assert (f'refused to load {src}: builtins.print is not a numpy array part'
            in result.stderr.splitlines()[-1])
