"""Training jobs on the live supernode (cmemu.v1.Training, hosted on the manager's server)."""
