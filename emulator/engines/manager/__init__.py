"""The cluster manager's domain: the engine (engine.py) over its detection from liveness streams
(liveness.py) and collective arrivals (stragglers.py), its actions (actions.py), its status and
metrics."""
