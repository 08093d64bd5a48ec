"""tools/model_converters/vitdense_to_timm.py: a whole mmengine checkpoint of a classifier
becomes a state dict that the printed ``timm.create_model(...)`` call (written from the
checkpoint's own config) loads strictly with the same logits; a dense model without its
classification stage is refused unless asked to fill it; timm options that contradict the
backbone are refused; no file is overwritten unless asked."""
from __future__ import annotations

import functools  # also named by the printed calls
import json
import re
import subprocess
import sys

import timm
import torch

from vitdense.models import XCiT

from common import CHECKOUT_ENV, REPO_ROOT, TINY_ARCH, perturb_

CONVERTER = REPO_ROOT / 'tools/model_converters/vitdense_to_timm.py'
OPTIONS = dict(arch=TINY_ARCH, img_size=64)


def _convert(*args: str) -> subprocess.CompletedProcess:
    """The converter in a new interpreter, as a user runs it."""
    return subprocess.run([sys.executable, str(CONVERTER), 'xcit', *args],
                          capture_output=True, text=True, env=CHECKOUT_ENV)


def _printed_call(stdout: str) -> str:
    return re.search(r'load with (timm\.create_model\(.*\))\.load_state_dict', stdout).group(1)


def test_a_classifier_checkpoint_is_written_for_timm_and_kept_from_overwrites(tmp_path,
                                                                            run_command):
    torch.manual_seed(0)
    options = dict(OPTIONS, out_type='cls_token', arch=dict(TINY_ARCH, tokens_norm=False))
    backbone = perturb_(XCiT(**options))
    head = torch.nn.Linear(32, 3)
    src, dst = tmp_path / 'epoch_1.pth', tmp_path / 'xcit_timm.pth'
    cfg = f"model = dict(type='ImageClassifier', backbone=dict(type='vitdense.XCiT', " \
          f"**{options!r}))"
    torch.save(dict(meta=dict(epoch=1, cfg=cfg), message_hub=dict(runtime_info=dict(iter=9)),
                    state_dict={**{f'backbone.{k}': v for k, v in backbone.state_dict().items()},
                                'head.fc.weight': head.weight, 'head.fc.bias': head.bias}), src)
    result = _convert(str(src), str(dst))
    assert result.returncode == 0, result.stderr
    call = _printed_call(result.stdout)
    assert call.startswith("timm.create_model('xcit_nano_12_p16_224', num_classes=3, "
                           "embed_dim=32, depth=4, num_heads=2")
    assert 'tokens_norm=False' in call
    theirs = eval(call).eval()
    theirs.load_state_dict(torch.load(dst), strict=True)
    images = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(theirs(images), head(backbone(images)[0]),
                                   rtol=1e-5, atol=1e-6)
    written = dst.read_bytes()
    again = run_command(CONVERTER, 'xcit', str(src), str(dst))
    assert again.returncode != 0 and 'exists; pass --overwrite' in again.stderr
    assert dst.read_bytes() == written
    contradicting = run_command(CONVERTER, 'xcit', str(src), str(tmp_path / 'other.pth'),
                                '--timm-kwargs', json.dumps(dict(tokens_norm=True)))
    assert contradicting.returncode != 0 and not (tmp_path / 'other.pth').exists()
    assert 'computes other features than the backbone' in contradicting.stderr


def test_a_dense_model_is_refused_unless_its_classification_stage_is_filled(tmp_path,
                                                                           run_command):
    src, dst = tmp_path / 'dense.pth', tmp_path / 'dense_timm.pth'
    torch.save(XCiT(**OPTIONS).state_dict(), src)
    convert = functools.partial(run_command, CONVERTER, 'xcit', str(src), str(dst))
    no_options = convert()
    assert no_options.returncode != 0 and "give the backbone's options" in no_options.stderr
    options = ('--options', json.dumps(OPTIONS))
    refused = convert(*options)
    assert refused.returncode != 0 and not dst.exists()
    assert 'lacks 39 tensors' in refused.stderr and '--fill-missing' in refused.stderr
    filled = convert(*options, '--fill-missing')
    assert filled.returncode == 0, filled.stderr
    assert "39 tensors from timm's initialisation, not trained: cls_token" in filled.stdout
    eval(_printed_call(filled.stdout)).load_state_dict(torch.load(dst), strict=True)
    assert timm  # the printed call names it
