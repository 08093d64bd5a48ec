"""The autograd both talking-heads operators (:mod:`.talking_heads_cpu`,
:mod:`.talking_heads_triton`) have: the forward keeps its five inputs and each row's
log-sum-exp, nothing of the maps; its backward operator recomputes them from those."""
from typing import Optional

from torch import Tensor
from torch.library import CustomOpDef


def register_talking_heads_autograd(forward: CustomOpDef, backward: CustomOpDef) -> None:
    """Make ``backward`` the gradient of ``forward``. ``forward(queries, keys, values,
    logit_mix, weight_mix)`` returns (output, the rows' log-sum-exp: not differentiable);
    ``backward(grad, queries, keys, values, logit_mix, weight_mix, log_sum_exp)`` returns
    the five inputs' gradients, contiguous (its fake kernel, registered here, says so)."""

    @backward.register_fake
    def _(grad: Tensor, queries: Tensor, keys: Tensor, values: Tensor, logit_mix: Tensor,
          weight_mix: Tensor, log_sum_exp: Tensor) -> tuple[Tensor, ...]:
        return tuple(t.new_empty(t.shape)
                     for t in (queries, keys, values, logit_mix, weight_mix))

    def setup_context(ctx, inputs: tuple[Tensor, ...], output: tuple[Tensor, Tensor]) -> None:
        ctx.save_for_backward(*inputs, output[1])
        ctx.mark_non_differentiable(output[1])

    def gradients(ctx, grad: Tensor, _: Optional[Tensor]) -> tuple[Tensor, ...]:
        return backward(grad.contiguous(), *ctx.saved_tensors)

    forward.register_autograd(gradients, setup_context=setup_context)
