"""Sweeps (docs/design/sweeps.md#sweeps, #requeue): configuration, parameter suggestions, claims and trial lifecycle."""
