"""Triton PaTH attention: forward and backward, optional forget gate, FoX on the same kernels.

README.md beside this file has the algebra, the derivation of every backward pass, the data
layout and the file map.
"""

from .attention import path_attention_triton, takes
from .settings import SUPPORTED_HEAD_DIMS, chosen_configs, gpu_configs, kernel_launch_table

__all__ = ["SUPPORTED_HEAD_DIMS", "chosen_configs", "gpu_configs", "kernel_launch_table", "path_attention_triton",
           "takes"]
