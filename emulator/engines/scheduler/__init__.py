"""The scheduler's domain: allocations, failures, replacement, spares and the day plans
(engine.py, dayplans.py), and the engine as this process's callers reach it (local.py);
services/scheduler.py translates the wire."""
