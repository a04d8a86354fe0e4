"""FLUX.1 as a :class:`~ditax.models.base.ModelFamily`: the transformer, its loader and
shardings. Training inputs (pooled text, position ids, guidance), the text encoders and the
VAE come with the Flux pipeline and trainer; until then :meth:`FluxFamily.apply` and
:meth:`FluxFamily.load_encoders` refuse in one line."""

from __future__ import annotations

from flax import nnx

from ditax.errors import ConfigError
from ditax.models.base import ModelFamily, register_family

VAE_FACTOR = 8    # the Flux VAE's spatial downsampling
PACK = 2          # 2 x 2 latent patches are packed into one token (C_in = 4 x latent C)


@register_family
class FluxFamily(ModelFamily):
    """``model``: :class:`ditax.models.flux.config.FluxConfig`; ``attention``: an
    :class:`~ditax.attention.config.AttentionConfig` (None: ``xla``)."""

    name = "flux"

    def check(self, mesh_sizes=None) -> None:
        from ditax.models.flux.config import check_transformer

        check_transformer(self.model, self.attention, mesh_sizes)

    @property
    def latent_channels(self) -> int:
        """The VAE latent channels: one token packs ``2 x 2`` latent pixels."""
        return self.model.in_channels // PACK ** 2

    text_dim = property(lambda self: self.model.joint_attention_dim)   # Dt of the T5 text

    @classmethod
    def latent_grid(cls, num_frames, height, width):
        f = VAE_FACTOR * PACK
        if num_frames != 1:
            raise ConfigError(f"{num_frames} frames: Flux makes still images; use 1 frame")
        if height < f or width < f or height % f or width % f:
            raise ConfigError(f"height x width = {height}x{width} must be multiples of {f} "
                              f"(the VAE's {VAE_FACTOR}x and the 2x2 token packing)")
        return 1, height // VAE_FACTOR, width // VAE_FACTOR

    def tokens_per_sample(self, latent_shape) -> int:
        _, _, y, x = latent_shape
        return (y // PACK) * (x // PACK)

    def flops_per_sample(self, latent_shape, text_len: int) -> float:
        """Forward + backward = 3 × forward matmul FLOPs (no remat recompute).

        With L image and T text tokens, S = L + T, width D, MLP width M: a double block
        8·S·D² (q, k, v, out of both streams) + 4·S²·D (attention) + 4·S·D·M (both MLPs); a
        single block 6·S·D² + 4·S²·D + 2·S·D·M + 2·S·(D + M)·D; plus the embedders and the
        output projection.
        """
        m = self.model
        L, T = self.tokens_per_sample(latent_shape), text_len
        S, D, M = L + T, m.inner_dim, m.mlp_dim
        double = 8 * S * D * D + 4 * S * S * D + 4 * S * D * M + 24 * D * D
        single = 6 * S * D * D + 4 * S * S * D + 2 * S * D * M + 2 * S * (D + M) * D + 6 * D * D
        embed = (2 * L * m.in_channels * D + 2 * T * m.joint_attention_dim * D
                 + 2 * m.pooled_projection_dim * D + 8 * D * D)
        head = 4 * D * D + 2 * L * D * m.output_channels
        return 3.0 * (m.num_layers * double + m.num_single_layers * single + embed + head)

    # -- module ---------------------------------------------------------------------------------

    def create(self, mesh, rngs: nnx.Rngs):
        from ditax.models.flux.transformer import FluxTransformer

        return FluxTransformer(self.model, self.attention, mesh, rngs=rngs)

    def param_shardings(self, params, mesh):
        from ditax.models.flux.build import param_shardings

        return param_shardings(params, self.model, mesh)

    def apply(self, module, latents, timestep, text, text_mask, condition=None):
        raise ConfigError("training a Flux model is not wired yet (its loss needs the pooled "
                          "text, position ids and guidance); use model.family=wan to train")

    # -- weights and inference ------------------------------------------------------------------

    def weights_folder(self, path):
        from ditax.models.flux.loading import check_architecture

        return check_architecture(self.model, path)

    def load_params(self, folder, mesh) -> dict:
        from ditax.models.flux.loading import load_weights_into

        model = load_weights_into(self.abstract(mesh), folder, self.model, mesh)
        return nnx.to_pure_dict(nnx.split(model)[1])

    @classmethod
    def load_transformer(cls, path, **kwargs):
        """:func:`ditax.models.flux.loading.load_transformer` (diffusers folders)."""
        from ditax.models.flux.loading import load_transformer

        return load_transformer(path, **kwargs)

    def random_transformer(self, mesh, seed: int = 0):
        from ditax.models.flux.build import init_model
        from ditax.models.flux.loading import FluxTransformerModel

        return FluxTransformerModel(init_model(self.model, self.attention, mesh, seed=seed))

    @classmethod
    def check_folder(cls, path, subfolder="transformer") -> str:
        from ditax.models.flux.loading import check_folder

        return check_folder(path, subfolder)
