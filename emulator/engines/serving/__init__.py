"""The router's deployments on the live supernode, wire-free: the deployments table (engine.py),
a request parsed (spec.py), provisioning (deploy.py: NPUs, experts, KV regions, weights), the
live driver (driver.py) and what it measures (measures.py), its requests' streams and figures
(streams.py, stats.py, reports.py), recovery and isolation (recovery.py, isolation.py) and live
dynamic PD (pdlive.py). The scheduler, EMS, the NPUs, the fabric and the RDMA plane's gateway
are reached through their peers (engines/peers.py, peers.py); cmemu.v1.Router
(services/router.py) and the OpenAI endpoint (services/serving/) only translate to and from
this."""
