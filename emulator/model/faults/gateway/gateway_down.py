"""gateway-down: a supernode's RDMA gateway refuses RDMA (its queue pairs' calls and the bytes
landing on its NPUs: UNAVAILABLE GATEWAY_DOWN) and reports NOT_SERVING, until cleared; it still
answers its fault control and statistics. A fault of the gateway, not of the plane: the gateway
it names holds it (its id `<gateway>-down`), and its effect is that gateway engine's own state
(emulator/engines/gateway/faults.py `_gateway_down`, state.py `set_down`), async and wire-free,
so it has no plane effect here."""

from __future__ import annotations

from cmemu.emulator.model.faults.gateway.base import Kind, NoParams

NAME = "gateway-down"

KIND = Kind(
    name=NAME,
    catalogue=NAME,
    help="a supernode's RDMA gateway refuses RDMA and reports NOT_SERVING",
    effect=None,
    params=NoParams,
    target="a gateway id (sn0-gw, sn1-gw)",
)
