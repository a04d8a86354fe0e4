"""A random diffusers Wan 2.1 image-to-video / first-last-frame transformer, its inputs and its call
(torch), shared by the transformer and LoRA image tests."""

import numpy as np
import torch

TEXT_LEN = 512


IMAGE_DIM = 24


IMAGE_TOKENS = 5


def make_i2v(tmp_path, *, flf2v=False, heads=2, head_dim=16, layers=2, seed=0):
    """A random diffusers I2V (or FLF2V) ``WanTransformer3DModel``, saved; (model, folder)."""
    from diffusers import WanTransformer3DModel

    torch.manual_seed(seed)
    d = heads * head_dim
    m = WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=heads, attention_head_dim=head_dim,
        in_channels=36, out_channels=16, text_dim=32, freq_dim=32, ffn_dim=64,
        num_layers=layers, cross_attn_norm=True, rope_max_seq_len=1024, image_dim=IMAGE_DIM,
        added_kv_proj_dim=d, pos_embed_seq_len=2 * IMAGE_TOKENS if flf2v else None)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in m.named_parameters():
            gain = 1.0 if ".norm" in name and name.endswith("weight") else 0.0
            p.copy_(torch.randn(p.shape, generator=g) * (0.5 / max(1, p.shape[-1]) ** 0.5)
                    + gain)
    m.eval()
    folder = tmp_path / f"i2v_{'flf2v' if flf2v else 'i2v'}_{heads}_{layers}"
    m.save_pretrained(folder)
    return m, folder


def image_inputs(rng, *, b=2, f=3, y=6, x=10, flf2v=False):
    lat = rng.standard_normal((b, 36, f, y, x)).astype(np.float32)
    t = rng.uniform(0, 1000, size=(b,)).astype(np.float32)
    text = rng.standard_normal((b, TEXT_LEN, 32)).astype(np.float32)
    image = rng.standard_normal((2 * b if flf2v else b, IMAGE_TOKENS, IMAGE_DIM))
    return lat, t, text, image.astype(np.float32)


def run_diffusers_image(m, lat, t, text, image):
    with torch.no_grad():
        return m(*(torch.from_numpy(a) for a in (lat, t, text)),
                 encoder_hidden_states_image=torch.from_numpy(image), return_dict=False)[0].numpy()
