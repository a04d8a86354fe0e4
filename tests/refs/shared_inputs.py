"""Small inputs several test modules build the same way: a folder of captioned still images
(what ``ditax preprocess`` reads), a module with every parameter random, and one compiled
program of a loaded transformer's output and its gradients (:func:`output_and_grads`)."""

from __future__ import annotations

import numpy as np


def captioned_images(folder, count: int, size: int = 32, seed: int = 0):
    """``count`` random ``size x size`` PNGs in ``folder``, each with its caption beside it
    (``i.png`` + ``i.txt``: "picture i"); returns the folder."""
    import PIL.Image

    rng = np.random.default_rng(seed)
    for i in range(count):
        PIL.Image.fromarray(rng.integers(0, 255, (size, size, 3), np.uint8)).save(
            folder / f"{i}.png")
        (folder / f"{i}.txt").write_text(f"picture {i}")
    return folder


def randomise(model, seed: int):
    """An NNX ``model`` with every parameter random: biases non-zero (0.1 N), norm gains away
    from one (``gamma`` and 1-D ``weight``: 1 + 0.3 N), the rest N(0, 1)."""
    import jax
    from flax import nnx

    graphdef, state = nnx.split(model)
    leaves, tree = jax.tree_util.tree_flatten_with_path(state)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    out = []
    for (path, leaf), k in zip(leaves, keys):
        name = str(path[-2] if len(path) > 1 else path[-1])
        noise = jax.random.normal(k, leaf.shape, leaf.dtype)
        if "bias" in name:
            leaf = 0.1 * noise
        elif "gamma" in name or (leaf.ndim == 1 and "weight" in name):
            leaf = 1.0 + 0.3 * noise
        out.append(leaf)
    return nnx.merge(graphdef, jax.tree_util.tree_unflatten(tree, out))


def output_and_grads(tr, inputs: dict, names, cotangent):
    """One compiled program: ``tr(**inputs)`` and the VJP of ``cotangent`` (an array, or a
    tuple of them for a model of several outputs) with respect to ``tr`` and the inputs
    ``names``: ``(out, (tr's gradients, *the inputs' gradients))``."""
    import jax
    import jax.numpy as jnp

    ct = jax.tree.map(jnp.asarray, cotangent)

    @jax.jit
    def run(tr, *xs):
        out, pull = jax.vjp(lambda tr, *xs: tr(**{**inputs, **dict(zip(names, xs))}), tr, *xs)
        return out, pull(ct)

    return run(tr, *(inputs[n] for n in names))
