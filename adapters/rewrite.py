"""Exact re-expressions of ops the stack does not lower (being written; registers nothing yet)."""
