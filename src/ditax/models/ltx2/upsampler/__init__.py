"""LTX-2's latent upsampler (diffusers ``LTX2LatentUpsamplerModel``): config, model and
loader.

Nothing is imported here.
"""
