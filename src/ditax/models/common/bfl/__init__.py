"""What FLUX.1 (:mod:`ditax.models.flux`) and FLUX.2 (:mod:`ditax.models.flux2`) — Black
Forest Labs' two dual-stream DiTs — share, written once: the config views and rules
(:mod:`.config`), the transformer's frame (:mod:`.transformer`: the joint token layout, the two
block stacks, the head), the family interface (:mod:`.family`), the BFL ↔ diffusers name table
(:mod:`.names`) and BFL's single-file checkpoints (:mod:`.single_file`). Each family gives its
own data (modules, tables, names); nothing here imports a family.

Nothing is imported here (the family registry's discovery stays light).
"""
