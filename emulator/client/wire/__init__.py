"""Protobuf <-> domain types, one module per part of the wire: used by the servicers (services/)
and by the typed client alike, so each message is translated in exactly one place."""
