"""Fully sharded data parallel training (ZeRO-3) for the largest variants (ViT-L/H, CaiT-M,
XCiT-L), with torch's FSDP2 (``torch.distributed.fsdp.fully_shard``) under mmengine's
ordinary ``Runner``.

Each rank keeps 1/world of every parameter, gradient and optimizer state; a block's full
parameters are gathered for its forward and backward and freed after. Why FSDP2 and not
mmengine's ``FlexibleRunner`` + ``FSDPStrategy`` (torch's first FSDP):

- FSDP1's parameters are flat local shards, so an optimizer's norms (LAMB's trust ratio and
  global clip, mmengine's ``clip_grad``) are norms of shards: the recipe changes silently.
  FSDP2's parameters are ``DTensor`` s: a norm of one is the norm of the full tensor (torch's
  ``clip_grad_norm_`` reduces across ranks), and code mixing in plain tensors raises instead
  of computing on a shard (mmpretrain's ``Lamb`` does; :class:`~vitdense.engine.optim.lamb.
  ShardedLamb` is the same update written for both).
- mmengine 0.10.7's strategy resume crashes (``FSDP.optim_state_dict_to_load`` called with
  the old argument order) or, with sharded folders, restarts from iteration 0, and its saves
  bypass the atomic writer. Under the ``Runner`` the hooks of our runtimes keep working:
  atomic saves and safe loads (:class:`~vitdense.engine.hooks.checkpoint.SafeCheckpointHook`),
  exact resume, the non-finite guard, ``--resume``.

Checkpoints hold full tensors, in the layout a DDP run writes (the model's keys, the
optimizer's state by parameter index): they resume, fine-tune and test with or without
sharding. ``Runner.save_checkpoint`` runs on rank 0 only, so :class:`ShardedRunner` gathers
the state on every rank first, one tensor at a time (rank 0 holds the full model and
optimizer state in host memory while it writes). Loading keeps each rank's slice of the
full tensors (state-dict hooks on the model and the optimizer). The runner also refuses what
sharding would change (:func:`check_sharded_optimizer`). Recipe: ``configs/_base_/fsdp.py``;
docs/large_models.md.
"""
from __future__ import annotations

from contextlib import contextmanager
from functools import partial
from typing import Any, Iterable, Iterator, Optional

import torch
import torch.distributed as dist
from mmengine.optim import AmpOptimWrapper
from mmengine.runner import Runner
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor, distribute_tensor

from vitdense.registry import MODEL_WRAPPERS, RUNNERS

# The residual blocks of every family: each is one unit gathered and freed as a whole.
SHARDED_BLOCKS = ('TransformerBlock', 'ClassAttentionBlock', 'XCiTClassAttentionBlock')
FSDP_RECIPE = "_base_ = [..., 'configs/_base_/fsdp.py'] (runner_type and model_wrapper_cfg)"


def gathered(value: Any) -> Any:
    """A DTensor as the full tensor (a collective: every rank calls it in the same order)."""
    return value.full_tensor() if isinstance(value, DTensor) else value


def local_slice(value: Any, like: torch.Tensor) -> Any:
    """This rank's part of the full tensor ``value``, sharded as ``like``; no communication
    (every rank holds the full tensor)."""
    if not isinstance(like, DTensor) or isinstance(value, DTensor):
        return value
    if value.shape != like.shape:
        raise ValueError(f'checkpoint tensor of shape {tuple(value.shape)} for a parameter '
                         f'of shape {tuple(like.shape)}')
    return distribute_tensor(value.to(like.device, like.dtype), like.device_mesh,
                             like.placements, src_data_rank=None)


def _slice_own_state(module: nn.Module, state_dict: dict, prefix: str, *args: Any) -> None:
    """Load pre-hook of a module owning parameters: the checkpoint's full tensors of them
    become this rank's slices, after the hooks of the modules above (a position table
    resampled) have run; a tensor of another shape is left for torch's size-mismatch error."""
    for name, param in module.named_parameters(recurse=False):
        value = state_dict.get(prefix + name)
        if torch.is_tensor(value) and value.shape == param.shape:
            state_dict[prefix + name] = local_slice(value, param.data)


@MODEL_WRAPPERS.register_module()
class FullyShardedModel(nn.Module):
    """A host model trained with FSDP2: each of its ``shard_classes`` modules (the
    backbone's blocks) one unit, the rest the root's unit. Trained by :class:`ShardedRunner`.

    Args:
        module: the model the Runner built (on the device it trains on).
        shard_classes: class names of the modules sharded as units.
        reshard_after_forward: free gathered parameters after each unit's forward (ZeRO-3);
            False keeps them until backward (ZeRO-2 like: faster, more memory).
        param_dtype: ``'bfloat16'`` / ``'float16'`` computes in that precision (gradients
            reduced and parameters kept in float32); ``None`` computes in float32.
    """

    def __init__(self, module: nn.Module, shard_classes: Iterable[str] = SHARDED_BLOCKS,
                 reshard_after_forward: bool = True, param_dtype: Optional[str] = None) -> None:
        super().__init__()
        if not dist.is_initialized():
            raise RuntimeError('FullyShardedModel needs a process group: launch with '
                               '--launcher pytorch (tools/dist_train.sh) or slurm')
        self._initialize(module)
        mesh = init_device_mesh(next(module.parameters()).device.type,
                                (dist.get_world_size(),))
        policy = MixedPrecisionPolicy(
            param_dtype=None if param_dtype is None else getattr(torch, param_dtype),
            reduce_dtype=torch.float32)
        self._shard(module, tuple(shard_classes), mesh, policy, reshard_after_forward)
        # a bound method cannot carry the attribute torch marks public hooks with
        module.register_state_dict_post_hook(partial(FullyShardedModel._full_model_state, self))
        for owner in module.modules():
            if next(owner.parameters(recurse=False), None) is not None:
                owner.register_load_state_dict_pre_hook(_slice_own_state)
        self.module = module
        self.optimizer: Optional[torch.optim.Optimizer] = None
        self._saved_state: Optional[tuple[dict, dict]] = None

    @staticmethod
    def _initialize(module: nn.Module) -> None:
        """``init_weights`` on full tensors, then rank 0's values on every rank (what the
        Runner does after wrapping a DDP model; it cannot reach sharded parameters)."""
        if hasattr(module, 'init_weights'):
            module.init_weights()
        for tensor in [*module.parameters(), *module.buffers()]:
            dist.broadcast(tensor.data, src=0)

    @staticmethod
    def _shard(module: nn.Module, shard_classes: tuple[str, ...], mesh: DeviceMesh,
               policy: MixedPrecisionPolicy, reshard_after_forward: bool) -> None:
        """Shard each ``shard_classes`` module, then the rest as the root's unit."""
        units = [m for m in module.modules() if type(m).__name__ in shard_classes]
        if not units:
            raise ValueError(f'model_wrapper_cfg.shard_classes={list(shard_classes)} matches '
                             f'no module of {type(module).__name__}: name its blocks\' classes')
        for unit in units:
            fully_shard(unit, mesh=mesh, mp_policy=policy,
                        reshard_after_forward=reshard_after_forward)
        fully_shard(module, mesh=mesh, mp_policy=policy,
                    reshard_after_forward=reshard_after_forward)

    def _full_model_state(self, module: nn.Module, state_dict: dict, prefix: str,
                          local_metadata: dict) -> None:
        """State-dict post-hook: full tensors (gathered, or those of :meth:`state_saved`)."""
        saved = self._saved_state[0] if self._saved_state is not None else None
        for key, value in state_dict.items():
            state_dict[key] = saved[key[len(prefix):]] if saved is not None else gathered(value)

    def _full_optimizer_state(self, optimizer: torch.optim.Optimizer, state_dict: dict) -> dict:
        """Optimizer state-dict post-hook: full tensors (in new dicts: the state dict's
        entries are the optimizer's own)."""
        if self._saved_state is not None:
            return self._saved_state[1]
        state = {index: {name: gathered(value) for name, value in entry.items()}
                 for index, entry in state_dict['state'].items()}
        return dict(state_dict, state=state)

    def attach_optimizer(self, optim_wrapper: Any) -> None:
        """Check the optimizer settings, then save its state whole and load it sliced."""
        check_sharded_optimizer(optim_wrapper)
        self.optimizer = optim_wrapper.optimizer
        self.optimizer.register_state_dict_post_hook(self._full_optimizer_state)
        self.optimizer.register_load_state_dict_pre_hook(_slice_optimizer_state)

    @contextmanager
    def state_saved(self) -> Iterator[None]:
        """Gather the model's and optimizer's full state on every rank (collectives), and
        answer ``state_dict()`` with it inside: rank 0 alone writes the checkpoint."""
        self._saved_state = None
        self._saved_state = (self.module.state_dict(), self.optimizer.state_dict())
        try:
            yield
        finally:
            self._saved_state = None

    def train_step(self, data: Any, optim_wrapper: Any) -> dict:
        """The model's own train step; gradients are reduce-scattered in its backward."""
        if self.optimizer is None:
            raise RuntimeError('FullyShardedModel is trained by vitdense.ShardedRunner, which '
                               'saves and loads its optimizer state: set runner_type='
                               f"'vitdense.ShardedRunner' ({FSDP_RECIPE})")
        return self.module.train_step(data, optim_wrapper)

    def val_step(self, data: Any) -> list:
        """The model's validation step (every rank runs the same number of them)."""
        return self.module.val_step(data)

    def test_step(self, data: Any) -> list:
        """The model's test step (every rank runs the same number of them)."""
        return self.module.test_step(data)


def _slice_optimizer_state(optimizer: torch.optim.Optimizer, state_dict: dict) -> dict:
    """Optimizer load pre-hook: full state tensors become this rank's slices."""
    params = [p for group in optimizer.param_groups for p in group['params']]
    state = {index: {name: local_slice(value, params[index].data)
                     if torch.is_tensor(value) and value.dim() else value
                     for name, value in entry.items()}
             for index, entry in state_dict['state'].items()}
    return dict(state_dict, state=state)


@RUNNERS.register_module()
class ShardedRunner(Runner):
    """mmengine's ``Runner`` for a :class:`FullyShardedModel`: every rank gathers the full
    state for a checkpoint that rank 0 writes (``Runner.save_checkpoint`` runs on rank 0
    only), and the optimizer's state is saved whole and loaded sliced."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not isinstance(self.model, FullyShardedModel):
            raise TypeError(f"runner_type='vitdense.ShardedRunner' trains model_wrapper_cfg."
                            f"type='vitdense.FullyShardedModel', got {type(self.model).__name__}"
                            f' ({FSDP_RECIPE})')

    def build_optim_wrapper(self, optim_wrapper: Any) -> Any:
        """The Runner's optimizer wrapper, attached to the sharded model once."""
        built = super().build_optim_wrapper(optim_wrapper)
        if self.model.optimizer is None:
            self.model.attach_optimizer(built)
        return built

    def _init_model_weights(self) -> None:
        """Nothing: :class:`FullyShardedModel` initialised the weights before sharding."""

    def save_checkpoint(self, *args: Any, **kwargs: Any) -> None:
        """``Runner.save_checkpoint`` (rank 0) with the state every rank gathered."""
        with self.model.state_saved():
            super().save_checkpoint(*args, **kwargs)


def check_sharded_optimizer(optim_wrapper: Any) -> None:
    """Refuse optimizer settings that do not train the same under sharding, naming the fix."""
    if isinstance(optim_wrapper, AmpOptimWrapper):
        raise ValueError('optim_wrapper.type=AmpOptimWrapper (--amp) under FullyShardedModel: '
                         'use model_wrapper_cfg.param_dtype=\'bfloat16\' (the FSDP2 mixed '
                         'precision) and optim_wrapper.type=OptimWrapper')
    if not hasattr(optim_wrapper, 'optimizer'):
        raise ValueError(f'{type(optim_wrapper).__name__} under FullyShardedModel: one '
                         'optimizer (optim_wrapper.type=OptimWrapper) is supported')
    optimizer = optim_wrapper.optimizer
    if type(optimizer).__name__ == 'Lamb' and type(optimizer).__module__.startswith('mmpretrain'):
        raise ValueError("optim_wrapper.optimizer.type='Lamb' (mmpretrain's) adds sharded "
                         'gradients to a plain tensor for its global norm; under '
                         "FullyShardedModel set optim_wrapper.optimizer.type="
                         "'vitdense.ShardedLamb' (the same update, norms of full tensors)")
