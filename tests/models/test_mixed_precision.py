"""Every family trains under autocast (bf16 and fp16 on the CPU): finite outputs and
gradients close to float32, talking heads, XCA's normalisation and GPSA included."""
import pytest
import torch

from common import TINY_ARCH, TINY_CONVIT_ARCH
from vitdense.models.backbones import CaiT, ConViT, ViT, XCiT
from vitdense.models.layers import CrossCovarianceAttention
from vitdense.models.layers import talking_heads

FAMILIES = {ViT: TINY_ARCH, CaiT: TINY_ARCH, XCiT: TINY_ARCH, ConViT: TINY_CONVIT_ARCH}
# error relative to the largest entry, of each output and of all gradients together: bf16
# keeps 8 bits of mantissa, fp16 11; the stem's gradient (a sum over every patch of
# half-precision products) is the least precise, 12% off under bf16 for tiny CaiT
TOLERANCE = {torch.bfloat16: (5e-2, 2e-1), torch.float16: (1e-2, 5e-2)}


def relative_error(value: torch.Tensor, reference: torch.Tensor) -> float:
    return float((value.float() - reference).abs().max() / reference.abs().max())


def train_step(model, image, dtype=None) -> tuple[list, list]:
    model.zero_grad()
    with torch.autocast('cpu', dtype=dtype or torch.bfloat16, enabled=dtype is not None):
        outs = model(image)
        loss = sum((out.float() ** 2).mean() for out in outs)
    loss.backward()
    return [o.detach().float() for o in outs], [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize('dtype', [torch.bfloat16, torch.float16])
@pytest.mark.parametrize('cls, path', [(cls, 'maps') for cls in FAMILIES if cls is not CaiT] +
                         [(CaiT, path)  # talking heads' paths
                          for path in talking_heads.available_paths(torch.device('cpu'))])
def test_autocast_training_is_finite_and_close_to_float32(cls, path, dtype):
    torch.manual_seed(0)
    model = cls(FAMILIES[cls], out_indices=[0, 1, 2, 3]).train()
    image = torch.randn(2, 3, 64, 96)  # a 4 × 6 grid
    with talking_heads.forced_path(model, path):
        outs, grads = train_step(model, image)
        half_outs, half_grads = train_step(model, image, dtype)
    out_tolerance, grad_tolerance = TOLERANCE[dtype]
    for out, half in zip(outs, half_outs):
        assert torch.isfinite(half).all() and relative_error(half, out) < out_tolerance
    for grad, half in zip(grads, half_grads):
        assert torch.isfinite(half).all()
    # gradients as a whole (a few tiny ones are all rounding)
    flat, half_flat = torch.cat([g.flatten() for g in grads]), torch.cat(
        [g.flatten() for g in half_grads])
    assert relative_error(half_flat, flat) < grad_tolerance


def test_xca_does_not_overflow_float16_at_detection_token_counts():
    """q kᵀ sums over every token: 16,800 of them (800 × 1344 at patch 8) with features
    of mean 3 reach ~10⁵, past float16's 65,504, unless q and k are normalised first."""
    torch.manual_seed(0)
    xca = CrossCovarianceAttention(64, 2)
    x = torch.randn(1, 16800, 64) + 3
    reference = xca(x)
    with torch.autocast('cpu', dtype=torch.float16):
        out = xca(x)
    assert out.dtype == torch.float16 and torch.isfinite(out).all()
    assert relative_error(out, reference) < 1e-2
