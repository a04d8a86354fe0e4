"""What FLUX.1's and FLUX.2's :class:`~ditax.models.base.ModelFamily` share
(:class:`BflFamily`): still images on the grid of a ``2 ** (levels - 1)`` VAE and 2 x 2
tokens, the forwarding methods (:class:`~ditax.models.common.family.PartsFamily`), the FLOPs
sum of the two block kinds, and the embedded guidance of training. The family gives its labels,
its parts and its FLOPs (``_forward_flops``).
"""

from __future__ import annotations

from ditax.errors import ConfigError
from ditax.io.files import folder_vae_json
from ditax.models.common.family import FamilyParts, PartsFamily
from ditax.models.registry import resolve

VAE_FACTOR = 8    # FLUX.1's and FLUX.2's VAEs: spatial downsampling (four levels)
PACK = 2          # 2 x 2 latent pixels are one token


def vae_factor(vae=None) -> int:
    """Pixels per latent pixel of a FLUX VAE: 2 per level but the last,
    ``2 ** (len(block_out_channels) - 1)``. ``vae``: its ``config.json`` dict, or any object
    with ``block_out_channels`` (a VAE config); None: :data:`VAE_FACTOR`."""
    if vae is None:
        return VAE_FACTOR
    widths = vae.get("block_out_channels") if isinstance(vae, dict) else getattr(
        vae, "block_out_channels", None)
    if not widths:
        raise ConfigError(f"the VAE config has no block_out_channels ({vae!r}); give the "
                          f"folder's vae/config.json")
    return 2 ** (len(widths) - 1)


def bfl_parts(package: str, module: str, encoders: str,
              load: str = "loading:load_transformer") -> FamilyParts:
    """The parts of a FLUX family laid out as FLUX.1 and FLUX.2 are: in ``package``, its
    ``config``, ``build``, ``convert``, ``loading`` (``LOADER``) and ``single_file`` modules,
    the transformer class ``transformer:<module>``, the preprocess ``encoders`` and ``load``
    (``"module:name"`` within the package)."""
    return FamilyParts(
        check=f"{package}.config:check_transformer", module=f"{package}.transformer:{module}",
        build=f"{package}.build", loader=f"{package}.loading:LOADER", load=f"{package}.{load}",
        folder_summary="ditax.models.common.bfl.loading:folder_summary",
        single_file_check=f"{package}.single_file:check_single_file",
        single_file_write=f"{package}.single_file:write_diffusers_folder",
        weight_table=f"{package}.convert:weight_table", encoders=f"{package}.{encoders}")


class BflFamily(PartsFamily):
    """A FLUX family: ``label`` (its name in messages), ``packing`` (what the 2 x 2 tokens
    are called), ``token_grid`` (True: latents are the transformer's token grid, one token a
    latent pixel — FLUX.2's patchified latents; False: the VAE's grid, 2 x 2 latent pixels a
    token), ``guided`` / ``unguided`` (its models with and without a guidance embedding) and
    ``default_guidance`` (``"module:Name"`` of the guidance trained with)."""

    default_frames = 1    # still images
    label: str
    packing: str
    token_grid: bool
    guided: str
    unguided: str
    default_guidance: str

    text_dim = property(lambda self: self.model.joint_attention_dim)   # Dt of the text

    @classmethod
    def latent_grid(cls, num_frames, height, width, vae=None):
        """Latent ``(1, Y, X)`` of one image for a VAE of factor ``s`` (``vae``: its config,
        :func:`vae_factor`; None: 8): ``H/s x W/s``, or ``H/(2s) x W/(2s)`` on the token grid;
        the sides multiples of ``2s``."""
        s = vae_factor(vae)
        f = s * PACK
        if num_frames != 1:
            raise ConfigError(f"{num_frames} frames: {cls.label} makes still images; use 1 "
                              f"frame")
        if height < f or width < f or height % f or width % f:
            raise ConfigError(f"height x width = {height}x{width} must be multiples of {f} "
                              f"(the VAE's {s}x and the 2x2 {cls.packing})")
        g = f if cls.token_grid else s
        return 1, height // g, width // g

    @classmethod
    def size_rule(cls, root=None, model=None):
        """Sides: multiples of the VAE's factor (``root/vae/config.json``'s, 8 when the folder
        has none) x the 2x2 tokens; still images (one frame). Latents on the token grid take
        any size; the VAE's, multiples of 2."""
        from ditax.models.size_rule import SizeRule

        s = vae_factor(folder_vae_json(root))
        latent = {} if cls.token_grid else dict(latent=(1, PACK, PACK))
        return SizeRule(cls.name, s * PACK, None,
                        f"the VAE's {s}x and the {PACK}x{PACK} {cls.packing}", **latent)

    @classmethod
    def folder_latent_grid(cls, root, num_frames, height, width):
        """:meth:`latent_grid` with the factor of ``root/vae/config.json`` (8 when the folder
        has none, e.g. a hub id), the sizes on the folder's :meth:`size_rule`."""
        cls.size_rule(root).check(height, width, None, error=ConfigError)
        return cls.latent_grid(num_frames, height, width, folder_vae_json(root))

    def tokens_per_sample(self, latent_shape) -> int:
        _, _, y, x = latent_shape
        return y * x if self.token_grid else (y // PACK) * (x // PACK)

    def _forward_flops(self, latent_shape, text_len: int) -> dict:
        """Forward matmul FLOPs of one sample: ``{"double": {part: n}, "single": {part: n},
        "rest": n}`` (the family's)."""
        raise NotImplementedError

    def flops_per_sample(self, latent_shape, text_len: int) -> float:
        """Forward + backward = 3 × forward matmul FLOPs (no remat recompute; the parts:
        :meth:`_forward_flops`)."""
        f = self._forward_flops(latent_shape, text_len)
        return 3.0 * (sum(f["double"].values()) + sum(f["single"].values()) + f["rest"])

    # -- training -------------------------------------------------------------------------------

    def check_flow(self) -> None:
        """``flow.guidance`` needs a guidance embedding (:attr:`guided`, not
        :attr:`unguided`); then the family's rule of ``flow.dynamic_shift``
        (:meth:`check_shift`)."""
        f = self.flow
        if f is None:
            return
        if f.guidance is not None and not self.model.guidance_embeds:
            raise ConfigError(f"flow.guidance={f.guidance}: this {self.label} model has no "
                              f"guidance embedding (model.guidance_embeds=false, "
                              f"{self.unguided}); remove flow.guidance")
        self.check_shift(f)

    def check_shift(self, flow) -> None:
        """The family's rule of ``flow.dynamic_shift`` and ``flow.shift``."""

    @property
    def guidance(self) -> float | None:
        """The guidance input while training: ``flow.guidance`` or the family's default for a
        model with a guidance embedding (:attr:`guided`), None without (:attr:`unguided`)."""
        if not self.model.guidance_embeds:
            return None
        given = None if self.flow is None else self.flow.guidance
        return resolve(self.default_guidance) if given is None else float(given)


__all__ = ["BflFamily", "PACK", "VAE_FACTOR", "bfl_parts", "vae_factor"]
