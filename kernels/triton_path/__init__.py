"""Triton PaTH attention: forward and backward, optional forget gate, FoX on the same kernels.

README.md beside this file has the algebra, the derivation of every backward pass, the data
layout, the file map and the design decisions.
"""

from .attention import path_attention_triton, takes
from .settings import DEFAULT_SETTINGS, SUPPORTED_HEAD_DIMS, KernelSettings, chosen_configs

__all__ = ["DEFAULT_SETTINGS", "SUPPORTED_HEAD_DIMS", "KernelSettings", "chosen_configs", "path_attention_triton",
           "takes"]
