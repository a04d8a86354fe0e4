"""LTX-2's audio VAE (diffusers ``AutoencoderKLLTX2Audio``): config, layers, blocks, coders,
the model, its weight table and loader, the mel front end and the packing of audio latents.

Nothing is imported here.
"""
