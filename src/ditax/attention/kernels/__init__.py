"""Pallas kernels owned by ditax (see :mod:`ditax.attention.kernels.flash_fwd`)."""
