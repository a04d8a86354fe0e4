"""Recipes: end-to-end runs built from ditax's own commands (:mod:`.demo_model`)."""
