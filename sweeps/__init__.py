"""Sweeps (SPEC F27, F28): configuration, parameter suggestions, claims and trial lifecycle."""
