"""The router's edges: the OpenAI-compatible endpoint (openai_http) and its parts (endpoint/), the
model's tokenizer (tokenizer), and cmemu.v1.Router's messages to and from the serving engine's
values (wire). The deployments themselves are the serving engine's (emulator/engines/serving/)."""
