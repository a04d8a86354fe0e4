"""Block-sparse attention for video tokens: the tile-major token order that makes a
spatio-temporal tile one contiguous kernel block (:mod:`.tiles`), and the training-free block
masks over those tiles (:mod:`.masks`: sliding-tile), held as tile x tile tables
(:class:`~ditax.attention.sparse.masks.BlockTable`; never a dense ``L x L`` mask) that the
``splash`` kernel reads to skip whole blocks (``splash_attention(..., block_table=)``).
Not yet wired into the transformers, the config (``attention.sparsity``), ``flash`` or the
sequence-parallel wrappers (issue 58).
"""
