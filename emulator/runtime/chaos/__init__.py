"""The chaos runner: loads a scenario, starts its workloads, injects its faults and judges the
expectations, through a running emulator's gRPC APIs (and its state file) only."""
