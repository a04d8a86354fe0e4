"""The one rule for the sizes a family's model takes: what every entry (``ditax preprocess``,
``train``, ``generate``, ``serve``, ``plan``) checks a size or a frame count with, before any
work.

A family declares it (:meth:`ditax.models.base.ModelFamily.size_rule`, for a pipeline folder
or a model config) as the VAE's factors times the transformer's patch: sides are multiples of
``spatial`` pixels (Wan 2.1: the VAE's 8x and the 2x2 patch = 16; the Wan demo: 4x and 4x4 =
16; FLUX.1 / FLUX.2: 8x and the 2x2 packing = 16; LTX-2: 32x and 1x1 = 32) and a video is
``temporal·k + 1`` frames (the first frame alone: Wan 4, LTX-2 8; ``temporal`` None: still
images, one frame). ``latent`` is the same rule one level down, on the latent grid the family's
``latent_shape`` gives (a dataset's latents): ``(F, Y, X)`` multiples of it.

A size off the rule is one line naming the value (``width=72``, ``data.width=72``), the rule
and where it comes from, and the nearest valid values. Light: no JAX.
"""

from __future__ import annotations

from dataclasses import dataclass

from ditax.errors import RequestError

#: how each entry names the three sizes ``(height, width, frames)``: the request's field
#: names (``ditax generate`` words them so too, as ``ditax serve`` does), a config section's keys
NAMES = {"request": ("height", "width", "num_frames"),
         "data": ("data.height", "data.width", "data.num_frames"),
         "sample": ("sample.height", "sample.width", "sample.num_frames")}


@dataclass(frozen=True)
class SizeRule:
    """``family``'s sizes: sides multiples of ``spatial`` pixels, ``temporal·k + 1`` frames
    (None: one frame), ``latent`` ``(F, Y, X)`` multiples of the latent grid; ``why`` says
    where ``spatial`` comes from (``"the VAE's 8x and the transformer's 2x2 patch"``) and
    ``why_frames`` where ``temporal`` does."""

    family: str
    spatial: int
    temporal: int | None
    why: str
    why_frames: str = ""
    latent: tuple[int, int, int] = (1, 1, 1)

    def side_ok(self, v) -> bool:
        return _int(v) and v >= self.spatial and v % self.spatial == 0

    def frames_ok(self, n) -> bool:
        if not _int(n) or n < 1:
            return False
        return n == 1 if self.temporal is None else (n - 1) % self.temporal == 0

    def nearest_sides(self, v: int) -> tuple[int, ...]:
        """The valid sides nearest ``v``: the one below (if any) and the one above."""
        s = self.spatial
        lo = (int(v) // s) * s
        return (lo, lo + s) if lo >= s else (s,)

    def nearest_frames(self, n: int) -> tuple[int, ...]:
        """The valid frame counts nearest ``n``: the one below (if any) and the one above."""
        t = self.temporal
        if t is None:
            return (1,)
        k = max(0, (int(n) - 1) // t)
        return (t * k + 1, t * (k + 1) + 1) if n > 1 else (1, t + 1)

    def frames_rule(self) -> str:
        """``"4k+1 (the VAE's 4x in time...: 1, 5, 9, ...)"``; ``"1"`` for still images."""
        if self.temporal is None:
            return "1"
        t, why = self.temporal, f"{self.why_frames}: " if self.why_frames else ""
        return f"{t}k+1 ({why}1, {t + 1}, {2 * t + 1}, ...)"

    def check(self, height=None, width=None, frames=None, names: str = "request",
              error=RequestError) -> None:
        """Raise ``error`` for the first of ``height`` / ``width`` / ``frames`` (None: not
        given) off the rule, named as :data:`NAMES` ``names`` says (the same words on every
        surface: the CLI's, the API's, Python's), with the nearest valid values."""
        h_name, w_name, f_name = NAMES.get(names, NAMES["request"])
        for name, v in ((h_name, height), (w_name, width)):
            if v is not None and not self.side_ok(v):
                near = self.nearest_sides(v) if _int(v) else (self.spatial,)
                raise error(f"{name}={v!r} must be a positive multiple of {self.spatial} "
                            f"({self.why}) on this {self.family} model; use "
                            f"{' or '.join(map(str, near))}")
        if frames is not None and not self.frames_ok(frames):
            near = self.nearest_frames(frames if _int(frames) else 1)
            rule = ("1 (a still image)" if self.temporal is None else
                    f"of the form {self.frames_rule()}")
            raise error(f"{f_name}={frames!r} must be {rule} on this {self.family} model; use "
                        f"{' or '.join(map(str, near))}")

    def check_latents(self, latent_shape, where: str, error=RequestError,
                      dataset: bool = False, say=None) -> None:
        """Latents ``[C, F, Y, X]`` (``where``'s) on the latent grid: each of ``F, Y, X`` a
        multiple of :attr:`latent`; the fix: ``say(nearest [C, F, Y, X] on it)``, else that
        shape, or for a ``dataset`` the sizes to preprocess at."""
        shape = [int(n) for n in latent_shape]
        if any(n % m for n, m in zip(shape[-3:], self.latent)):
            near = shape[:-3] + [max(m, round(n / m) * m)
                                 for n, m in zip(shape[-3:], self.latent)]
            fix = (say(near) if say else f"preprocess the videos at sides that are "
                   f"multiples of {self.spatial} pixels" if dataset else f"e.g. {near}")
            raise error(f"{where}: latents {shape} are off the {self.family} model's grid: "
                        f"(F, Y, X) must be multiples of {self.latent} (in pixels: sides "
                        f"multiples of {self.spatial}, {self.why}); {fix}")


def _int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


__all__ = ["NAMES", "SizeRule"]
