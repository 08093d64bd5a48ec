"""The token grid: patch tokens are laid out row-major on (rows, cols)."""
import torch
import torch.nn.functional as F

#: (rows, cols) of a grid of patch tokens
Grid = tuple[int, int]


def pad_to_multiple(images: torch.Tensor, multiple: int) -> torch.Tensor:
    """``images`` (B, C, H, W) zero-padded at the bottom and right to multiples of
    ``multiple``: with no branch on the size and no modulo of a negative size, an exported
    graph pads any input (by zero pixels where none are needed)."""
    pad_h, pad_w = ((multiple - size % multiple) % multiple
                    for size in (images.shape[2], images.shape[3]))
    return F.pad(images, (0, pad_w, 0, pad_h))


def tokens_to_map(tokens: torch.Tensor, hw: Grid) -> torch.Tensor:
    """Patch tokens (the last rows·cols of the sequence) as a (B, C, rows, cols) map: a
    channels-last view, no copy."""
    patches = tokens[:, tokens.shape[1] - hw[0] * hw[1]:]
    return patches.transpose(1, 2).reshape(tokens.shape[0], -1, *hw)
