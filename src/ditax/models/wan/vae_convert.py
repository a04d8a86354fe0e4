"""Load a diffusers ``AutoencoderKLWan`` folder into :class:`~ditax.models.wan.vae.WanVAE`.

Key table: an NNX parameter path joined with dots is the diffusers key, except that
``resample_conv`` is diffusers' ``resample.1`` (the conv inside an ``nn.Sequential``).
Tensor rules (torch → ours), chosen by the diffusers tensor's rank and our parameter's rank:

- 5-D conv ``[O, I, kt, kh, kw]`` → ``[kt, kh, kw, I, O]``
- 4-D conv ``[O, I, kh, kw]`` → ``[kh, kw, I, O]``; a 1x1 conv into a 2-D ``Dense`` → ``[I, O]``
- norm ``gamma`` ``[C, 1, 1(, 1)]`` → ``[C]``
- 1-D bias → unchanged

Every converted tensor's shape is checked against the model built from ``config.json``; any
missing or unexpected key raises :class:`VAELoadError` listing them all.
"""

from __future__ import annotations

import json
import pathlib

import jax.numpy as jnp
import numpy as np
from flax import nnx

from ditax.models.wan.vae import WanVAE, WanVAEConfig

WEIGHTS_NAME = "diffusion_pytorch_model.safetensors"
INDEX_NAME = "diffusion_pytorch_model.safetensors.index.json"

_RENAMES = (("resample_conv", "resample.1"),)


class VAELoadError(ValueError):
    """A VAE checkpoint does not match the model its config describes."""


def diffusers_key(path: tuple) -> str:
    """NNX parameter path → diffusers state-dict key."""
    key = ".".join(str(p) for p in path)
    for ours, theirs in _RENAMES:
        key = key.replace(ours, theirs)
    return key


def convert_tensor(key: str, value: np.ndarray, target_shape: tuple[int, ...]) -> np.ndarray:
    """Apply the layout rule for one tensor and check the resulting shape against the model."""
    if key.endswith(".gamma"):
        out = value.reshape(value.shape[0])
    elif value.ndim == 5:
        out = value.transpose(2, 3, 4, 1, 0)
    elif value.ndim == 4 and len(target_shape) == 2:
        if value.shape[2:] != (1, 1):
            raise VAELoadError(f"{key}: expected a 1x1 conv for a pointwise layer, got shape {value.shape}")
        out = value[:, :, 0, 0].T
    elif value.ndim == 4:
        out = value.transpose(2, 3, 1, 0)
    else:
        out = value
    if tuple(out.shape) != tuple(target_shape):
        raise VAELoadError(f"{key}: checkpoint shape {tuple(value.shape)} converts to {tuple(out.shape)}, "
                           f"but the model built from config.json expects {tuple(target_shape)}.")
    return out


def _read_one(path: pathlib.Path) -> dict[str, np.ndarray]:
    """All tensors of one .safetensors file as numpy arrays (BF16 read via its header)."""
    from safetensors import safe_open

    out, raw = {}, []
    with safe_open(str(path), framework="np") as f:
        for name in f.keys():
            if f.get_slice(name).get_dtype() == "BF16":
                raw.append(name)
            else:
                out[name] = f.get_tensor(name)
    if raw:  # numpy has no bfloat16; read those tensors straight from the file's byte ranges
        import ml_dtypes

        with open(path, "rb") as fh:
            n = int.from_bytes(fh.read(8), "little")
            header = json.loads(fh.read(n))
            for name in raw:
                start, end = header[name]["data_offsets"]
                fh.seek(8 + n + start)
                buf = fh.read(end - start)
                out[name] = np.frombuffer(buf, ml_dtypes.bfloat16).reshape(header[name]["shape"])
    return out


def read_weights(folder: pathlib.Path) -> dict[str, np.ndarray]:
    """Tensors of a diffusers model folder (single file or sharded with an index)."""
    if (folder / WEIGHTS_NAME).exists():
        return _read_one(folder / WEIGHTS_NAME)
    if (folder / INDEX_NAME).exists():
        index = json.loads((folder / INDEX_NAME).read_text())
        out = {}
        for shard in sorted(set(index["weight_map"].values())):
            out.update(_read_one(folder / shard))
        return out
    raise FileNotFoundError(f"load_vae: no {WEIGHTS_NAME} (or {INDEX_NAME}) in {folder}; "
                            "save the model with diffusers' save_pretrained(safe_serialization=True).")


def resolve_folder(path) -> pathlib.Path:
    """A VAE folder, or a pipeline folder's ``vae/`` subfolder."""
    p = pathlib.Path(path)
    for cand in (p, p / "vae"):
        if (cand / "config.json").exists() and ((cand / WEIGHTS_NAME).exists() or (cand / INDEX_NAME).exists()):
            return cand
    raise FileNotFoundError(f"load_vae: {p} is neither a diffusers VAE folder (config.json + {WEIGHTS_NAME}) "
                            "nor a pipeline folder with a vae/ subfolder.")


def load_vae(path, dtype="float32") -> WanVAE:
    """Read a diffusers ``AutoencoderKLWan`` folder into a :class:`WanVAE` with params in ``dtype``."""
    folder = resolve_folder(path)
    cfg = WanVAEConfig.from_diffusers(json.loads((folder / "config.json").read_text()))
    jdtype = jnp.dtype(dtype)
    abstract = nnx.eval_shape(lambda: WanVAE(cfg, dtype=jdtype, rngs=nnx.Rngs(0)))
    graphdef, abs_state = nnx.split(abstract)
    flat = list(nnx.to_flat_state(abs_state))
    tensors = read_weights(folder)

    expected = {diffusers_key(p): (p, v) for p, v in flat}
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    if missing or unexpected:
        raise VAELoadError(f"load_vae({folder}): checkpoint does not match config.json.\n"
                           f"  missing keys ({len(missing)}): {missing}\n"
                           f"  unexpected keys ({len(unexpected)}): {unexpected}")
    new = []
    for key, (p, v) in expected.items():
        arr = convert_tensor(key, tensors[key], v.get_value().shape)
        new.append((p, v.replace(jnp.asarray(arr, dtype=jdtype))))
    return nnx.merge(graphdef, nnx.from_flat_state(new))
