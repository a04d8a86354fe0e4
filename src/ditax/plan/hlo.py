"""What a compiled XLA program materialises, counted from its optimised HLO text.

``compiled.as_text()`` (``jax.stages.Compiled``) is the per-device program after every XLA
pass, layouts included. :func:`parse` splits it into computations and instructions (only what
the audit needs: name, shape, opcode, operands, called computations); :func:`audit` counts

- relayout ``copy`` instructions (ops and output bytes): *materialised* ones — a ``copy`` in a
  non-fusion computation, or the root (through bitcasts) of a fusion called from one, i.e. a
  copy that writes a new buffer — and *fused* ones inside larger fusions (a layout change done
  on the way into a compute fusion);
- the copies next to each ``all-to-all`` (feeding it or reading its result, through bitcasts);
- collective bytes per kind (output bytes of each collective; async pairs counted once);
- the ``tpu_custom_call`` (Mosaic kernel) calls;

each weighted by how often it runs per call of the program: a ``while`` body counts its trip
count times (read from the loop condition ``i < N``, the counter's initial value and its
step; nested loops multiply). The HLO text is the recount: ``ditax plan --dump-hlo FILE`` writes it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2,
               "s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8,
               "c128": 16, "f8e4m3fn": 1, "f8e5m2": 1, "f8e4m3b11fnuz": 1, "s4": 1, "u4": 1}
COLLECTIVES = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all",
               "collective-permute", "ragged-all-to-all", "collective-broadcast")
_PASS_THROUGH = ("bitcast", "get-tuple-element", "reshape")
_HEADER = re.compile(r"^(ENTRY )?%([\w.\-]+) \(.*\{\s*$")
_INSTR = re.compile(r"^\s*(ROOT )?%([\w.\-]+) = ")
_ARRAY = re.compile(r"([a-z][a-z0-9]*)\[([\d,]*)\]")
_CALLS = re.compile(r"\b(calls|body|condition|true_computation|false_computation)=%([\w.\-]+)")
_LISTS = re.compile(r"\b(?:branch_computations|called_computations)=\{([^}]*)\}")


@dataclass
class Instr:
    name: str
    shape: str          # HLO shape text, e.g. "bf16[8,128]{1,0:T(8,128)(2,1)}" or a tuple
    opcode: str
    operands: list[str]
    attrs: str
    root: bool = False
    args: str = ""      # the raw text inside the parentheses (a constant's value)
    _callees: list | None = field(default=None, repr=False, compare=False)

    @property
    def nbytes(self) -> int:
        """Bytes of every array in the shape (a tuple: the sum)."""
        return shape_bytes(self.shape)

    def callees(self) -> list[tuple[str, str]]:
        """``(role, computation)`` pairs this instruction calls (reducers' ``to_apply`` are
        scalar code and skipped). Read once (the audit asks for each instruction's callees
        many times)."""
        if self._callees is None:
            out = [(m.group(1), m.group(2)) for m in _CALLS.finditer(self.attrs)]
            for m in _LISTS.finditer(self.attrs):
                out += [("branch", n.strip().lstrip("%")) for n in m.group(1).split(",")
                        if n.strip()]
            self._callees = out
        return list(self._callees)


@dataclass
class Computation:
    name: str
    instrs: dict[str, Instr] = field(default_factory=dict)
    entry: bool = False

    @property
    def root(self) -> Instr | None:
        return next((i for i in self.instrs.values() if i.root), None)


def shape_bytes(shape: str) -> int:
    """Total bytes of the arrays in an HLO shape string (layouts ignored)."""
    total = 0
    for m in _ARRAY.finditer(shape.split("{")[0] if not shape.startswith("(") else shape):
        dims = [int(d) for d in m.group(2).split(",") if d]
        n = 1
        for d in dims:
            n *= d
        total += n * DTYPE_BYTES.get(m.group(1), 0)
    return total


def _balanced(text: str, start: int) -> int:
    """Index just past the bracket group opening at ``text[start]``."""
    depth = 0
    for i in range(start, len(text)):
        c = text[i]
        if c in "({[":
            depth += 1
        elif c in ")}]":
            depth -= 1
            if depth == 0:
                return i + 1
    return len(text)


def _instr(line: str) -> Instr | None:
    m = _INSTR.match(line)
    if m is None:
        return None
    pos = m.end()
    if line[pos] == "(":
        end = _balanced(line, pos)
    else:
        end = pos + len(line[pos:].split(" ", 1)[0])
    shape = line[pos:end]
    rest = line[end:].lstrip()
    op = re.match(r"([\w\-]+)\(", rest)
    if op is None:
        return None
    close = _balanced(rest, op.end() - 1)
    operands = re.findall(r"%([\w.\-]+)", rest[op.end():close - 1])
    args = rest[op.end():close - 1]
    return Instr(m.group(2), shape, op.group(1), operands, rest[close:], bool(m.group(1)), args)


# a double-quoted string (backslash escapes inside), or an unclosed one to the end of the line
_QUOTED = re.compile(r'"(?:[^"\\]|\\.)*(?:"|\\?$)')


def _brace_depth(line: str) -> int:
    """``{`` minus ``}`` of ``line`` outside double-quoted strings."""
    if '"' in line:
        line = _QUOTED.sub("", line)
    return line.count("{") - line.count("}")


def parse(text: str) -> dict[str, Computation]:
    """Computations by name (the entry has ``entry=True``).

    One instruction may span several lines: a Mosaic kernel's ``frontend_attributes=
    {kernel_metadata={ … }}`` holds line breaks, and its continuation lines start with ``}``
    — an instruction is read until its braces close, so such a line does not end the
    computation (which would drop every instruction after the kernel: a layer loop's
    gradient matmuls and reduce-scatters after its attention kernels)."""
    comps: dict[str, Computation] = {}
    cur, pending, depth = None, None, 0
    for line in text.splitlines():
        if pending is not None:
            pending, depth = pending + "\n" + line, depth + _brace_depth(line)
            if depth <= 0:
                ins = _instr(pending)
                if ins is not None:
                    cur.instrs[ins.name] = ins
                pending = None
            continue
        h = _HEADER.match(line)
        if h:
            cur = comps.setdefault(h.group(2), Computation(h.group(2), entry=bool(h.group(1))))
            continue
        if line.startswith("}"):
            cur = None
            continue
        if cur is not None and _INSTR.match(line):
            depth = _brace_depth(line)
            if depth > 0:
                pending = line
                continue
            ins = _instr(line)
            if ins is not None:
                cur.instrs[ins.name] = ins
    return comps


def _const(comp: Computation, name: str, depth: int = 0) -> int | None:
    ins = comp.instrs.get(name)
    if ins is None or depth > 8:
        return None
    if ins.opcode == "constant":
        m = re.fullmatch(r"\s*(-?\d+)\s*", ins.args)
        return None if m is None else int(m.group(1))
    if ins.opcode in ("copy", "bitcast", "convert") and ins.operands:
        return _const(comp, ins.operands[0], depth + 1)
    return None


def _compare(comps, cond: Computation | None):
    """The condition's root ``compare`` and its operands as names in ``cond`` (a compare
    wrapped in a one-op fusion is looked through)."""
    root = cond.root if cond is not None else None
    if root is None:
        return None, []
    if root.opcode == "compare":
        return root, root.operands
    if root.opcode == "fusion":
        inner = comps.get(dict(root.callees()).get("calls", ""))
        cmp = inner.root if inner is not None else None
        if cmp is not None and cmp.opcode == "compare":
            params = {}
            for ins in inner.instrs.values():
                m = re.fullmatch(r"\s*(\d+)\s*", ins.args) if ins.opcode == "parameter" else None
                if m and int(m.group(1)) < len(root.operands):
                    params[ins.name] = root.operands[int(m.group(1))]
            return cmp, [params.get(o, "") for o in cmp.operands]
    return None, []


def trip_count(comps: dict[str, Computation], caller: Computation, loop: Instr) -> int | None:
    """Iterations of ``loop`` (a ``while``): the condition ``i < N`` (or ``<=``, ``!=``) on a
    tuple element whose initial value in ``caller`` is a constant; None when not of that form."""
    known = re.search(r'"known_trip_count":\{"n":"(\d+)"\}', loop.attrs)
    if known:                               # XLA's own loop analysis, when it records it
        return int(known.group(1))
    roles = dict(loop.callees())
    cond = comps.get(roles.get("condition", ""))
    compare, operands = _compare(comps, cond)
    if compare is None:
        return None
    direction = re.search(r"direction=(\w+)", compare.attrs)
    index = bound = None
    for name in operands:
        ins = cond.instrs.get(name)
        if ins is not None and ins.opcode == "get-tuple-element":
            m = re.search(r"index=(\d+)", ins.attrs)
            index = int(m.group(1)) if m else None
        else:
            bound = _const(cond, name)
    if index is None or bound is None or direction is None:
        return None
    init, step = 0, _step(comps, roles.get("body", ""), index)
    tup = caller.instrs.get(loop.operands[0]) if loop.operands else None
    if tup is not None and tup.opcode == "tuple" and index < len(tup.operands):
        value = _const(caller, tup.operands[index])
        init = 0 if value is None else value
    span = bound - init
    n = {"LT": -(-span // step), "LE": span // step + 1,
         "NE": span // step if span % step == 0 else None}.get(direction.group(1))
    return None if n is None else max(n, 0)


def _step(comps, body_name: str, index: int) -> int:
    """How much the body adds to tuple element ``index`` per iteration: ``c`` for a root
    tuple element ``add(…, constant c)`` (XLA's windowed einsum loops count by 2), else 1."""
    body = comps.get(body_name)
    root = body.root if body is not None else None
    if root is None or root.opcode != "tuple" or index >= len(root.operands):
        return 1
    upd = body.instrs.get(root.operands[index])
    if upd is None or upd.opcode != "add":
        return 1
    steps = [c for c in (_const(body, o) for o in upd.operands) if c is not None and c > 0]
    return steps[0] if len(steps) == 1 else 1


def call_graph(comps: dict[str, Computation]) -> tuple[dict, dict, int]:
    """``(edges, loops, unknown)`` of :func:`multiplicities`: each computation's callees with
    how often one run of it runs them (a loop body and condition: the trip count), the loops
    ``{body: (trip, caller)}`` and the number of loops of unknown trip count. Computed once
    per program and given to :func:`multiplicities` for each of its roots."""
    edges: dict[str, list[tuple[str, int]]] = {}
    loops: dict[str, tuple[int | None, str]] = {}
    unknown = 0
    for comp in comps.values():
        for ins in comp.instrs.values():
            calls = ins.callees()
            if not calls:
                continue
            factor = 1
            if ins.opcode == "while":
                n = trip_count(comps, comp, ins)
                unknown += n is None
                factor = 1 if n is None else n
                body = dict(calls).get("body")
                if body:
                    loops[body] = (n, comp.name)
            for role, callee in calls:
                if callee in comps:
                    edges.setdefault(comp.name, []).append(
                        (callee, factor if role in ("body", "condition") else 1))
    return edges, loops, unknown


def multiplicities(comps: dict[str, Computation], roots=None, graph=None) -> tuple[
        dict[str, int], dict, int]:
    """Times each computation runs per call of ``roots`` (default: the entry); the loops
    ``{body: (trip, caller)}``; and how many loops had an unknown trip count (counted once).
    ``graph``: the program's :func:`call_graph`, when the caller has it already."""
    edges, loops, unknown = graph if graph is not None else call_graph(comps)
    loops = dict(loops)
    order: list[str] = []
    seen: set[str] = set()

    def visit(name):                       # post-order over the call DAG
        if name in seen:
            return
        seen.add(name)
        for callee, _ in edges.get(name, ()):
            visit(callee)
        order.append(name)

    entries = list(roots) if roots is not None else [c.name for c in comps.values() if c.entry]
    for e in entries:
        visit(e)
    mult = {name: 0 for name in comps}
    for e in entries:
        mult[e] = 1
    for name in reversed(order):           # callers before callees
        for callee, factor in edges.get(name, ()):
            mult[callee] += mult[name] * factor
    return mult, loops, unknown
