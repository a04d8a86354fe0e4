"""Tiny random diffusers ``WanPipeline`` builder shared by the pipeline and CLI tests (torch)."""

from __future__ import annotations

import numpy as np

from wan_reference import make_diffusers_wan

SENTENCES = [
    "a cat walks on the grass", "a dog runs along the beach at sunset",
    "two people dance in a neon lit street at night", "close up of a flower opening",
    "a red car drives through the rain", "waves crash on the rocks under a grey sky",
    "ein Hund läuft am Strand entlang", "blurry, low quality, static, worst quality",
]

Z = 4          # latent channels (VAE z_dim = transformer in/out channels)
TEXT_DIM = 32  # UMT5 d_model = transformer text_dim


def train_tokenizer(folder):
    """A T5-style fast tokenizer (Unigram, '</s>' appended, '<pad>' = 0) trained on the spot."""
    import transformers
    from tokenizers import Tokenizer, decoders, pre_tokenizers, processors, trainers
    from tokenizers.models import Unigram

    tok = Tokenizer(Unigram())
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    trainer = trainers.UnigramTrainer(vocab_size=100, special_tokens=["<pad>", "</s>", "<unk>"],
                                      unk_token="<unk>")
    tok.train_from_iterator(SENTENCES * 4, trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="$A </s>", special_tokens=[("</s>", tok.token_to_id("</s>"))])
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>",
                                                eos_token="</s>", unk_token="<unk>")
    fast.save_pretrained(folder)
    return fast


def _randomize(model, seed, scale=1.0):
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("gamma", "layer_norm.weight")):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            elif name.endswith("bias"):
                p.copy_(0.05 * torch.randn(p.shape, generator=g))
            else:
                fan = p[0].numel() if p.ndim > 1 else p.shape[0]
                p.copy_(scale * torch.randn(p.shape, generator=g) / fan ** 0.5)
    return model.eval()


def make_text_parts(tmp_path, seed=0):
    """(tokenizer, random tiny UMT5 encoder) of every tiny pipeline here."""
    import torch
    import transformers

    tok = train_tokenizer(tmp_path / "_tok")
    torch.manual_seed(seed)
    enc = transformers.UMT5EncoderModel(transformers.UMT5Config(
        vocab_size=128, d_model=TEXT_DIM, d_kv=8, d_ff=48, num_layers=2, num_heads=4,
        relative_attention_num_buckets=32, relative_attention_max_distance=128,
        feed_forward_proj="gated-gelu", dropout_rate=0.0))
    return tok, _randomize(enc, seed + 1)


def make_tiny_pipeline(tmp_path, *, two_experts=False, boundary_ratio=0.6, scheduler="unipc",
                       layers=2, heads=4, head_dim=12, ffn=64, vae_base=8, seed=0):
    """Build, save (``save_pretrained``) and return ``(diffusers WanPipeline, folder)``."""
    import torch
    from diffusers import (AutoencoderKLWan, FlowMatchEulerDiscreteScheduler,
                           UniPCMultistepScheduler, WanPipeline)

    tok, enc = make_text_parts(tmp_path, seed)
    vae = AutoencoderKLWan(base_dim=vae_base, z_dim=Z, dim_mult=[1, 2, 2, 2], num_res_blocks=1,
                           temperal_downsample=[False, True, True],
                           latents_mean=list(np.linspace(-0.5, 0.5, Z)),
                           latents_std=list(np.linspace(0.8, 2.0, Z)))
    _randomize(vae, seed + 2)
    with torch.no_grad():
        vae.decoder.conv_out.weight.mul_(0.3)   # keep pixels mostly inside [-1, 1]
    tkw = dict(heads=heads, head_dim=head_dim, layers=layers, ffn=ffn, text_dim=TEXT_DIM,
               freq_dim=32, in_ch=Z)
    tr, _ = make_diffusers_wan(tmp_path / "_t1", seed=seed + 3, **tkw)
    tr2 = make_diffusers_wan(tmp_path / "_t2", seed=seed + 4, **tkw)[0] if two_experts else None
    if scheduler == "unipc":
        sch = UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True,
                                      num_train_timesteps=1000, flow_shift=3.0)
    else:
        sch = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=3.0)
    pipe = WanPipeline(tokenizer=tok, text_encoder=enc, vae=vae, scheduler=sch, transformer=tr,
                       transformer_2=tr2, boundary_ratio=boundary_ratio if two_experts else None)
    pipe.set_progress_bar_config(disable=True)
    folder = tmp_path / "pipe"
    pipe.save_pretrained(folder)
    return pipe, folder


def run_diffusers(pipe, latents, **kw):
    """Reference video ``[F, H, W, 3]`` in [0, 1] from fixed initial latents (numpy)."""
    import torch

    with torch.no_grad():
        out = pipe(latents=torch.from_numpy(np.asarray(latents)), output_type="np", **kw)
    return np.asarray(out.frames[0], np.float32)
