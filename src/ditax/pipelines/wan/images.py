"""Condition images on the host (:func:`check_image`, :func:`to_frame`, :func:`nearest_indices`):
the floor's :mod:`ditax.io.images`, where ``ditax preprocess`` reaches them too."""

from ditax.io.images import check_image, nearest_indices, to_frame

__all__ = ["check_image", "nearest_indices", "to_frame"]
