"""``ditax config --vae --family F``: the keys of that family's VAE trainer (``ditax
train-vae --family F``), in process (no subprocess: the listing loads nothing heavy)."""

from __future__ import annotations

import re

from ditax.cli import main


def _keys(text: str) -> set[str]:
    return set(re.findall(r"^  ([\w.]+) = ", text, flags=re.M))


def test_config_vae_lists_the_chosen_familys_keys(capsys):
    from ditax.train.flux.vae import FluxVAETrainConfig
    from ditax.train.wan.vae_config import VAETrainConfig

    assert main(["config", "--vae", "--family", "flux"]) == 0
    flux = _keys(capsys.readouterr().out)
    assert main(["config", "--vae"]) == 0
    wan = _keys(capsys.readouterr().out)
    assert "vae.block_out_channels" in flux and "vae.latent_channels" in flux, sorted(flux)
    assert "vae.base_dim" in wan and "vae.base_dim" not in flux
    # every field of the family's config class is listed
    for cls, shown in ((FluxVAETrainConfig, flux), (VAETrainConfig, wan)):
        import dataclasses

        def leaves(obj, prefix=""):
            for f in dataclasses.fields(obj):
                v = getattr(obj, f.name)
                yield from (leaves(v, f"{prefix}{f.name}.") if dataclasses.is_dataclass(v)
                            else [prefix + f.name])

        assert set(leaves(cls())) <= shown, sorted(set(leaves(cls())) - shown)
    assert main(["config", "--vae", "--family", "flux", "vae.latent_channels=8"]) == 0
    assert re.search(r"^  vae\.latent_channels = 8  \[16\]", capsys.readouterr().out, re.M)


def test_config_family_without_vae_and_unknown_family_are_refused(capsys):
    assert main(["config", "--family", "flux"]) == 2
    assert "--vae" in capsys.readouterr().err
    assert main(["config", "--vae", "--family", "nope"]) == 2
