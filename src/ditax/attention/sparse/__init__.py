"""Block-sparse attention for video tokens: the tile-major token order that makes a
spatio-temporal tile one contiguous kernel block (:mod:`.tiles`), and the training-free block
masks over those tiles (:mod:`.masks`: sliding-tile, radial), held as tile x tile tables
(:class:`~ditax.attention.sparse.masks.BlockTable`; never a dense ``L x L`` mask) that the
``splash`` kernel (``splash_attention(..., block_table=)``) and ditax's ``flash`` kernels
(``flash_attention(..., block_table=)``: only the listed live blocks visited,
:mod:`ditax.attention.kernels.flash_sparse`) read to skip whole blocks.
:mod:`.layout` is what a model does with them under ``attention.sparsity`` (the Wan
transformers: tokens tile-major between embedding and head, self-attention through splash or
flash with the table); ``attention.dense_steps`` is the sampler's
(:mod:`ditax.pipelines.sparse_steps`). ``vsa`` (trainable, :mod:`.vsa`) picks its key tiles
per input; :mod:`.vsa_table` runs its fine pass on Pallas kernels that read the picks as a
scalar-prefetched table (``attention.vsa_fine=table``; ``attention.vsa_group`` picked tiles a
grid step). Not yet wired into the
sequence-parallel wrappers (issue 58).
"""
