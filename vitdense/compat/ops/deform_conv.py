"""Deformable convolution (DCNv1: ``deform_conv_*``) and modulated deformable convolution
(DCNv2: ``modulated_deform_conv_*``) on torchvision's kernels."""
from __future__ import annotations

import torch
import torchvision  # noqa: F401  (registers torch.ops.torchvision)
from torch import Tensor

from vitdense.compat.ops.kernel import atomic_adds_allowed, kernel

__all__ = ['deform_conv_backward_input', 'deform_conv_backward_parameters',
           'deform_conv_forward', 'modulated_deform_conv_backward',
           'modulated_deform_conv_forward']

# where the kernels' backward moves a sample point they read as outside the map
OUTSIDE = -2.0


def _read_per_sample(buffer: Tensor, channels: int, out_hw: tuple[int, int], strict: bool,
                     op: str, name: str) -> Tensor:
    """``buffer`` (N, ...) as (N, channels, H_out, W_out): each sample's first values, as the
    compiled kernels read it; a buffer of another shape raises if ``strict``, and one with
    too few values always does."""
    shape = (channels, *out_hw)
    if buffer.shape[1:] == shape:
        return buffer
    needed = channels * out_hw[0] * out_hw[1]
    if strict or buffer[0].numel() < needed:
        raise ValueError(
            f'{op}: the {name} is {tuple(buffer.shape)}, but the kernel reads '
            f'{channels} x {out_hw[0]} x {out_hw[1]} values of each sample (deformable groups '
            f'x kernel taps{" x 2" if name == "offset" else ""}, output height, output width)'
            + ('' if strict else f' and it holds {buffer[0].numel()}'))
    return buffer.reshape(len(buffer), -1)[:, :needed].reshape(len(buffer), *shape)


def _kernel_offsets(input: Tensor, offset: Tensor, mask: Tensor | None, kernel_hw: tuple[int, int],
                    out_hw: tuple[int, int], geometry: tuple[int, ...], op: str
                    ) -> tuple[Tensor, Tensor | None]:
    """The offsets (and mask) as the compiled kernels read them, for torchvision's kernels.

    Layout: DCNv2's kernel reads each sample's first ``C x H_out x W_out`` offset and mask
    values with the output's layout, whatever the buffer's shape (DyHead computes them on a
    map twice the output's size); DCNv1's checks the offset's shape.

    Edges: a tap at ``y <= -1``, ``y >= H``, ``x <= -1`` or ``x >= W`` reads 0 and passes no
    gradient to its offset or the input; the kernels move such a tap to (-2, -2).
    torchvision's kernels differ at exactly -1 (a one-sided derivative by the offset) and
    fail on NaN, so the offset of every such tap is replaced by the one that puts it at
    (-2, -2), where both read and pass nothing. A NaN tap is moved too: it reads 0 and passes
    a gradient of 0, where the compiled backward passes NaN.
    """
    batch, _, height, width = input.shape
    kh, kw = kernel_hw
    stride_h, stride_w, pad_h, pad_w, dil_h, dil_w, _, deform_groups = geometry
    taps = deform_groups * kh * kw
    strict = mask is None   # DCNv1's kernel checks the offset's shape
    offset = _read_per_sample(offset, 2 * taps, out_hw, strict, op, 'offset')
    mask = None if mask is None else _read_per_sample(mask, taps, out_hw, strict, op, 'mask')
    pos = offset.reshape(batch, deform_groups, kh, kw, 2, *out_hw)
    rows = torch.arange(out_hw[0], device=offset.device) * stride_h - pad_h
    cols = torch.arange(out_hw[1], device=offset.device) * stride_w - pad_w
    base_y = (rows + dil_h * torch.arange(kh, device=offset.device)[:, None])[:, None, :, None]
    base_x = (cols + dil_w * torch.arange(kw, device=offset.device)[:, None])[None, :, None, :]
    y, x = base_y + pos[:, :, :, :, 0], base_x + pos[:, :, :, :, 1]
    inside = (y > -1) & (y < height) & (x > -1) & (x < width)
    moved = torch.stack([torch.where(inside, pos[:, :, :, :, 0], OUTSIDE - base_y),
                         torch.where(inside, pos[:, :, :, :, 1], OUTSIDE - base_x)], 4)
    return moved.view(offset.shape).to(offset.dtype), mask


def _write_read_part(buffer: Tensor, grad: Tensor) -> None:
    """Write ``grad`` (the gradient of the values the kernel read) into the first values of
    each sample of ``buffer``, as the kernels do; the rest keeps what it holds."""
    buffer.view(len(buffer), -1)[:, :grad[0].numel()].copy_(grad.reshape(len(grad), -1))


def _deform_conv2d_operands(input: Tensor, *tensors: Tensor | None) -> list[Tensor | None]:
    """The tensors in the dtype torchvision's kernels compute in: its CPU kernels have no
    bfloat16, so bfloat16 on the CPU computes in float32 (the callers' buffers round the
    results back)."""
    if input.dtype != torch.bfloat16 or input.device.type != 'cpu':
        return [input, *tensors]
    return [None if t is None else t.float() for t in (input, *tensors)]


def _deform_conv2d(input: Tensor, weight: Tensor, offset: Tensor, mask: Tensor | None,
                   bias: Tensor | None, geometry: tuple[int, ...]) -> Tensor:
    """torchvision's deformable convolution; ``geometry`` is (stride h, w, padding h, w,
    dilation h, w, groups, deformable groups), the offsets read as by :func:`_kernel_offsets`."""
    input, weight, offset, mask, bias = _deform_conv2d_operands(input, weight, offset, mask,
                                                                bias)
    use_mask = mask is not None
    mask = mask if use_mask else input.new_zeros(input.shape[0], 1)
    bias = bias if bias is not None else weight.new_zeros(weight.shape[0])
    return torch.ops.torchvision.deform_conv2d(input, weight, offset, mask, bias, *geometry,
                                               use_mask)


def _deform_conv2d_backward(grad_output: Tensor, input: Tensor, weight: Tensor, offset: Tensor,
                            mask: Tensor | None, bias: Tensor | None,
                            geometry: tuple[int, ...]) -> tuple[Tensor, ...]:
    """torchvision's gradients of :func:`_deform_conv2d`: by input, weight, offset, mask and
    bias."""
    input, grad_output, weight, offset, mask, bias = _deform_conv2d_operands(
        input, grad_output, weight, offset, mask, bias)
    use_mask = mask is not None
    mask = mask if use_mask else input.new_zeros(input.shape[0], 1)
    bias = bias if bias is not None else weight.new_zeros(weight.shape[0])
    with atomic_adds_allowed(input.device):
        return torch.ops.torchvision._deform_conv2d_backward(
            grad_output.contiguous(), input, weight, offset, mask, bias, *geometry, use_mask)


def _deform_conv_v1_inputs(input: Tensor, weight: Tensor, offset: Tensor, out_hw: tuple[int, int],
                           geometry: tuple[int, ...]) -> Tensor:
    """DCNv1's offsets as its kernel reads them (its shape checked, as the kernel does)."""
    return _kernel_offsets(input, offset, None, weight.shape[-2:], out_hw, geometry,
                           'deform_conv')[0]


# DCNv1's backward is two compiled calls (input then weight) and torchvision's backward gives
# every gradient at once: the first call keeps the weight's for the second, keyed by the
# tensors both are handed.
_pending_weight_grad: dict[tuple, Tensor] = {}


def _backward_key(*tensors: Tensor) -> tuple:
    return tuple((t.data_ptr(), t._version, tuple(t.shape)) for t in tensors)


@kernel
def deform_conv_forward(input: Tensor, weight: Tensor, offset: Tensor, output: Tensor,
                        columns: Tensor, ones: Tensor, kW: int, kH: int, dW: int, dH: int,
                        padW: int, padH: int, dilationW: int, dilationH: int, group: int,
                        deformable_group: int, im2col_step: int) -> None:
    """Deformable convolution (DCNv1) into ``output``; the kernel size is the weight's and
    ``columns``, ``ones`` and ``im2col_step`` are the CUDA kernel's workspace."""
    geometry = (dH, dW, padH, padW, dilationH, dilationW, group, deformable_group)
    offset = _deform_conv_v1_inputs(input, weight, offset, output.shape[-2:], geometry)
    output.copy_(_deform_conv2d(input, weight, offset, None, None, geometry))


@kernel
def deform_conv_backward_input(input: Tensor, offset: Tensor, gradOutput: Tensor,
                               gradInput: Tensor, gradOffset: Tensor, weight: Tensor,
                               columns: Tensor, kW: int, kH: int, dW: int, dH: int, padW: int,
                               padH: int, dilationW: int, dilationH: int, group: int,
                               deformable_group: int, im2col_step: int) -> None:
    """Adds the gradient by the input to ``gradInput``; writes the one by the offsets.  The
    weight's gradient, computed in the same call, is kept for
    :func:`deform_conv_backward_parameters`."""
    geometry = (dH, dW, padH, padW, dilationH, dilationW, group, deformable_group)
    read = _deform_conv_v1_inputs(input, weight, offset, gradOutput.shape[-2:], geometry)
    grad_input, grad_weight, grad_offset, _, _ = _deform_conv2d_backward(
        gradOutput, input, weight, read, None, None, geometry)
    gradInput.add_(grad_input)
    gradOffset.copy_(grad_offset)
    _pending_weight_grad.clear()
    _pending_weight_grad[_backward_key(input, offset, gradOutput)] = grad_weight


@kernel
def deform_conv_backward_parameters(input: Tensor, offset: Tensor, gradOutput: Tensor,
                                    gradWeight: Tensor, columns: Tensor, ones: Tensor, kW: int,
                                    kH: int, dW: int, dH: int, padW: int, padH: int,
                                    dilationW: int, dilationH: int, group: int,
                                    deformable_group: int, scale: float,
                                    im2col_step: int) -> None:
    """Adds ``scale`` times the gradient by the weight to ``gradWeight``: the one
    :func:`deform_conv_backward_input` computed for the same tensors, or computed here."""
    grad_weight = _pending_weight_grad.pop(_backward_key(input, offset, gradOutput), None)
    if grad_weight is None:
        geometry = (dH, dW, padH, padW, dilationH, dilationW, group, deformable_group)
        weight = gradWeight.new_zeros(gradWeight.shape)  # the weight gradient does not use it
        read = _deform_conv_v1_inputs(input, weight, offset, gradOutput.shape[-2:], geometry)
        _, grad_weight, _, _, _ = _deform_conv2d_backward(
            gradOutput, input, weight, read, None, None, geometry)
    gradWeight.add_(grad_weight, alpha=scale)


@kernel
def modulated_deform_conv_forward(input: Tensor, weight: Tensor, bias: Tensor, ones: Tensor,
                                  offset: Tensor, mask: Tensor, output: Tensor, columns: Tensor,
                                  kernel_h: int, kernel_w: int, stride_h: int, stride_w: int,
                                  pad_h: int, pad_w: int, dilation_h: int, dilation_w: int,
                                  group: int, deformable_group: int, with_bias: bool) -> None:
    """Modulated deformable convolution (DCNv2) into ``output``."""
    geometry = (stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w, group,
                deformable_group)
    offset, mask = _kernel_offsets(input, offset, mask, weight.shape[-2:], output.shape[-2:],
                                   geometry, 'modulated_deform_conv')
    output.copy_(_deform_conv2d(input, weight, offset, mask, bias if with_bias else None,
                                geometry))


@kernel
def modulated_deform_conv_backward(input: Tensor, weight: Tensor, bias: Tensor, ones: Tensor,
                                   offset: Tensor, mask: Tensor, columns: Tensor,
                                   grad_input: Tensor, grad_weight: Tensor, grad_bias: Tensor,
                                   grad_offset: Tensor, grad_mask: Tensor, grad_output: Tensor,
                                   kernel_h: int, kernel_w: int, stride_h: int, stride_w: int,
                                   pad_h: int, pad_w: int, dilation_h: int, dilation_w: int,
                                   group: int, deformable_group: int, with_bias: bool) -> None:
    """Adds the gradients by input, weight and bias to their buffers; writes those by the
    offsets and the mask (into the values the forward read)."""
    geometry = (stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w, group,
                deformable_group)
    offset, mask = _kernel_offsets(input, offset, mask, weight.shape[-2:],
                                   grad_output.shape[-2:], geometry, 'modulated_deform_conv')
    grads = _deform_conv2d_backward(grad_output, input, weight, offset, mask,
                                    bias if with_bias else None, geometry)
    grad_input.add_(grads[0])
    grad_weight.add_(grads[1])
    _write_read_part(grad_offset, grads[2])
    _write_read_part(grad_mask, grads[3])
    if with_bias:
        grad_bias.add_(grads[4])
