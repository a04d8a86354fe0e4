"""VAEs by kind, shared by whichever families use them (a shared room: it registers no family
and imports none). A family names the VAE it reads; the VAE does not know the family.

- :mod:`.wan`: diffusers' ``AutoencoderKLWan`` (Wan 2.1's video VAE, also Qwen-Image's, and
  Wan 2.2 TI2V's residual one), with its weight table in :mod:`.wan.convert`;
- :mod:`.kl`: diffusers' ``AutoencoderKL`` (FLUX.1's image VAE; SD-style folders read through
  it too), with its weight table and loader in :mod:`.kl.convert`.

Nothing is imported here, so the family registry's discovery (which walks the subpackages of
:mod:`ditax.models`) does not start JAX; import the kind you need.
"""
