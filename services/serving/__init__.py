"""The router's live serving: deployments on real NPUs (deploy), the engine driven on the emulated
clock against the live fabric and EMS (driver), the OpenAI-compatible endpoint (openai_http) and
its parts (endpoint/), the model's tokenizer (tokenizer), a trace's token ids (tokens),
per-request metrics (stats) and the workload replayer (replay)."""
