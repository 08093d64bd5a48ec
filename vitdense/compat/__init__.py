"""Fixes that make the host libraries work on this stack (torch 2.14, numpy 2)."""
