"""The scale-out RDMA gateway's domain: queue pairs, operations timed by the plane's authority,
the plane's faults (engine.py, state.py, plane.py), and KV caches over RDMA (kv.py)."""
