"""The cluster manager's domain: detection from liveness streams (liveness.py)."""
