"""Synthetic "bright object moves" data for the demo model (issue 12): the fixed vocabulary
(:mod:`.vocab`), a seeded clip generator that writes ``ditax preprocess`` datasets
(:mod:`.clips`), a prompt-following scorer (:mod:`.score`) and contact sheets (:mod:`.sheet`).

Import the submodules directly; this package imports nothing heavy.
"""
