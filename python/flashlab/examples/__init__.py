"""Schedules written in Python on the tile-memory interface (flashlab.schedules)."""
