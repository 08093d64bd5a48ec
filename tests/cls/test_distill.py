"""Hard distillation (DeiT/CaiT): loss value, frozen teacher, checkpoints without the teacher."""
import math
from pathlib import Path

import pytest
import torch
from mmpretrain.models.utils import ClsDataPreprocessor
from mmpretrain.registry import MODELS
from mmpretrain.structures import DataSample

from vitdense.cls.classifier import renormalize

NUM_CLASSES = 3
TINY_VIT = dict(type='vitdense.ViT', arch=dict(embed_dims=16, num_layers=4, num_heads=2),
                img_size=32, patch_size=8, out_type='cls_token')
HEAD = dict(type='LinearClsHead', num_classes=NUM_CLASSES, in_channels=16)


def constant_logits(model: torch.nn.Module, logits: list[float]) -> None:
    """Make the classifier output ``logits`` for every input (zero weights, given bias)."""
    with torch.no_grad():
        model.head.fc.weight.zero_()
        model.head.fc.bias.copy_(torch.tensor(logits))


@pytest.fixture
def teacher_files(tmp_path: Path) -> tuple[str, str]:
    """A small teacher's config file and a checkpoint in which it always predicts class 2."""
    model = dict(type='ImageClassifier', backbone=TINY_VIT, neck=None, head=HEAD)
    config = tmp_path / 'teacher.py'
    config.write_text(f'model = {model!r}\n')
    teacher = MODELS.build(model)
    constant_logits(teacher, [0.0, 0.0, 5.0])
    checkpoint = tmp_path / 'teacher.pth'
    torch.save({'state_dict': teacher.state_dict()}, checkpoint)
    return str(config), str(checkpoint)


@pytest.fixture
def student(teacher_files: tuple[str, str]) -> torch.nn.Module:
    config, checkpoint = teacher_files
    model = MODELS.build(dict(
        type='vitdense.ViTClassifier', backbone=TINY_VIT, neck=None,
        head=dict(HEAD, loss=dict(type='LabelSmoothLoss', label_smooth_val=0.1,
                                  mode='original')),
        teacher=dict(config=config, checkpoint=checkpoint)))
    model.init_weights()
    return model


def test_loss_is_mean_of_label_and_teacher_label_losses(student: torch.nn.Module) -> None:
    constant_logits(student, [1.0, 2.0, 0.0])
    samples = [DataSample().set_gt_label(0), DataSample().set_gt_label(1)]
    losses = student.loss(torch.randn(2, 3, 32, 32), samples)

    log_z = math.log(math.e ** 1 + math.e ** 2 + math.e ** 0)
    log_p = [1 - log_z, 2 - log_z, 0 - log_z]
    eps = 0.1

    def smoothed_ce(label: int) -> float:
        return -sum(((1 - eps) * (k == label) + eps / NUM_CLASSES) * log_p[k]
                    for k in range(NUM_CLASSES))

    label_loss = (smoothed_ce(0) + smoothed_ce(1)) / 2
    teacher_loss = -log_p[2]  # the teacher always says class 2
    assert losses['loss'].item() == pytest.approx(0.5 * label_loss, rel=1e-5)
    assert losses['loss_distill'].item() == pytest.approx(0.5 * teacher_loss, rel=1e-5)


def test_teacher_is_frozen_in_eval_mode_with_its_checkpoint(student: torch.nn.Module) -> None:
    student.train()
    assert not student.teacher.training
    assert not any(p.requires_grad for p in student.teacher.parameters())
    # the student's init_weights ran after the teacher loaded its checkpoint
    assert student.teacher.head.fc.bias.tolist() == [0.0, 0.0, 5.0]
    assert not student.teacher.head.fc.weight.any()


def test_checkpoints_leave_the_teacher_out(student: torch.nn.Module,
                                           teacher_files: tuple[str, str]) -> None:
    state = student.state_dict()
    assert state and not any(k.startswith('teacher.') for k in state)
    config, checkpoint = teacher_files
    fresh = MODELS.build(dict(type='vitdense.ViTClassifier', backbone=TINY_VIT, neck=None,
                              head=HEAD, teacher=dict(config=config, checkpoint=checkpoint)))
    fresh.load_state_dict(state, strict=True)  # no missing teacher keys reported
    assert torch.equal(fresh.backbone.cls_token, student.backbone.cls_token)


def test_teacher_sees_the_batch_in_its_own_normalisation() -> None:
    rgb = ClsDataPreprocessor(mean=[123.675, 116.28, 103.53], std=[58.395, 57.12, 57.375],
                              to_rgb=True)
    bgr = ClsDataPreprocessor(mean=[103.53, 116.28, 123.675], std=[57.375, 57.12, 58.395],
                              to_rgb=False)
    images = [torch.randint(0, 256, (3, 8, 8), dtype=torch.uint8) for _ in range(2)]
    student_in = rgb(dict(inputs=images))['inputs']
    teacher_in = bgr(dict(inputs=images))['inputs']
    torch.testing.assert_close(renormalize(student_in, rgb, bgr), teacher_in)
