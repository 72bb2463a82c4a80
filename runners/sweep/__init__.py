"""Sweeps: grids and sweep files (`grid`, the shipped files in files/), which pack trains next
(`schedule`), where packs train (`executors`), and the sweep itself (`orchestrate`)."""
