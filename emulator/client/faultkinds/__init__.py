"""The fault kinds of the catalogue, one small module each, registered by name in
emulator/client/faults.py (KINDS); what they share is in base.py."""
