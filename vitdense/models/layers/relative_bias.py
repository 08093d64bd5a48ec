"""BEiT's relative position bias (Bao et al. 2022, §2.2; data2vec, BEiT v2): per block a
learned table of one bias per head for every 2-D offset between two patches of the grid, plus
three entries for the class token (class -> patch, patch -> class, class -> class), added to
the attention logits.

The table is sized for a grid (the pretraining one, ``img_size // patch_size``). A table of
another grid is resampled as BEiT does it (timm's ``resize_rel_pos_bias_table``: offsets
spread on a geometric progression, then interpolated), when it is loaded and, for inputs of
another grid, in the forward pass.
"""
from typing import Optional

import torch
import torch.nn as nn
from timm.layers import resize_rel_pos_bias_table

from .grid import Grid

#: the class token's entries after the offsets: class -> patch, patch -> class, class -> class
CLASS_ENTRIES = 3


def relative_position_index(hw: Grid, device: Optional[torch.device] = None) -> torch.Tensor:
    """(1 + N, 1 + N) rows of the table for each (query, key) pair of the class token and the
    N patches of grid ``hw``, patches in row-major order."""
    rows, cols = hw
    coords = torch.stack(torch.meshgrid(torch.arange(rows, device=device),
                                        torch.arange(cols, device=device), indexing='ij'))
    coords = coords.flatten(1)
    offsets = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0)
    patch_index = (offsets[..., 0] + rows - 1) * (2 * cols - 1) + offsets[..., 1] + cols - 1
    num_offsets = (2 * rows - 1) * (2 * cols - 1)
    index = torch.empty(1 + rows * cols, 1 + rows * cols, dtype=torch.long, device=device)
    index[1:, 1:] = patch_index
    index[0, :] = num_offsets
    index[:, 0] = num_offsets + 1
    index[0, 0] = num_offsets + 2
    return index


class RelativePositionBias(nn.Module):
    """One block's table (``table``: ((2·rows - 1)·(2·cols - 1) + 3, heads), zero-initialised
    as in BEiT) for ``grid``; :meth:`forward` gives the (heads, T, T) logit bias of T tokens:
    the class token (if ``T`` is one more than the grid's patches) and the patches."""

    def __init__(self, num_heads: int, grid: Grid) -> None:
        super().__init__()
        self.grid = tuple(grid)
        num_offsets = (2 * grid[0] - 1) * (2 * grid[1] - 1)
        self.table = nn.Parameter(torch.zeros(num_offsets + CLASS_ENTRIES, num_heads))
        self._register_load_state_dict_pre_hook(self._resample_checkpoint)

    def checkpoint_table(self, table: torch.Tensor) -> torch.Tensor:
        """A checkpoint's table (of a square grid, or of this one) resampled to this grid
        as BEiT does."""
        if table.shape == self.table.shape:
            return table
        if table.dim() != 2 or table.shape[-1] != self.table.shape[-1]:
            raise ValueError(f'checkpoint relative position table of shape {tuple(table.shape)} '
                             f'cannot be resampled to {tuple(self.table.shape)} (another '
                             f'number of heads)')
        return resize_rel_pos_bias_table(table, self.grid, self.table.shape)

    def _resample_checkpoint(self, state_dict: dict, prefix: str, *args) -> None:
        key = prefix + 'table'
        if key in state_dict:
            state_dict[key] = self.checkpoint_table(state_dict[key])

    def table_for(self, hw: Grid) -> torch.Tensor:
        """The table resampled (as BEiT does) to grid ``hw``; itself at its own grid."""
        if tuple(hw) == self.grid:
            return self.table
        rows, cols = hw
        shape = ((2 * rows - 1) * (2 * cols - 1) + CLASS_ENTRIES, self.table.shape[-1])
        return resize_rel_pos_bias_table(self.table, tuple(hw), shape, old_window_size=self.grid)

    def forward(self, hw: Grid, num_tokens: int) -> torch.Tensor:
        num_patches = hw[0] * hw[1]
        if num_tokens not in (num_patches, num_patches + 1):
            raise ValueError(f'relative position bias takes the patches of a {hw[0]}x{hw[1]} '
                             f'grid and at most a class token before them, got {num_tokens} '
                             f'tokens')
        index = relative_position_index(hw, self.table.device)[-num_tokens:, -num_tokens:]
        return self.table_for(hw)[index].permute(2, 0, 1)
