"""The fabric's domain: the UB timing authority (engine.py), its collectives, its outage and its
metrics; services/fabric.py translates."""
