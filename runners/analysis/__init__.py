"""Analysis of run records: records as one frame (`records`), cells and the solved rule
(`cells`, `solved`), tables (`tables`), figures (`figures`) and attention maps
(`attention_maps`)."""
