"""LTX-2's vocoder (diffusers ``LTX2Vocoder``, LTX-2.3's with bandwidth extension): config,
layers, the model, the BWE stage and the loader.

Nothing is imported here.
"""
