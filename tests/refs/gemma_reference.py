"""Tiny random Gemma-3 text encoders, Gemma tokenizers and LTX-2 text connectors (torch,
transformers, diffusers) saved in their own folder formats, for the decoder-LM and LTX-2 text
parity tests."""

from __future__ import annotations

import json

import numpy as np

CORPUS = ["a cat walks on the grass in the sunshine", "A dog runs along the beach at sunset",
          "the camera pans slowly over a snowy mountain range", "café naïve crème brûlée",
          "two people dance in a neon lit street at night", "it's 2024 and we're here: 3 cats"]

PROMPTS = ["a cat walks on the grass", "  A   dog\truns  along the beach, at sunset!  ",
           "Café ÜBER 東京 😀 x", "", "two people dance in a neon lit street at night, " * 6]

# Gemma-3 text shapes, tiny: 4 layers (sliding, full, sliding, full), GQA 4 heads over 2
TEXT = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=20, sliding_window=5,
            layer_types=["sliding_attention", "full_attention", "sliding_attention",
                         "full_attention"],
            rope_parameters={"full_attention": {"rope_type": "linear", "factor": 4.0,
                                                "rope_theta": 1_000_000.0},
                             "sliding_attention": {"rope_type": "default",
                                                   "rope_theta": 10_000.0}},
            max_position_embeddings=512, rms_norm_eps=1e-6)

SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"]


def rel_err(a, b):
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def gemma_vocab():
    """(vocab, merges) of a tiny byte-fallback BPE trained on :data:`CORPUS` the way Gemma's
    tokenizer splits (spaces become ``▁`` and stay with the word before them): Gemma's five
    special tokens first, the 256 ``<0xNN>`` byte tokens, then the trained pieces."""
    from tokenizers import Tokenizer, normalizers, pre_tokenizers, trainers
    from tokenizers.models import BPE

    tok = Tokenizer(BPE())
    tok.normalizer = normalizers.Replace(" ", "\u2581")
    tok.pre_tokenizer = pre_tokenizers.Split("\u2581", behavior="merged_with_next")
    tok.train_from_iterator(CORPUS * 4, trainer=trainers.BpeTrainer(vocab_size=200))
    model = json.loads(tok.to_str())["model"]
    pieces = sorted(model["vocab"], key=model["vocab"].get)
    words = SPECIALS + [f"<0x{b:02X}>" for b in range(256)] + pieces
    vocab = {w: i for i, w in enumerate(words)}
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    return vocab, merges


def save_gemma_tokenizer(folder):
    """A transformers ``GemmaTokenizer`` of :func:`gemma_vocab` saved as a pipeline's
    ``tokenizer/`` (``tokenizer.json`` + ``tokenizer_config.json``), with Gemma's
    ``<start_of_turn>`` / ``<end_of_turn>`` added; returns the tokenizer as loaded back."""
    from transformers import AutoTokenizer, GemmaTokenizer

    vocab, merges = gemma_vocab()
    tok = GemmaTokenizer(vocab=vocab, merges=merges, add_bos_token=True, add_eos_token=False,
                         extra_special_tokens=["<start_of_turn>", "<end_of_turn>"])
    tok.save_pretrained(folder)
    return AutoTokenizer.from_pretrained(folder)


def make_gemma3(seed=0, vocab_size=None, **text):
    """A random ``Gemma3ForConditionalGeneration`` (tiny SigLIP tower; :data:`TEXT` shapes with
    ``text`` overrides), every norm and projection perturbed so a wrong mapping shows."""
    import torch
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    vocab_size = vocab_size or len(gemma_vocab()[0]) + 2
    torch.manual_seed(seed)
    cfg = Gemma3Config(
        text_config=dict(TEXT, vocab_size=vocab_size, **text),
        vision_config=dict(model_type="siglip_vision_model", hidden_size=16,
                           intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                           image_size=28, patch_size=14),
        mm_tokens_per_image=1, image_token_index=vocab_size - 1,
        boi_token_index=vocab_size - 2, eoi_token_index=vocab_size - 3)
    model = Gemma3ForConditionalGeneration(cfg).eval()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.model.language_model.named_parameters():
            if "norm" in name:          # (1 + w) norms: w away from 0 in both directions
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
            elif "embed" in name:
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5)
    return model


def gemma_hidden_states(model, ids, mask):
    """Every hidden state of ``model`` (the pipeline's call: ``input_ids``, ``attention_mask``,
    ``output_hidden_states=True``), stacked ``[L+1, B, T, D]`` float32."""
    import torch

    with torch.no_grad():
        out = model(input_ids=torch.from_numpy(np.asarray(ids, np.int64)),
                    attention_mask=torch.from_numpy(np.asarray(mask, np.int64)),
                    output_hidden_states=True)
    return np.stack([h.numpy() for h in out.hidden_states])


def make_connectors(seed=0, **config):
    """A random diffusers ``LTX2TextConnectors`` (``config`` its constructor arguments), the
    RMS-norm gains perturbed away from 1."""
    import torch
    from diffusers.pipelines.ltx2.connectors import LTX2TextConnectors

    torch.manual_seed(seed)
    m = LTX2TextConnectors(**config).eval()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith("norm_q.weight") or name.endswith("norm_k.weight"):
                p.copy_(1 + 0.3 * torch.randn(p.shape, generator=g))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
    return m


def ltx2_text_pipeline(text_encoder, tokenizer, connectors):
    """diffusers' ``LTX2Pipeline`` holding only the text components (the scheduler it needs
    to exist; no VAE, transformer or vocoder)."""
    from diffusers import FlowMatchEulerDiscreteScheduler, LTX2Pipeline

    return LTX2Pipeline(scheduler=FlowMatchEulerDiscreteScheduler(), vae=None, audio_vae=None,
                        text_encoder=text_encoder, tokenizer=tokenizer, connectors=connectors,
                        transformer=None, vocoder=None)


def ltx2_reference_text(pipe, prompts, negative, max_sequence_length):
    """What ``LTX2Pipeline.__call__`` hands the transformer for ``prompts`` with CFG: the
    connectors run on ``[negative, positive]`` → (video ``[2B, T, Dv]``, audio ``[2B, T, Da]``,
    mask ``[2B, T]``) as numpy."""
    import torch

    with torch.no_grad():
        pe, pm, ne, nm = pipe.encode_prompt(prompts, negative, do_classifier_free_guidance=True,
                                            max_sequence_length=max_sequence_length,
                                            device=torch.device("cpu"))
        embeds, mask = torch.cat([ne, pe]), torch.cat([nm, pm])
        video, audio, out_mask = pipe.connectors(embeds, mask,
                                                 padding_side=pipe.tokenizer.padding_side)
    return video.numpy(), audio.numpy(), out_mask.numpy()


# the LTX-2.0 connectors of the tiny folder: 4 Gemma layers + embeddings = 5 hidden states;
# registers of 8 (so prompts are padded to a multiple of 8), split rope as LTX-2 ships
CONNECTORS = dict(caption_channels=TEXT["hidden_size"], text_proj_in_factor=5,
                  video_connector_num_attention_heads=2, video_connector_attention_head_dim=16,
                  video_connector_num_layers=2, video_connector_num_learnable_registers=8,
                  audio_connector_num_attention_heads=4, audio_connector_attention_head_dim=8,
                  audio_connector_num_layers=1, audio_connector_num_learnable_registers=8,
                  connector_rope_base_seq_len=32, rope_type="split",
                  rope_double_precision=True)

_FOLDERS: dict = {}


def tiny_ltx2_text_folder():
    """(folder, text_encoder, tokenizer, connectors): a folder laid out as an LTX-2 pipeline's
    text components (``tokenizer/``, ``text_encoder/``, ``connectors/``) and the torch /
    transformers objects loaded back from it; built once per process (both the decoder-LM and
    the LTX-2 text tests read it)."""
    if "ltx2" not in _FOLDERS:
        import atexit
        import shutil
        import tempfile
        from pathlib import Path

        from transformers import Gemma3ForConditionalGeneration

        folder = Path(tempfile.mkdtemp(prefix="ditax_gemma_"))
        atexit.register(shutil.rmtree, folder, True)
        tokenizer = save_gemma_tokenizer(folder / "tokenizer")
        make_gemma3().save_pretrained(folder / "text_encoder")
        make_connectors(**CONNECTORS).save_pretrained(folder / "connectors")
        encoder = Gemma3ForConditionalGeneration.from_pretrained(folder / "text_encoder").eval()
        from diffusers.pipelines.ltx2.connectors import LTX2TextConnectors

        connectors = LTX2TextConnectors.from_pretrained(folder / "connectors").eval()
        _FOLDERS["ltx2"] = (folder, encoder, tokenizer, connectors)
    return _FOLDERS["ltx2"]
