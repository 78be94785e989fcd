"""The fault catalogue's pure parts: each kind's typed parameters (parsed from text, as a CLI or a
scenario file gives them) and what a fault does to a device's memory. No I/O: the device engines
(emulator/engines/device/faults.py) and the client's kinds (emulator/client/faultkinds/) share
these, so a parameter is checked the same way on both sides of the wire."""
