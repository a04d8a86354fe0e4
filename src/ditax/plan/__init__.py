"""``ditax plan``: what a config costs on a mesh or a TPU topology, without the hardware.

- :func:`plan` (:mod:`.core`): parameters and their shardings, and (compiled from abstract
  shapes) per-device memory, relayout copies, FLOPs, collective bytes and a roofline time of
  the forward and of one training step;
- :mod:`.targets`: the chips and topologies ``--target`` names (``tpu-v6e-8``, ``cpu:8``);
- :mod:`.hlo` / :mod:`.audit`: the count of copies and collectives in compiled HLO text.

Importing this package is light (no JAX): ``ditax plan`` sets up the devices JAX starts with
(``cpu:N``) before anything imports it.
"""

__all__ = ["plan"]


def __getattr__(name):
    if name == "plan":
        from ditax.plan.core import plan

        return plan
    raise AttributeError(f"module 'ditax.plan' has no attribute {name!r}")
