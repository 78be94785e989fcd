"""The OpenAI-compatible HTTP endpoint of the router, in parts: errors (OpenAI's error JSON),
limits (what a request may be), asks (request bodies into domain requests), outputs (emulated
lengths and text), responses (OpenAI's shapes), admission (tenants, metering, priority)."""
