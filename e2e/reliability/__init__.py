"""Reliability suite (issue 8): faults, load and hostile input against the real local control plane.

See docs/reliability.md for the table of scenarios, what each test does, what
held and the figures measured, and `kit.py` for the shared helpers.
"""
