"""LTX-2's audio+video transformer (diffusers ``LTX2VideoTransformer3DModel``): the model
(:mod:`.model`), its blocks, attention, embeddings and RoPE, the inputs' rules, the build and
weight table, and its loaders (diffusers folders: :mod:`.loading`; Lightricks' single files:
:mod:`.single_file`, :mod:`.original_names`).

Nothing is imported here.
"""
