"""Block-sparse attention for video tokens: the tile-major token order that makes a
spatio-temporal tile one contiguous kernel block (:mod:`.tiles`), and the training-free block
masks over those tiles (:mod:`.masks`: sliding-tile), held as tile x tile tables
(:class:`~ditax.attention.sparse.masks.BlockTable`; never a dense ``L x L`` mask) that the
``splash`` kernel reads to skip whole blocks (``splash_attention(..., block_table=)``).
:mod:`.layout` is what a model does with them under ``attention.sparsity`` (the Wan
transformers: tokens tile-major between embedding and head, self-attention through splash with
the table). Not yet wired into ``flash``, the sequence-parallel wrappers or radial masks
(issue 58).
"""
