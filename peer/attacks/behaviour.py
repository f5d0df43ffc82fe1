"""Attacks (filled in below)."""
