"""Text and image encoders that model families share (a shared room: it registers no family
and imports none).

- :mod:`.t5`: the T5-family encoder (T5 v1.1 / mT5: FLUX.1's ``text_encoder_2``);
- :mod:`.umt5`: UMT5, the same with a relative bias per layer (Wan's ``text_encoder``) and
  Wan's ``encode_prompt``;
- :mod:`.clip`: the CLIP towers (the image encoder + preprocessing of Wan image-to-video, the
  text encoder + pooled vector of FLUX.1);
- :mod:`.tokenizer`: tokenizers (a ``tokenizer.json`` as saved; CLIP's and T5's as
  transformers builds them);
- :mod:`.inputs`: what the text encoders' calls share (the compute dtype, the token mask).

Nothing is imported here, so the family registry's discovery (which walks the subpackages of
:mod:`ditax.models`) does not start JAX; import the module you need.
"""
