"""One compiled program, measured: per-device memory, the HLO audit and a roofline estimate.

The roofline is a floor, not a prediction: ``compute_s`` = FLOPs / peak bf16 FLOP/s,
``hbm_s`` = bytes that fusions and kernels read and write (outside-kernel view) / HBM
bandwidth, ``ici_s`` = collective bytes on the wire / the chip's ICI bandwidth (group sizes,
hops and topology ignored); ``estimate_s`` = the largest of the three (perfect overlap).
"""

from __future__ import annotations

import time

from ditax.plan.audit import audit
from ditax.plan.targets import Chip

#: Wire bytes per output byte of each collective kind (ring algorithms, large groups):
#: all-reduce sends its data twice (reduce-scatter + all-gather); the others about once.
WIRE_FACTOR = {"all-reduce": 2.0}
_AUDIT_KEYS = ("copy_ops", "copy_bytes", "fused_copy_ops", "fused_copy_bytes", "a2a_copy_ops",
               "a2a_copy_bytes", "all_to_all_ops", "collective_bytes", "tpu_custom_calls",
               "xla_flops", "hbm_bytes", "host_to_device_bytes")
#: the host link assumed per chip for ``model.offload=host`` transfers: PCIe 4.0 x16 one way
#: (about 32 GB/s; no per-chip host bandwidth is published for these TPUs — a real machine
#: must confirm it)
HOST_LINK_BYTES_PER_S = 32e9


def compile_timed(lowered):
    """``(compiled, seconds)`` of ``lowered.compile()``."""
    t = time.perf_counter()
    compiled = lowered.compile()
    return compiled, time.perf_counter() - t


def memory(compiled) -> dict:
    """Per-device bytes from XLA's buffer assignment (``memory_analysis``); ``peak_bytes``
    in device memory (host-memory arguments, ``host_argument_bytes``, left out), and
    :func:`device_peak`'s chip-comparable split."""
    ma = compiled.memory_analysis()
    get = lambda k: int(getattr(ma, k, 0) or 0)  # noqa: E731
    out = {"argument_bytes": get("argument_size_in_bytes"),
           "output_bytes": get("output_size_in_bytes"), "temp_bytes": get("temp_size_in_bytes"),
           "alias_bytes": get("alias_size_in_bytes"),
           "host_argument_bytes": get("host_argument_size_in_bytes"),   # offloaded weights
           "code_bytes": get("generated_code_size_in_bytes")}
    peak = get("peak_memory_in_bytes")
    if peak:
        # XLA:TPU's peak counts the host-memory arguments too (a model.offload=host forward's
        # peak equals the resident one's, growing by each layer's host bytes): device memory
        # is the rest
        peak -= out["host_argument_bytes"]
    out["peak_bytes"] = peak or (out["argument_bytes"] + out["output_bytes"] + out["temp_bytes"]
                                 - out["alias_bytes"])
    out.update(device_peak(out))
    return out


#: how :func:`device_peak`'s numbers map to a chip's ``memory_stats()``
DEVICE_PEAK_HOW = ("buffers = arguments + outputs - aliased + generated code (device memory; "
                   "host-memory arguments excluded): what memory_stats()['peak_bytes_in_use'] "
                   "reads; temporaries = the program's temp allocation: what "
                   "'peak_bytes_reserved' reads (reserved whole per loaded executable); "
                   "device peak = their sum")


def device_peak(m: dict) -> dict:
    """The device's peak a chip will show for one program of :func:`memory`'s numbers ``m``
    (measured on a v5e, JAX 0.10.2, ``benchmarks/tpu_chip.py --part memprobe``: the runtime
    counts buffers in ``peak_bytes_in_use`` and holds a loaded executable's temporaries, whole,
    as ``bytes_reserved``, so XLA's heap-simulated ``peak_memory_in_bytes`` is not what a chip
    holds): ``device_buffer_bytes`` (arguments in device memory + outputs - aliased +
    generated code), ``device_temp_bytes`` and ``device_peak_bytes``, their sum."""
    buffers = m["argument_bytes"] + m["output_bytes"] - m["alias_bytes"] + m.get("code_bytes", 0)
    return {"device_buffer_bytes": buffers, "device_temp_bytes": m["temp_bytes"],
            "device_peak_bytes": buffers + m["temp_bytes"]}


def against(m: dict, chip: Chip) -> dict:
    """Whether :func:`device_peak`'s ``device_peak_bytes`` of ``m`` fits ``chip``: against
    its :attr:`~ditax.plan.targets.Chip.limit_bytes` (``hbm_capacity_bytes``; v5e: the
    runtime's ``bytes_limit``, 15.75 GiB, which XLA enforces). XLA's own heap peak
    (``peak_bytes``) is not what a chip holds: the temporaries are reserved whole."""
    return {"hbm_capacity_bytes": int(chip.limit_bytes),
            "fits": m["device_peak_bytes"] <= chip.limit_bytes,
            "device_peak_how": DEVICE_PEAK_HOW}


def wire_bytes(collective_bytes: dict) -> float:
    return sum(WIRE_FACTOR.get(k, 1.0) * v for k, v in collective_bytes.items())


def roofline(flops: float, hbm_bytes: float, collective_bytes: dict, chip: Chip,
             host_bytes: float = 0.0) -> dict:
    """Seconds bound by compute, HBM and ICI on ``chip`` (and, with ``host_bytes`` copied
    from host memory, the host link: :data:`HOST_LINK_BYTES_PER_S`), and the largest."""
    parts = {"compute_s": flops / chip.bf16_flops, "hbm_s": hbm_bytes / chip.hbm_bandwidth,
             "ici_s": wire_bytes(collective_bytes) / chip.ici_bandwidth}
    if host_bytes:
        parts["host_s"] = host_bytes / HOST_LINK_BYTES_PER_S
    bound = max(parts, key=parts.get)
    return {**parts, "estimate_s": parts[bound], "bound": bound[:-2], "chip": chip.name}


def layer_loop(loops: list[dict], num_layers: int | None) -> dict | None:
    """The layer scan among :func:`~ditax.plan.audit.audit`'s ``loops``: of those with
    ``num_layers`` trips (windowed-einsum loops inside a two-layer compile have 2 too), the
    one whose iteration holds the most HBM traffic (its body holds theirs) — the first one
    found was a windowed loop in the 14B context8 shard_major compile. None without one."""
    same = [lp for lp in loops if num_layers and lp["trip"] == num_layers]
    return max(same, key=lambda lp: (lp["hbm_bytes"], lp["tpu_custom_calls"]), default=None)


def measure(compiled, *, compile_s: float, model_flops: float, num_layers: int | None = None,
            chip: Chip | None = None, hlo_path=None) -> dict:
    """Everything ``ditax plan`` reports about one compiled program (per device, per call).

    ``model_flops``: the model's matmul FLOPs per device (analytic, attention kernels
    included); ``flops`` is the larger of it and the matmul FLOPs counted in the compiled HLO
    outside Mosaic kernels (``xla_flops``: includes remat recompute and padding).
    ``per_layer``: one iteration of the loop that runs ``num_layers`` times (the layer scan),
    when there is one. ``hlo_path``: also write the compiled HLO text there.
    """
    text = compiled.as_text()
    if hlo_path is not None:
        from ditax.io.outputs import atomic_file

        with atomic_file(hlo_path) as tmp:      # whole or not at all
            tmp.write_text(text)
    a = audit(text)
    out = {**memory(compiled), "compile_s": round(compile_s, 2)}
    out.update({k: a[k] for k in _AUDIT_KEYS})
    out["model_flops"] = float(model_flops)
    out["flops"] = float(max(model_flops, a["xla_flops"]))
    out["unknown_trip_counts"] = a["unknown_trip_counts"]
    layer = layer_loop(a["loops"], num_layers)
    out["per_layer"] = ({k: layer[k] for k in _AUDIT_KEYS} if layer else None)
    out["loops"] = [{"trip": lp["trip"], "copy_ops": lp["copy_ops"],
                     "copy_bytes": lp["copy_bytes"]} for lp in a["loops"]]
    if chip is not None:
        out.update(against(out, chip))
        out["roofline"] = roofline(out["flops"], a["hbm_bytes"], a["collective_bytes"], chip,
                                   a["host_to_device_bytes"])
    return out


__all__ = ["measure", "memory", "device_peak", "against", "DEVICE_PEAK_HOW", "roofline",
           "compile_timed", "layer_loop", "WIRE_FACTOR", "HOST_LINK_BYTES_PER_S"]
