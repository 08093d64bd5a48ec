"""tools/model_converters/vitdense_to_timm.py: a whole mmengine checkpoint of a classifier
becomes a state dict that timm's model loads strictly with the same logits; a dense model
without its classification stage is refused unless asked to fill it; no file is
overwritten unless asked."""
from __future__ import annotations

import json
import subprocess
import sys

import timm
import torch

from vitdense.models import XCiT

from common import CHECKOUT_ENV, REPO_ROOT, TINY_ARCH

CONVERTER = REPO_ROOT / 'tools/model_converters/vitdense_to_timm.py'
TIMM_KWARGS = dict(embed_dim=32, depth=4, num_heads=2, tokens_norm=True)


def _convert(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(CONVERTER), 'xcit', *args,
                           '--timm-model', 'xcit_nano_12_p16_224',
                           '--timm-kwargs', json.dumps(TIMM_KWARGS)],
                          capture_output=True, text=True, env=CHECKOUT_ENV)


def test_a_classifier_checkpoint_is_written_for_timm_and_kept_from_overwrites(tmp_path):
    torch.manual_seed(0)
    backbone = XCiT(TINY_ARCH, out_type='cls_token').eval()
    head = torch.nn.Linear(32, 3)
    src, dst = tmp_path / 'epoch_1.pth', tmp_path / 'xcit_timm.pth'
    torch.save(dict(meta=dict(epoch=1), message_hub=dict(runtime_info=dict(iter=9)),
                    state_dict={**{f'backbone.{k}': v for k, v in backbone.state_dict().items()},
                                'head.fc.weight': head.weight, 'head.fc.bias': head.bias}), src)
    result = _convert(str(src), str(dst))
    assert result.returncode == 0, result.stderr
    assert "timm.create_model('xcit_nano_12_p16_224', num_classes=3" in result.stdout
    theirs = timm.create_model('xcit_nano_12_p16_224', num_classes=3, **TIMM_KWARGS).eval()
    theirs.load_state_dict(torch.load(dst), strict=True)
    images = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(theirs(images), head(backbone(images)[0]),
                                   rtol=1e-5, atol=1e-6)
    written = dst.read_bytes()
    again = _convert(str(src), str(dst))
    assert again.returncode != 0 and 'exists; pass --overwrite' in again.stderr
    assert dst.read_bytes() == written


def test_a_dense_model_is_refused_unless_its_classification_stage_is_filled(tmp_path):
    src, dst = tmp_path / 'dense.pth', tmp_path / 'dense_timm.pth'
    torch.save(XCiT(TINY_ARCH).state_dict(), src)
    refused = _convert(str(src), str(dst))
    assert refused.returncode != 0 and not dst.exists()
    assert 'lacks 39 tensors' in refused.stderr and '--fill-missing' in refused.stderr
    filled = _convert(str(src), str(dst), '--fill-missing')
    assert filled.returncode == 0, filled.stderr
    assert "39 tensors from timm's initialisation, not trained: cls_token" in filled.stdout
    timm.create_model('xcit_nano_12_p16_224', num_classes=0, **TIMM_KWARGS).load_state_dict(
        torch.load(dst), strict=True)
