"""Per-thread work buffers for the flow solver's large temporaries (fairshare.fill, simulate).

Why: an EP320 dispatch (102,080 flows, 4 slots each) makes dozens of temporaries of 0.1-3.3 MB.
glibc serves allocations that large from fresh mappings (mmap, or a thread arena's heap that it
trims back with MADV_DONTNEED when they are freed), so every temporary's pages are faulted in
anew on every call: measured, about 60% of the dispatch's time on the fabric's collective threads.
A buffer kept per thread and name is faulted in once and written with `out=` afterwards.

Rules for callers: a scratch array is only valid until the same thread asks for the same name
again, so it must never escape the function that took it (results are fresh arrays), and one
name serves one purpose. Buffers only grow, up to SCRATCH_MAX_BYTES each; a larger request gets
a fresh array, as its computation dwarfs the cost of faulting its pages in, and so does a small
one (SCRATCH_MIN_ITEMS). The price: a thread keeps what its largest batch needed (an EP320
dispatch: 12 MiB on each of the fabric's collective threads), where glibc gave it back.
"""

from __future__ import annotations

import math
import threading
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

SCRATCH_MAX_BYTES = 32 << 20  # per buffer: an EP320 dispatch's largest is 3.3 MB
# below this many items an array is fresh: malloc serves it from the heap, without page faults,
# in less time than finding a buffer takes (a fill of a few thousand flows makes ~30 passes)
SCRATCH_MIN_ITEMS = 8192
ScalarT = TypeVar("ScalarT", bound=np.generic)


class _Buffers(threading.local):
    def __init__(self) -> None:
        self.by_name: dict[str, npt.NDArray[np.uint8]] = {}


_buffers = _Buffers()


def scratch(name: str, shape: tuple[int, ...], dtype: type[ScalarT]) -> npt.NDArray[ScalarT]:
    """An uninitialised array of `shape`, this thread's buffer `name` (see the module's rules)."""
    count = math.prod(shape)
    if count < SCRATCH_MIN_ITEMS:  # small (the later passes of a fill): fresh is cheaper
        return np.empty(shape, dtype=dtype)
    nbytes = count * np.dtype(dtype).itemsize
    if nbytes > SCRATCH_MAX_BYTES:
        return np.empty(shape, dtype=dtype)
    buffer = _buffers.by_name.get(name)
    if buffer is None or buffer.nbytes < nbytes:
        buffer = _buffers.by_name[name] = np.empty(nbytes, dtype=np.uint8)
    view: Any = buffer[:nbytes].view(dtype).reshape(shape)
    return view  # type: ignore[no-any-return]
