"""Command lines that analyse models and runs (parity, FLOPs, pictures, log plots)."""
