"""Step-level continuous batching: requests join a running batch between two steps and leave it
when their last step is done, each row at its own step.

:func:`~ditax.pipelines.batch.sample_batch` runs requests of one program shape in lock step
(they start together and end together). :class:`ContinuousBatch` keeps a set of rows instead,
each a request at its own step: :meth:`~ContinuousBatch.add` prepares a request (the
pipeline's ``prepare(**call)``: its checks, text, condition, noise and scheduler state) and
puts it in the batch; :meth:`~ContinuousBatch.step` runs one denoising step for every row
and hands back the outputs of the rows that just took their last step (finalized and decoded
alone, as the pipeline's call does). A server adds waiting requests between two steps, so a
request that arrives while a batch runs starts at the next step instead of after the batch.

What a row keeps of its own: its latents, its scheduler state (step index and the sampler's
history: UniPC's data predictions), its text (cond, uncond), its condition (image-to-video,
control: each row's pytree concatenated on the batch axis), its guidance scale(s) and its LoRA
strengths (``strengths``: one per LoRA the pipeline holds unmerged,
:func:`ditax.lora.unmerged.row_strengths`); the rows and their step program are
:mod:`ditax.pipelines.rows`'s, so a row's result equals its
request run alone within the rounding of a wider matmul. Rows share what shapes the program:
the latent shape, the number of steps and sigmas, guidance on or off and the CFG mode, the
scheduler, the family's rule, the experts and the condition's structure
(:meth:`ContinuousBatch.fits`).

The batch runs padded (:func:`pad_rows`: 1, 2, 4, then multiples of 4; the padding repeats the
first row and is dropped), so a server compiles one step program per padded size. With two experts
(Wan 2.2), the rows of each expert run as their own padded group in a step; so do the rows at
an expert's ``attention.dense_steps`` (its dense twin, :mod:`ditax.pipelines.sparse_steps`)
and the rest. Step-cached
requests and requests with a ``source`` (video-to-video) are refused here with one line:
they run in lock step (:func:`~ditax.pipelines.batch.sample_batch`), as a pipeline that does
not batch runs its requests alone.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ditax.parallel.axes import batch_shards
from ditax.phases import phase
from ditax.pipelines.batch import batchable
from ditax.pipelines.denoise import CARRY, _denoise_step
from ditax.pipelines.rows import Row, _rows_step, pad_rows, program_key
from ditax.pipelines.sampling import Prepared, check_finite, replicate
from ditax.pipelines.slots import Slots
from ditax.pipelines.sparse_steps import dense_twin


class ContinuousBatch:
    """Rows of one program shape at their own steps (module docstring). ``pipe`` a batching
    pipeline (:func:`~ditax.pipelines.batch.batchable`); ``max_rows`` the most rows a step
    runs (the server's ``--max-batch``)."""

    def __init__(self, pipe, max_rows: int = 4):
        if not batchable(pipe):
            raise ValueError(f"ContinuousBatch: {type(pipe).__name__} hands out no loop parts "
                             f"(prepare); run its requests one by one through its call")
        if max_rows < 1:
            raise ValueError(f"max_rows={max_rows}; give at least 1")
        self.pipe, self.max_rows = pipe, max_rows
        self.rows: list[Row] = []
        self.key: tuple | None = None          # the running rows' program_key
        self.slots: Slots | None = None
        self.steps_run = 0                     # step programs run (one per expert group)
        self.resizes = 0                       # times the slots were gathered anew
        self._twins: dict[int, tuple] = {}     # id(expert graph) -> (expert, dense steps, twin)

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def free(self) -> int:
        """Rows that may still join."""
        return self.max_rows - len(self.rows)

    # --- rows in
    def prepare(self, tag: Hashable, call: dict, strengths=None) -> Row:
        """A request as a row, ready to join (its checks, text, condition, noise, scheduler
        state); ValueError for a request that cannot run here (step cache, a source)."""
        p = self.pipe.prepare(**call)
        if p.cache is not None or p.cfg_cache:
            raise ValueError("ContinuousBatch: a step-cached request runs in lock step "
                             "(sample_batch): the cache decides per batch step")
        if p.source is not None:
            raise ValueError("ContinuousBatch: a request with a source (video-to-video) runs "
                             "alone")
        with phase(p.condition_phase):
            condition = jax.block_until_ready(replicate(p.condition(), p.mesh))
        with phase("text"):
            text = jax.block_until_ready(replicate(p.text(p.use_cfg), p.mesh))
        x, state = p.noise(p.checked_latents()), p.schedule()
        s = None if strengths is None else np.asarray(strengths, np.float32).reshape(-1)
        return Row(tag, p, replicate(x, p.mesh), replicate(state, p.mesh), text, condition,
                   np.asarray(state.timesteps), s)

    def fits(self, row: Row) -> bool:
        """Whether ``row`` may join the running rows (the same program shape, a free row)."""
        if self.free < 1:
            return False
        return self.key is None or program_key(row.prepared, row.text, row.condition) == self.key

    def join(self, row: Row) -> None:
        """Put ``row`` in the batch (it runs from the next :meth:`step`); ValueError when it
        does not :meth:`fit`."""
        if not self.fits(row):
            raise ValueError("ContinuousBatch: the request's program shape differs from the "
                             "running rows' (size, frames, steps, guidance on/off, condition)"
                             if self.free else "ContinuousBatch: the batch is full")
        if self.rows and (row.strengths is None) != (self.rows[0].strengths is None):
            raise ValueError("ContinuousBatch: rows with and without LoRA strengths")
        self.key = program_key(row.prepared, row.text, row.condition)
        row.slot = -1
        self.rows.append(row)

    def add(self, tag: Hashable, call: dict, strengths=None) -> Row:
        """:meth:`prepare` then :meth:`join`."""
        row = self.prepare(tag, call, strengths)
        self.join(row)
        return row

    def clear(self) -> None:
        """Every row out (a failed step: the rows' jobs fail together)."""
        self.rows, self.key, self.slots = [], None, None

    def drop(self, tag: Hashable) -> bool:
        """Take a row out (a cancelled request); False when no row has ``tag``."""
        gone = [r for r in self.rows if r.tag == tag]
        for r in gone:
            self._free(r)
        self.rows = [r for r in self.rows if r.tag != tag]
        if not self.rows:
            self.clear()
        return bool(gone)

    def _free(self, row: Row) -> None:
        if row.slot >= 0 and self.slots is not None:
            self.slots.restart(row.slot)
        row.slot = -1

    # --- the slots
    def _multiple(self, p: Prepared) -> int:
        """The padded rows must split over the mesh's batch shards with the forward's rows per
        request (2 for batched CFG)."""
        shards = batch_shards(p.mesh) if p.mesh is not None else 1
        per = 2 if (p.use_cfg and p.cfg_mode == "batched") else 1
        return max(1, shards // np.gcd(shards, per))

    def _place(self) -> None:
        """Every row in a slot, the slots sized for the rows (:func:`pad_rows`): new rows
        written into free slots; slots gathered anew when the rows outgrow them or fit in
        half of them."""
        p = self.rows[0].prepared
        n = pad_rows(len(self.rows), self.max_rows, self._multiple(p))
        new = [r for r in self.rows if r.slot < 0]
        if self.slots is None:
            self.slots = Slots.of(self.rows, n, p.mesh)
            for k, r in enumerate(self.rows):
                r.slot, r.x, r.state, r.text = k, None, None, None
            return
        if n != self.slots.n:                  # grow, or shrink to half
            kept = [r for r in self.rows if r.slot >= 0]
            idx = [r.slot for r in kept]
            idx += [idx[0] if idx else 0] * (n - len(idx))
            self.slots = self.slots.gather(idx)
            self.resizes += 1
            for k, r in enumerate(kept):
                r.slot = k
        used = {r.slot for r in self.rows if r.slot >= 0}
        free = [k for k in range(self.slots.n) if k not in used]
        for r, k in zip(new, free):
            self.slots.write(k, r)
            r.slot, r.x, r.state, r.text = k, None, None, None

    def _extras(self, rows: Sequence[Row], n: int, slot_of):
        """Guidance ``[n]`` and LoRA strengths ``[n, J]`` (None without) of ``rows`` at the
        slots ``slot_of(row)``; a free slot takes the first row's."""
        g = np.full((n,), rows[0].guidance(), np.float32)
        s = None
        if rows[0].strengths is not None:
            s = np.tile(rows[0].strengths, (n, 1))
        for r in rows:
            g[slot_of(r)] = r.guidance()
            if s is not None:
                s[slot_of(r)] = r.strengths
        mesh = rows[0].prepared.mesh
        return replicate(jnp.asarray(g), mesh), (None if s is None
                                                 else replicate(jnp.asarray(s), mesh))

    def program(self, slots: Slots, p: Prepared, expert, extras):
        """The compiled step for ``slots`` running ``expert`` (compiled on first use, in the
        pipeline's :class:`~ditax.pipelines.programs.Programs`), and its arguments."""
        guidance, strengths = extras
        args = (expert.params, slots.states, slots.x, slots.text, guidance, slots.condition,
                strengths)
        return p.programs.step(_rows_step, p.step_static(expert), args, carry=CARRY), args

    @staticmethod
    def alone(slots: Slots, rows: Sequence[Row]) -> bool:
        """Whether the step runs one row in one slot without per-row LoRA strengths: then it is
        the pipeline's own step (:func:`~ditax.pipelines.denoise._denoise_step`), so a request
        that runs alone is its call bit for bit."""
        return slots.n == 1 and len(rows) == 1 and rows[0].strengths is None

    def step_alone(self, slots: Slots, row: Row, expert) -> None:
        """One step of the lone row through the pipeline's own step program."""
        p = row.prepared
        state = jax.tree.map(lambda a: a[0], slots.states)
        args = (expert.params, state, slots.x, slots.text, jnp.float32(row.guidance()),
                slots.condition)
        run = p.programs.step(_denoise_step, p.step_static(expert), args, carry=CARRY)
        x, state = run(*args)      # laid out as they came in (CARRY): the next step's inputs
        slots.x, slots.states = x, jax.tree.map(lambda a: a[None], state)
        self.steps_run += 1

    def step(self) -> list[tuple[Hashable, Any]]:
        """One step for every row; returns ``[(tag, output)]`` of the rows that finished (each
        output what the pipeline's call returns: decoded alone, or its latents), in the order
        they joined. An empty batch does nothing."""
        if not self.rows:
            return []
        self._place()
        slots, p = self.slots, self.rows[0].prepared
        groups: dict[tuple, list[Row]] = {}
        for r in self.rows:
            groups.setdefault(self._which(r), []).append(r)
        if len(groups) == 1 and self.alone(slots, rows := next(iter(groups.values()))):
            self.step_alone(slots, rows[0], self.expert(p, *self._which(rows[0])))
        elif len(groups) == 1:                 # every row runs one expert: the slots as they are
            which, rows = next(iter(groups.items()))
            run, args = self.program(slots, p, self.expert(p, *which),
                                     self._extras(rows, slots.n, lambda r: r.slot))
            slots.x, slots.states = run(*args)
            self.steps_run += 1
        else:                                  # each expert's rows gathered, run, put back
            for which, rows in sorted(groups.items()):
                n = pad_rows(len(rows), self.max_rows, self._multiple(p))
                idx = [r.slot for r in rows]
                sub = slots.gather(idx + [idx[0]] * (n - len(idx)))
                pos = {r.tag: k for k, r in enumerate(rows)}
                run, args = self.program(sub, p, self.expert(p, *which),
                                         self._extras(rows, n, lambda r: pos[r.tag]))
                sub.x, sub.states = run(*args)
                slots.put(idx, sub)
                self.steps_run += 1
        for r in self.rows:
            r.done += 1
        jax.block_until_ready(slots.x)
        done = [r for r in self.rows if r.done >= r.steps]
        if not done:
            return []
        out = [(r.tag, self.finish(r)) for r in done]
        for r in done:
            self._free(r)
        self.rows = [r for r in self.rows if r.done < r.steps]
        if not self.rows:
            self.clear()
        return out

    def _which(self, row: Row) -> tuple[int, bool]:
        """The expert (0, or 1 below the boundary) of ``row``'s next step, and whether it runs
        dense (one of the expert's ``attention.dense_steps``)."""
        which = 1 if row.low() else 0
        k = self._twin(row.prepared.experts[which])[1]
        return which, row.done < k

    def _twin(self, e) -> tuple:
        """``(e, dense steps, dense twin)`` of expert ``e``, built once
        (:func:`~ditax.pipelines.sparse_steps.dense_twin`)."""
        if id(e.graphdef) not in self._twins:
            self._twins[id(e.graphdef)] = (e, *dense_twin(e))
        return self._twins[id(e.graphdef)]

    def expert(self, p: Prepared, which: int, dense: bool = False):
        """Expert ``which`` of ``p``, or its dense twin for a dense step."""
        e = p.experts[which]
        return self._twin(e)[2] if dense else e

    def finish(self, row: Row):
        """A finished row's output, as the pipeline's call gives it."""
        p = row.prepared
        x = self.slots.x[row.slot:row.slot + 1]
        x = x if p.finalize is None else p.finalize(row.condition, x)
        x = jax.block_until_ready(x)
        check_finite(x, "denoise", f"the latents after {row.steps} steps", p.guidance_scale)
        if p.decode is None:
            return np.asarray(x)
        with phase("decode"):
            prepared = None if p.prepare_decode is None else p.prepare_decode()
            out = p.decode(x, prepared)
            check_finite(out, "decode", "the decoded output", p.guidance_scale)
        return out

    # --- ahead of time
    def warm(self, call: dict, sizes: Sequence[int] | None = None, strengths=None,
             threads: int = 4) -> int:
        """Compile, without running a step, what serving ``call`` needs: its text and condition
        encoders (run once on it), the step program of each padded size in ``sizes`` (default:
        every one up to ``max_rows``; with two experts, each expert's; a lone row runs the
        pipeline's own step instead), in parallel threads,
        and its decode. Returns how many step programs were compiled or found."""
        row = self.prepare("warm", call, strengths)
        p = row.prepared
        m = self._multiple(p)
        sizes = sorted({pad_rows(k, self.max_rows, m) for k in (
            sizes or range(1, self.max_rows + 1))})
        experts = p.experts[:2 if p.boundary is not None else 1]
        # every array put on the mesh here, in this thread (in a multi-process mesh each put
        # is a collective, which the compile threads would order differently per process)
        # one slot, one expert, no per-row strengths: a lone row, which runs the pipeline's
        # own step (:meth:`alone`, compiled below), never this size's rows program
        lone = len(experts) == 1 and row.strengths is None
        # attention.dense_steps: the dense twins' programs as well
        experts = list(experts) + [t for t in (self._twin(e)[2] for e in experts)
                                   if t is not None]
        jobs = [(Slots.of([row], n, p.mesh), e) for n in sizes for e in experts
                if not (n == 1 and lone)]
        extras = {n: self._extras([row], n, lambda r: 0) for n in sizes}
        with ThreadPoolExecutor(max(1, min(threads, len(jobs)))) as pool:
            list(pool.map(lambda job: self.program(job[0], p, job[1], extras[job[0].n]),
                          jobs))
        if 1 in sizes and row.strengths is None:   # a lone row: the pipeline's own step
            one = Slots.of([row], 1, p.mesh)
            for e in experts:
                state = jax.tree.map(lambda a: a[0], one.states)
                args = (e.params, state, one.x, one.text, jnp.float32(row.guidance()),
                        one.condition)
                p.programs.step(_denoise_step, p.step_static(e), args, carry=CARRY)
            jax.block_until_ready(jax.tree.map(lambda a: a[None], state))
        # the small programs around the steps, at every size: a join's write, a freed slot's
        # restart, a resize's gather (and a second expert's put back), a finished row's slice
        for n in sizes:
            slots = Slots.of([row], n, p.mesh)
            slots.write(0, row)
            slots.restart(0)
            for n2 in sizes:
                sub = slots.gather([0] * n2)
                if len(experts) > 1:
                    for k in range(1, min(n, n2) + 1):
                        slots.put(list(range(k)), sub)
            jax.block_until_ready(slots.x[0:1])   # a finished row's slice
        self.slots, row.slot = Slots.of([row], 1, p.mesh), 0
        jax.block_until_ready(self.finish(row))    # finalize, checks, decode: once
        self.slots, row.slot = None, -1
        return len(jobs)


__all__ = ["ContinuousBatch", "Row", "Slots", "pad_rows", "program_key"]
