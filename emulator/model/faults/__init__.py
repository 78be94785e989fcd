"""The fault catalogue's pure parts: how a kind's typed parameters are declared and parsed from
text, as a CLI or a scenario file gives them (params.py), the fabric's kinds (fabric/: one
module each, with its effect on the link graph) and the RDMA plane's (gateway/: one module each,
with its effect on the plane), fault ids (ids.py), and what a fault does to a device's memory
(memory.py). No I/O: a device kind's module (emulator/engines/device/kinds/) and the client's
kinds (emulator/client/faultkinds/) build on these, so a parameter is checked the same way on
both sides of the wire."""
