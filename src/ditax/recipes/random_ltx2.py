"""LTX-2's random pipeline folders (``ditax init-random``; the ``ltx2`` family's
``random_folders``): an ``LTX2Pipeline`` folder — the transformer at its real size, the video
VAE (``AutoencoderKLLTX2Video``), the audio VAE (``AutoencoderKLLTX2Audio``) and the vocoder
(``LTX2Vocoder``) at diffusers' defaults (LTX-2's shapes) or, ``--vae small``, small ones with
the transformer's latent widths (8x spatial, 4x temporal video; 16 mel bins), a Gemma-3 text
encoder of the transformer's ``caption_channels`` cut to ``--text-layers`` layers, the
LTX-2.0 text connectors reading its ``layers + 1`` hidden states, a byte-fallback BPE Gemma
tokenizer (:mod:`ditax.recipes.random_tokenizers`) and LTX-2's scheduler.
"""

from __future__ import annotations

import json

from ditax.recipes.random_folders import Folder, Preset, RandomFolders, sample_size
from ditax.recipes.random_parts import decoder_lm_part, module_part

#: LTX-2's scheduler/scheduler_config.json (the shift from the video token count)
SCHEDULER = {"_class_name": "FlowMatchEulerDiscreteScheduler", "_diffusers_version": "0.36.0",
             "base_image_seq_len": 1024, "base_shift": 0.95, "max_image_seq_len": 4096,
             "max_shift": 2.05, "num_train_timesteps": 1000, "shift": 1.0,
             "shift_terminal": 0.1, "use_dynamic_shifting": True,
             "time_shift_type": "exponential"}
#: a small video VAE: three levels of 2x2 patches (8x spatial, 4x temporal), LTX-2.0's decoder
VIDEO_SMALL = dict(block_out_channels=[16, 16, 32], down_block_types=["LTX2VideoDownBlock3D"] * 3,
                   layers_per_block=[1, 0, 1, 1], spatio_temporal_scaling=[True, True, True],
                   downsample_type=["spatial", "temporal", "spatiotemporal"], patch_size=2,
                   patch_size_t=1, decoder_block_out_channels=[16, 32],
                   decoder_layers_per_block=[1, 1, 1], decoder_spatio_temporal_scaling=[True, True],
                   decoder_inject_noise=[False, False, False],
                   upsample_type=["spatiotemporal", "spatiotemporal"],
                   upsample_residual=[True, True], upsample_factor=[2, 2],
                   timestep_conditioning=True, decoder_causal=False,
                   decoder_spatial_padding_mode="reflect")
AUDIO_SMALL = dict(base_channels=8, ch_mult=[1, 2, 4], num_res_blocks=1, mel_bins=16,
                   resolution=16)
#: a small LTX-2.0-kind vocoder whose rate matches its hop: 100 mel frames a second x 80
VOCODER_SMALL = dict(hidden_channels=32, upsample_kernel_sizes=[10, 8, 8],
                     upsample_factors=[5, 4, 4], resnet_kernel_sizes=[3, 7, 11],
                     resnet_dilations=[[1, 3, 5]] * 3, output_sampling_rate=8000)
#: Gemma-3 12B's text shape (LTX-2's text encoder), without its depth and vocabulary
GEMMA3_12B = dict(hidden_size=3840, intermediate_size=15360, num_attention_heads=16,
                  num_key_value_heads=8, head_dim=256, query_pre_attn_scalar=256,
                  sliding_window=1024)
_TINY = ("model.in_channels=8", "model.out_channels=8", "model.num_attention_heads=2",
         "model.attention_head_dim=8", "model.cross_attention_dim=16",
         "model.audio_in_channels=8", "model.audio_out_channels=8",
         "model.audio_num_attention_heads=2", "model.audio_attention_head_dim=8",
         "model.audio_cross_attention_dim=16", "model.num_layers=2", "model.caption_channels=32",
         "model.vae_scale_factors=[4,8,8]", "model.perturbed_attn=true",
         "model.param_dtype=float32", "model.dtype=float32", "attention.backend=xla",
         "sample.height=64", "sample.width=64", "sample.num_frames=9",
         "sample.max_sequence_length=32", "data.num_frames=9", "data.height=64",
         "data.width=64", "data.text_len=32")
PRESETS = {"ltx2-tiny": Preset("ltx-2", _TINY, "LTX-2 video + sound (LTX2Pipeline): 2 blocks "
                                               "of 2 heads x 8 per stream, Gemma-3 2 x 32")}


def _gemma(width: int, layers: int, vocab: int, small: bool) -> dict:
    """A ``Gemma3ForConditionalGeneration`` config whose text model is ``width`` wide (Gemma-3
    12B's shape for 3840, else narrow) with ``layers`` layers (every sixth global)."""
    shape = GEMMA3_12B if width == GEMMA3_12B["hidden_size"] and not small else dict(
        hidden_size=width, intermediate_size=2 * width, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, query_pre_attn_scalar=16, sliding_window=512)
    kinds = ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention"
             for i in range(layers)]
    text = {"model_type": "gemma3_text", **shape, "num_hidden_layers": layers,
            "vocab_size": vocab, "rms_norm_eps": 1e-6, "layer_types": kinds,
            "hidden_activation": "gelu_pytorch_tanh", "max_position_embeddings": 131072,
            "rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 8.0,
                                                   "rope_theta": 1_000_000.0},
                                "sliding_attention": {"rope_type": "default",
                                                      "rope_theta": 10_000.0}}}
    return {"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
            "text_config": text}


def connectors_config(m, layers: int, small: bool) -> dict:
    """The text connectors over ``layers + 1`` Gemma hidden states ``m.caption_channels``
    wide: LTX-2.0's (one projection, both streams that wide) when the transformer projects
    the caption itself (``use_prompt_embeddings``), else LTX-2.3's (a projection per stream
    to the transformer's cross-attention widths, gated attention). Heads of 128 channels
    (small: two heads a stream), diffusers' depths and registers (small: 2 / 1 layers, 8)."""
    split = not m.use_prompt_embeddings
    widths = ((m.cross_attention_dim, m.audio_cross_attention_dim) if split
              else (m.caption_channels,) * 2)
    out = {"_class_name": "LTX2TextConnectors", "caption_channels": m.caption_channels,
           "text_proj_in_factor": layers + 1, "rope_type": "split",
           "rope_double_precision": True, "per_modality_projections": split,
           "video_hidden_dim": widths[0], "audio_hidden_dim": widths[1]}
    for stream, width in zip(("video", "audio"), widths):
        heads = 2 if small else max(1, width // 128)
        out.update({f"{stream}_connector_num_attention_heads": heads,
                    f"{stream}_connector_attention_head_dim": width // heads,
                    f"{stream}_gated_attn": split})
        if small:
            out.update({f"{stream}_connector_num_layers": 2 if stream == "video" else 1,
                        f"{stream}_connector_num_learnable_registers": 8})
    if small:
        out["connector_rope_base_seq_len"] = 32
    return out


def parts(m, options, vocab: int) -> list:
    """Every weight folder but the transformer's (module docstring)."""
    from flax import nnx

    from ditax.models.encoders.decoder_lm.gemma3 import gemma3_config
    from ditax.models.ltx2.audio import convert as audio_convert
    from ditax.models.ltx2.vocoder import convert as vocoder_convert
    from ditax.models.ltx2.audio.config import LTX2AudioVAEConfig
    from ditax.models.ltx2.audio.model import LTX2AudioVAE
    from ditax.models.ltx2.text.connectors import LTX2TextConnectors
    from ditax.models.ltx2.text.config import LTX2ConnectorsConfig
    from ditax.models.ltx2.text.convert import weight_table as connectors_table
    from ditax.models.ltx2.vocoder.config import LTX2VocoderConfig
    from ditax.models.ltx2.vocoder.model import LTX2Vocoder
    from ditax.models.vae.ltx2 import LTX2VideoVAEConfig
    from ditax.models.vae.ltx2.convert import weight_table as video_table
    from ditax.models.vae.ltx2.model import LTX2VideoVAE

    small = options.vae == "small"
    temporal, spatial = (4, 8) if small else m.vae_scale_factors[:2]
    video = {"_class_name": "AutoencoderKLLTX2Video", "latent_channels": m.in_channels,
             **(VIDEO_SMALL if small else {}), "spatial_compression_ratio": spatial,
             "temporal_compression_ratio": temporal}
    mel = AUDIO_SMALL["mel_bins"] if small else 64
    audio = {"_class_name": "AutoencoderKLLTX2Audio", **(AUDIO_SMALL if small else {}),
             "latent_channels": m.audio_in_channels * 4 // mel}
    vocoder = {"_class_name": "LTX2Vocoder", **(VOCODER_SMALL if small else {}),
               "in_channels": 2 * mel}
    cv, ca, cw = (LTX2VideoVAEConfig.from_diffusers(video),
                  LTX2AudioVAEConfig.from_diffusers(audio),
                  LTX2VocoderConfig.from_diffusers(vocoder))
    layers = options.text_layers or 2
    gemma = _gemma(m.caption_channels, layers, vocab, options.small)
    connectors = connectors_config(m, layers, options.small)
    cc = LTX2ConnectorsConfig.from_diffusers(connectors)
    return [module_part("vae", video, lambda: LTX2VideoVAE(cv, rngs=nnx.Rngs(0)), video_table,
                        "float32"),
            module_part("audio_vae", audio, lambda: LTX2AudioVAE(ca, rngs=nnx.Rngs(0)),
                        audio_convert.weight_table, "float32"),
            module_part("vocoder", vocoder, lambda: LTX2Vocoder(cw, rngs=nnx.Rngs(0)),
                        vocoder_convert.weight_table, "float32"),
            decoder_lm_part(gemma, gemma3_config(gemma), "language_model.model.",
                            options.dtype),
            module_part("connectors", connectors,
                        lambda: LTX2TextConnectors(cc, rngs=nnx.Rngs(0)),
                        lambda _: connectors_table(cc), options.dtype)]


def folder(cfg, options) -> Folder:
    """The random ``LTX2Pipeline`` folder of LTX-2 run config ``cfg``."""
    from ditax.recipes.random_folders import transformer_part
    from ditax.recipes.random_tokenizers import gemma_tokenizer

    m = cfg.model
    tokenizer, vocab = gemma_tokenizer()
    weights = [transformer_part(cfg, m.to_diffusers(), options.dtype),
               *parts(m, options, vocab)]
    files = {f"tokenizer/{k}": v for k, v in tokenizer.items()}
    files["scheduler/scheduler_config.json"] = json.dumps(SCHEDULER, indent=2)
    index = {"_class_name": "LTX2Pipeline", "_diffusers_version": "0.36.0",
             "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
             "vae": ["diffusers", "AutoencoderKLLTX2Video"],
             "audio_vae": ["diffusers", "AutoencoderKLLTX2Audio"],
             "text_encoder": ["transformers", "Gemma3ForConditionalGeneration"],
             "tokenizer": ["transformers", "GemmaTokenizer"],
             "connectors": ["ltx2", "LTX2TextConnectors"],
             "transformer": ["diffusers", "LTX2VideoTransformer3DModel"],
             "vocoder": ["ltx2", "LTX2Vocoder"]}
    h, w, f = sample_size(cfg, options.size)
    # a quick call: guidance, spatio-temporal and modality guidance off (one forward a step)
    sample = dict(height=h, width=w, num_frames=f, num_inference_steps=4,
                  max_sequence_length=cfg.sample.max_sequence_length, guidance_scale=1.0,
                  audio_guidance_scale=1.0, stg_scale=0.0, audio_stg_scale=0.0,
                  modality_scale=1.0, audio_modality_scale=1.0)
    te = weights[4].config["text_config"]
    note = {"text_encoder": f"Gemma-3 {te['hidden_size']} wide (caption_channels) cut to "
                            f"{te['num_hidden_layers']} layers, over a {vocab}-token "
                            f"byte-fallback BPE (no vision tower written: ditax reads none)",
            "vae": "diffusers' defaults for the video VAE, audio VAE and vocoder (LTX-2's "
                   "shapes)" if options.vae == "full" else
                   "small video VAE (8x spatial, 4x temporal), audio VAE (16 mel bins) and "
                   "vocoder (8 kHz)"}
    return Folder(index, weights, files, sample, note)


RANDOM = RandomFolders("ltx2", PRESETS, folder)

__all__ = ["PRESETS", "RANDOM", "SCHEDULER", "connectors_config", "folder", "parts"]
