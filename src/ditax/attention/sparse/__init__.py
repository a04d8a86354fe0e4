"""Block-sparse attention for video tokens: the tile-major token order that makes a
spatio-temporal tile one contiguous kernel block (:mod:`.tiles`), and the training-free block
masks over those tiles (:mod:`.masks`: sliding-tile), held as tile x tile tables (no dense
``L x L`` mask). Not yet wired into the transformers or the kernels (issue 58)."""
