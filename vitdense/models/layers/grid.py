"""The token grid: patch tokens are laid out row-major on (rows, cols)."""

#: (rows, cols) of a grid of patch tokens
Grid = tuple[int, int]
