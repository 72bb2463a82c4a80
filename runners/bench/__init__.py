"""Benchmarks that print tables (`pathbench bench data|torch|kernel`), the Triton kernel's
ahead-of-time compilation (`triton_prewarm`) and the GPU check (`gpu_check`)."""
