"""Training jobs as pure models: their layout, the time of a step, checkpoints, the recovery
state machine, and the model-mode long run with failures drawn from an MTBF."""
