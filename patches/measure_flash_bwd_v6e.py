"""Scratch measurement (issue 11 item 4), not part of the package: deviceless v6e compile of
flash forward+backward, Pallas backward (kernels/flash_bwd.py) vs the jnp backward in flash.py.
Run: PYTHONPATH=src python patches/measure_flash_bwd_v6e.py U N [jnp]  (prints JSON lines).
Fold into benchmarks/tpu_aot.py and delete."""
import os, re, sys, time, functools, json
os.environ["TPU_SKIP_MDS_QUERY"]="1"
os.environ.setdefault("JAX_PLATFORMS","cpu")
import jax, jax.numpy as jnp, numpy as np
from jax.experimental import topologies
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from ditax.attention.kernels.flash_fwd import flash_forward_shard_major
from ditax.attention.kernels.flash_bwd import flash_core_bwd
from ditax.attention import flash as F
topo = topologies.get_topology_desc(platform="tpu", topology_name="v6e:2x4")
mesh = Mesh(np.array(topo.devices[:1]).reshape(1), ("x",))
sh = NamedSharding(mesh, P())
def S(shape, dt): return jax.ShapeDtypeStruct(shape, dt, sharding=sh)

@functools.partial(jax.custom_vjp, nondiff_argnums=(6, 7, 8, 9))
def core(q, k, v, keep, o_prev, lse_prev, scale, bq, bkv, interpret):
    return flash_forward_shard_major(q, k, v, keep, o_prev, lse_prev, scale=scale, block_q=bq, block_kv=bkv, interpret=interpret)
def core_fwd(*a):
    o, lse = core(*a); return (o, lse), (*a[:6], o, lse)
core.defvjp(core_fwd, flash_core_bwd)

BYTES = {"bf16": 2, "f32": 4, "s32": 4, "pred": 1, "u32": 4, "s8": 1, "u8": 1}
def copies(text):
    n = b = 0
    for m in re.finditer(r"= (\w+)\[([\d,]*)\]\{[^}]*\} copy\(", text):
        n += 1; b += BYTES.get(m.group(1), 4) * int(np.prod([int(x) for x in m.group(2).split(",") if x] or [1]))
    return n, b
def report(name, fn, args):
    t = time.time()
    c = jax.jit(fn).lower(*args).compile()
    txt = c.as_text(); ma = c.memory_analysis(); ca = c.cost_analysis()
    ca = ca[0] if isinstance(ca, list) else ca
    n, b = copies(txt)
    r = dict(case=name, compile_s=round(time.time()-t, 1), temp_MiB=ma.temp_size_in_bytes/2**20,
             arg_MiB=ma.argument_size_in_bytes/2**20, out_MiB=ma.output_size_in_bytes/2**20,
             tpu_custom_calls=txt.count('custom_call_target="tpu_custom_call"'),
             copy_ops=n, copy_MiB=b/2**20, fusions=len(re.findall(r" fusion\(", txt)),
             while_loops=len(re.findall(r" while\(", txt)), flops=ca.get("flops"), bytes_accessed=ca.get("bytes accessed"))
    print(json.dumps(r), flush=True)
    pass
    return c

U = int(sys.argv[1]) if len(sys.argv) > 1 else 1
L, K, blk = 8192, 128, 512
N = int(sys.argv[2]) if len(sys.argv) > 2 else 8
Lc = L // U
x = S((U, 1, N, Lc, K), jnp.bfloat16); keep = S((1, U, Lc), jnp.int32)
sc = K ** -0.5
def loss(o, lse):
    return jnp.sum(o.astype(jnp.float32)) + jnp.sum(jnp.where(jnp.isfinite(lse), lse, 0.0))
def g_pallas(q, k, v, m):
    return jax.grad(lambda q, k, v: loss(*core(q, k, v, m, None, None, sc, blk, blk, False)), (0, 1, 2))(q, k, v)
def g_jnp(q, k, v, m):
    return jax.grad(lambda q, k, v: loss(*F._flash_core(q, k, v, m, None, None, sc, blk, blk, False)), (0, 1, 2))(q, k, v)
def f_only(q, k, v, m):
    return core(q, k, v, m, None, None, sc, blk, blk, False)
TAG = os.environ.get("TAG", "")
report(f"fwd_only_U{U}_N{N}{TAG}", f_only, (x, x, x, keep))
report(f"fwd_bwd_pallas_U{U}_N{N}{TAG}", g_pallas, (x, x, x, keep))
if "jnp" in sys.argv: report(f"fwd_bwd_jnp_U{U}_N{N}{TAG}", g_jnp, (x, x, x, keep))
