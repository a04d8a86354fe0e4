"""The relayout / collective audit of one compiled program (see :mod:`ditax.plan.hlo`).

:func:`audit` returns per-call, per-device totals (loop trip counts included) and, for each
``while`` loop, what one iteration does — for a model whose layers run under ``scan`` the
loop with ``num_layers`` iterations is "per layer". XLA:TPU's reduce-scatters (an all-reduce
whose fusion keeps one slice) count as ``reduce-scatter``.
"""

from __future__ import annotations

import re

from ditax.plan.hlo import (_ARRAY, COLLECTIVES, Computation, Instr, call_graph, multiplicities,
                            parse)

KERNEL_TARGET = 'custom_call_target="tpu_custom_call"'
HOST_SPACE = "S(5)"      # a layout's memory space of host memory (model.offload=host)
_VIEWS = ("bitcast", "get-tuple-element", "reshape")


def _through(comp: Computation | None, ins: Instr | None) -> Instr | None:
    """Follow bitcast / reshape / get-tuple-element chains from ``ins`` to its producer."""
    for _ in range(16):
        if comp is None or ins is None or ins.opcode not in _VIEWS or not ins.operands:
            return ins
        ins = comp.instrs.get(ins.operands[0])
    return ins


def _collective_kind(op: str) -> str | None:
    """The collective an opcode performs; async pairs count at ``-done`` only."""
    base = op[:-5] if op.endswith("-done") else op
    return base if base in COLLECTIVES else None


# copy-start / -done and slice-start / -done: XLA's memory-space moves (prefetches into and
# evictions out of on-chip memory, whole or in chunks; ConcatBitcast joins the chunks in
# place) — their consumers' reads are counted already, as if from HBM
_NO_TRAFFIC = ("parameter", "constant", "tuple", "get-tuple-element", "bitcast", "while",
               "conditional", "call", "after-all", "partition-id", "replica-id", "iota",
               "copy-start", "copy-done", "slice-start", "slice-done", "opt-barrier")
_NO_TRAFFIC_CALLS = ('custom_call_target="ConcatBitcast"',)


def _dims(shape: str) -> list[int]:
    m = _ARRAY.search(shape)
    return [int(d) for d in m.group(2).split(",") if d] if m else []


def _prod(xs) -> int:
    n = 1
    for x in xs:
        n *= x
    return n


def matmul_flops(comp: Computation, ins: Instr) -> int:
    """FLOPs of a ``dot`` or ``convolution`` (2 per multiply-add; TPU writes matmuls as
    convolutions): output elements times the contraction each needs."""
    if ins.opcode == "dot" and ins.operands and ins.operands[0] in comp.instrs:
        lhs = _dims(comp.instrs[ins.operands[0]].shape)
        m = re.search(r"lhs_contracting_dims=\{([\d,]*)\}", ins.attrs)
        contract = [lhs[int(i)] for i in m.group(1).split(",") if i] if m else []
        return 2 * _prod(_dims(ins.shape)) * _prod(contract)
    if ins.opcode != "convolution" or len(ins.operands) < 2 or any(
            o not in comp.instrs for o in ins.operands[:2]):
        return 0
    lhs, rhs = (_dims(comp.instrs[o].shape) for o in ins.operands[:2])
    m = re.search(r"dim_labels=(\w+)_(\w+)->", ins.attrs)
    if not m or len(m.group(1)) != len(lhs) or len(m.group(2)) != len(rhs) or "i" not in m.group(2):
        return 0
    ll, rl = m.group(1), m.group(2)
    per_out = rhs[rl.index("i")]
    dil = re.search(r"lhs_dilate=([\dx]+)", ins.attrs)
    dilate = [int(v) for v in dil.group(1).split("x")] if dil else []
    for d, w in zip(rl, rhs):        # a window over a padded input reads at most its length
        if d.isdigit():
            w = min(w, lhs[ll.index(d)]) if d in ll else w
            # over an input dilated by n only every n-th tap meets a real element (XLA
            # writes some dots this way: lhs_dilate=n with a window of n)
            n = dilate[int(d)] if int(d) < len(dilate) else 1
            per_out *= -(-w // n)
    return 2 * _prod(_dims(ins.shape)) * per_out


_SLICES = ("slice", "dynamic-slice")


def _params_and_users(comp: Computation):
    """``{parameter index: name}`` and ``{name: [users]}`` of a computation."""
    params, users = {}, {}
    for ins in comp.instrs.values():
        if ins.opcode == "parameter" and ins.args.strip().isdigit():
            params[int(ins.args)] = ins.name
        for o in ins.operands:
            users.setdefault(o, []).append(ins)
    return params, users


def _real_users(comp: Computation, users: dict, name: str) -> list[Instr]:
    """Users of ``name``, looking through bitcasts."""
    out, frontier = [], [name]
    for _ in range(8):
        nxt = []
        for u in (u for n in frontier for u in users.get(n, ())):
            (nxt.append(u.name) if u.opcode == "bitcast" else out.append(u))
        if not nxt:
            break
        frontier = nxt
    return out


def _scatters(comp: Computation, ins: Instr) -> bool:
    """``ins`` (an all-reduce) is a reduce-scatter as XLA:TPU writes one: the body of a
    ``kCustom`` fusion (``%all-reduce-scatter…``) whose root keeps only this device's slice
    of the all-reduce (a ``dynamic-slice`` by partition id)."""
    root = _through(comp, comp.root)
    return (root is not None and root.opcode == "dynamic-slice" and bool(root.operands)
            and _through(comp, comp.instrs.get(root.operands[0])) is ins)


def _collective_bytes(comp: Computation, ins: Instr, kind: str) -> int:
    """Bytes a collective moves per device: its output, except reduce-scatter (its input:
    the output is one shard of what is sent; an all-reduce + slice: the all-reduce's)."""
    if kind != "reduce-scatter" or ins.opcode.startswith("all-reduce"):
        return ins.nbytes
    src = comp.instrs.get(ins.operands[0]) if ins.opcode.endswith("-done") else ins
    if src is None:
        return ins.nbytes
    return sum(comp.instrs[o].nbytes for o in src.operands if o in comp.instrs) or ins.nbytes


def _zero() -> dict:
    return {"xla_flops": 0, "hbm_bytes": 0, "copy_ops": 0, "copy_bytes": 0,
            "fused_copy_ops": 0, "fused_copy_bytes": 0, "a2a_copy_ops": 0, "a2a_copy_bytes": 0,
            "all_to_all_ops": 0, "collective_bytes": {}, "tpu_custom_calls": 0,
            "host_to_device_bytes": 0}


def _host_to_device(comp: Computation, ins: Instr) -> int:
    """Bytes an async copy's ``*-done`` brings from host memory (memory space ``S(5)``) to
    the device: its start reads a host array and the done's result is not one (0 else)."""
    if ins.opcode not in ("dynamic-slice-done", "copy-done") or not ins.operands:
        return 0
    start = comp.instrs.get(ins.operands[0])
    if start is None or HOST_SPACE not in start.shape or HOST_SPACE in ins.shape:
        return 0
    return ins.nbytes


class _Program:
    """Parsed computations and which of them are fusion bodies (top level or nested)."""

    def __init__(self, text: str):
        self.comps = parse(text)
        self.graph = call_graph(self.comps)      # once: the audit counts from many roots
        self._once: dict[str, dict] = {}         # each computation's counts for one run
        self.entry = next(c.name for c in self.comps.values() if c.entry)
        self.top_fused: set[str] = set()
        self.fused: set[str] = set()
        for comp in self.comps.values():
            for ins in comp.instrs.values():
                if ins.opcode == "fusion":
                    self.fused.update(c for _, c in ins.callees())
        for comp in self.comps.values():
            if comp.name not in self.fused:
                for ins in comp.instrs.values():
                    if ins.opcode == "fusion":
                        self.top_fused.update(c for _, c in ins.callees())

    def copy_rooted(self, ins: Instr | None) -> bool:
        """``ins`` writes a relaid-out buffer: a copy, or a fusion whose root is one."""
        if ins is None:
            return False
        if ins.opcode == "copy":
            return True
        if ins.opcode != "fusion":
            return False
        comp = self.comps.get(dict(ins.callees()).get("calls", ""))
        root = _through(comp, comp.root) if comp is not None else None
        return root is not None and root.opcode == "copy"

    def traffic(self, comp: Computation, ins: Instr) -> int:
        """HBM bytes one top-level instruction reads and writes: its output and operands,
        except that (dynamic-)slices read only their slice and a dynamic-update-slice (also as
        a fusion's root: updated in place) writes only its update."""
        size = lambda name: comp.instrs[name].nbytes if name in comp.instrs else 0  # noqa
        if ins.opcode == "dynamic-update-slice" and len(ins.operands) > 1:
            return 2 * size(ins.operands[1])
        if ins.opcode in _SLICES:
            return 2 * ins.nbytes
        if ins.opcode != "fusion":
            return ins.nbytes + sum(size(o) for o in ins.operands)
        fc = self.comps.get(dict(ins.callees()).get("calls", ""))
        if fc is None:
            return ins.nbytes + sum(size(o) for o in ins.operands)
        params, users = _params_and_users(fc)
        written, in_place = ins.nbytes, None
        root = _through(fc, fc.root)
        if root is not None and root.opcode == "dynamic-update-slice" and len(root.operands) > 1:
            written = fc.instrs[root.operands[1]].nbytes if root.operands[1] in fc.instrs else 0
            in_place = getattr(_through(fc, fc.instrs.get(root.operands[0])), "name", None)
        read = 0
        for i, o in enumerate(ins.operands):
            p = params.get(i)
            if p is None or p == in_place:
                continue
            uses = _real_users(fc, users, p)
            if uses and all(u.opcode in _SLICES for u in uses):
                read += sum(u.nbytes for u in uses)
            else:
                read += size(o)
        return written + read

    def a2a_copies(self, comp: Computation) -> dict[str, Instr]:
        """Materialised copies feeding an all-to-all of ``comp`` or reading its result."""
        users: dict[str, list[Instr]] = {}
        for ins in comp.instrs.values():
            for o in ins.operands:
                users.setdefault(o, []).append(ins)
        found: dict[str, Instr] = {}
        for ins in comp.instrs.values():
            if _collective_kind(ins.opcode) not in ("all-to-all", "ragged-all-to-all"):
                continue
            for o in ins.operands:
                src = _through(comp, comp.instrs.get(o))
                if self.copy_rooted(src):
                    found[src.name] = src
            frontier = [ins.name]
            for _ in range(8):                    # through views to the first real users
                nxt = []
                for u in (u for name in frontier for u in users.get(name, ())):
                    if u.opcode in _VIEWS:
                        nxt.append(u.name)
                    elif self.copy_rooted(u):
                        found[u.name] = u
                frontier = nxt
        return found

    def count(self, name: str, m: int, out: dict) -> None:
        """Add ``m`` runs of computation ``name`` into ``out`` (every count is ``m`` times
        one run's, which is counted once per program)."""
        once = self._once.get(name)
        if once is None:
            once = self._once[name] = _zero()
            self._count(name, once)
        for k, v in once.items():
            if k == "collective_bytes":
                for kind, b in v.items():
                    out[k][kind] = out[k].get(kind, 0) + m * b
            else:
                out[k] += m * v

    def _count(self, name: str, out: dict, m: int = 1) -> None:
        """Add one run of computation ``name`` into ``out``."""
        comp = self.comps[name]
        root = _through(comp, comp.root)
        top = name not in self.fused
        for ins in comp.instrs.values():
            out["xla_flops"] += m * matmul_flops(comp, ins)
            if top and ins.opcode not in _NO_TRAFFIC and not any(
                    c in ins.attrs for c in _NO_TRAFFIC_CALLS):
                out["hbm_bytes"] += m * self.traffic(comp, ins)
            if ins.opcode == "copy" and _dims(ins.shape):     # scalar copies move nothing
                key = "copy" if (name not in self.fused or (name in self.top_fused
                                                             and ins is root)) else "fused_copy"
                out[f"{key}_ops"] += m
                out[f"{key}_bytes"] += m * ins.nbytes
            kind = _collective_kind(ins.opcode)
            if kind == "all-reduce" and _scatters(comp, ins):
                kind = "reduce-scatter"
            if kind is not None:
                out["collective_bytes"][kind] = out["collective_bytes"].get(kind, 0) + (
                    m * _collective_bytes(comp, ins, kind))
                out["all_to_all_ops"] += m * (kind == "all-to-all")
            if ins.opcode == "custom-call" and KERNEL_TARGET in ins.attrs:
                out["tpu_custom_calls"] += m
            out["host_to_device_bytes"] += m * _host_to_device(comp, ins)
        if name not in self.fused:
            for c in self.a2a_copies(comp).values():
                out["a2a_copy_ops"] += m
                out["a2a_copy_bytes"] += m * c.nbytes

    def totals(self, roots) -> tuple[dict, dict, int]:
        mult, loops, unknown = multiplicities(self.comps, roots, self.graph)
        out = _zero()
        for name, m in mult.items():
            if m:
                self.count(name, m, out)
        return out, loops, unknown


def audit(text: str) -> dict:
    """Per-call totals and per-loop-iteration counts of compiled HLO ``text`` (one device).

    Keys: ``copy_ops`` / ``copy_bytes`` (materialised relayout copies: a ``copy`` outside
    fusions, or a fusion whose root is one), ``fused_copy_ops`` / ``fused_copy_bytes`` (copies
    inside compute fusions), ``a2a_copy_ops`` / ``a2a_copy_bytes`` (materialised copies next
    to an all-to-all), ``all_to_all_ops``, ``collective_bytes`` (output bytes per collective
    kind), ``tpu_custom_calls`` (Mosaic kernels), ``unknown_trip_counts`` (loops counted once
    because their trip count was not of the form ``i < N``) and ``loops``: one entry per
    ``while`` loop, ``{"trip": n, ...the same counts for one iteration}``, most trips first.
    """
    prog = _Program(text)
    out, loops, unknown = prog.totals([prog.entry])
    out["unknown_trip_counts"] = unknown
    out["loops"] = []
    for body, (trip, _) in loops.items():
        one, _, _ = prog.totals([body])
        out["loops"].append({"trip": trip, **one})
    out["loops"].sort(key=lambda d: -(d["trip"] or 0))
    return out


def copy_list(text: str) -> list[dict]:
    """Every materialised relayout copy of compiled HLO ``text`` (what ``copy_ops`` /
    ``copy_bytes`` count), largest total first: ``{"runs": times per call (loop trips
    included), "bytes": one run's output bytes, "shape": output shape and layout, "from":
    operand shapes and layouts, "computation": where it sits, "op_name": the jax operation
    it came from (metadata; may be empty)}`` — to see which copies a program makes, e.g.
    those of the layer loop (``computation`` its body)."""
    prog = _Program(text)
    mult, _, _ = multiplicities(prog.comps, [prog.entry], prog.graph)
    rows = []
    for name, m in mult.items():
        if not m or name in prog.fused:
            continue
        comp = prog.comps[name]
        for ins in comp.instrs.values():
            if not prog.copy_rooted(ins) or not _dims(ins.shape):
                continue
            src = ins
            if ins.opcode == "fusion":
                fc = prog.comps.get(dict(ins.callees()).get("calls", ""))
                src = _through(fc, fc.root) if fc is not None else ins
            op = re.search(r'op_name="([^"]*)"', src.attrs) or re.search(
                r'op_name="([^"]*)"', ins.attrs)
            rows.append({"runs": m, "bytes": ins.nbytes, "shape": ins.shape.split(" ")[0],
                         "from": [comp.instrs[o].shape.split(" ")[0] for o in ins.operands
                                  if o in comp.instrs],
                         "computation": name, "op_name": op.group(1) if op else ""})
    rows.sort(key=lambda r: -r["runs"] * r["bytes"])
    return rows


__all__ = ["audit", "copy_list", "KERNEL_TARGET"]
