"""Training jobs on the live supernode, wire-free: the jobs table (engine.py), each job's runner
(runner.py: steps, failed steps, recovery), its checkpoints in EMS (checkpoints.py) and its state
(live.py). The scheduler, EMS and the fabric are reached through their peers (engines/peers.py);
cmemu.v1.Training (services/training/) only translates to and from this."""
