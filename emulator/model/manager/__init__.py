"""The cluster manager's pure parts: per-device detection and the incident book."""
