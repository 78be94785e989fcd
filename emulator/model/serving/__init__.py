"""Serving DeepSeek-class models on a supernode: the model shapes, the deployment, workloads, the
cost of a decode step and a prefill batch, the engine (the one scheduler) and the discrete-event
simulator that replays workloads through it. Pure: no I/O, no asyncio, no gRPC."""
