"""Rounds, steps and requests at the full model shapes (random weights)."""
