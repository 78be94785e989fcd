"""Soak benchmark: cm384 in one process (`cmemu up`) under mixed load and chaos for a long time,
with a ledger of everything the emulator acknowledged, checked byte for byte at the end.

The short benchmarks say how fast one thing is; this one says whether the emulator stays correct
and bounded when everything happens at once for ten minutes: leaks, lost or resurrected data and
crashes show up only under time, concurrency and faults together. Each part exists for one reason:

- Load (`--concurrency` tasks, 16 by default, each with its own seeded RNG; the seed fixes what
  each task does, not how the tasks interleave):
  - UB writes of real bytes (1 B .. 64 KiB) into regions the soak allocated on random NPUs, CPUs
    and memory pools, and reads checking them: the sparse byte store under churn. The regions are
    filled once before the clock starts, so the bytes the server holds are at their steady size
    from the start and RSS growth after the warm-up means a leak, not a filling store.
  - CAS and FETCH_ADD on counter words, each op checked against the value the ledger expects:
    lost or doubled atomics.
  - SENDs with unique ids and payloads, drained by Receive: lost, corrupted or duplicated
    messages, and inboxes that only grow.
  - Size-only bulk WRITE/READ (1 MiB .. 2 GiB) into big regions: the fabric's flow model under
    large concurrent flows, with no bytes to hold.
  - Region churn (allocate, write, read back, free): region bookkeeping that leaks.
  - Collectives (all-to-all uniform and per pair, all-gather, MoE dispatch and combine) over
    random sets of 2..64 NPU dies (per pair: 2..16, see PAIR_MAX_DIES): the fabric's collective
    path, with its caches and flows.
  - EMS Put/Get/Delete of real-byte objects of 1 B .. 4 MiB (over 1 MiB by PutStream/GetStream),
    BatchPut/BatchGet/BatchDelete/BatchExists over a fixed key space of `--keys` keys (so the
    store's size levels off), and every `--big-every` seconds a 16..64 MiB object streamed in,
    read back, and deleted (the first one during the warm-up, so that whatever it leaves behind
    is in the warm figure; it shows as a spike of RSS, given back once it is deleted).
- Chaos (one fault at a time, every 1..4 s, held 1..5 s): link-down on a link named by
  GetLinkStats, switch-down on an L2 chip, device-down on a random NPU, and device-down on a
  memory pool; in runs of 70 s or more, a share of the pool outages (`--long-outages`, 0.3) last
  past EMS's dead-after time (30 s), so that the store re-replicates and then reconciles the pool
  that returns. UNAVAILABLE (and the like) is tolerated during faults: the ledger treats a failed
  operation as "may or may not have happened", and verifies once every fault is cleared. All
  faults are cleared at the end (ClearFault all=true, and every device the soak faulted).
- Ledger: every acknowledged UB byte (device, EID, offset, bytes) and counter, every SEND, and
  every EMS key's possible contents (the acknowledged value; after a failed put or delete, either
  the old or the new one). Operations on one region, word or key are serialised by a lock in the
  soak, so the expected value is exact. At the end, all faults cleared and EMS settled, every
  acknowledged byte and object is read back: `lost_bytes`, `lost_objects` (wrong or missing),
  `resurrected_objects` (deleted, yet found), plus `lost_counters` and `lost_messages`. Reads
  during the run are checked too (`wrong_reads`), and every key a read disagreed about is
  reported with its last operations (sizes, the pools of each copy, times) against the fault log:
  what a reproduction needs.
- Server output: `cmemu up` runs with --log-level warning and its output discarded, as in the
  other benchmarks (a pipe nobody reads would stall it).
- Resources: the `cmemu up` process's RSS (VmRSS), sampled every 2 s: at start, after the
  warm-up (10% of the run, at most 60 s) and at the end (the load's last seconds, before the
  verification reads). The store's contents swing by tens of MB as objects of up to 4 MiB come
  and go, so the warm and end figures are each the median of the samples over 10 s (the single
  samples are in the JSON too). Growth after the warm-up is the leak figure (target < 10%); the
  median of each whole minute after the warm-up is in the JSON and printed, for the trend.
  `--memdebug DIR` has the server write memory reports (emulator/runtime/memdebug.py: objects by
  type, allocations by traceback, malloc's heaps) after the warm-up and every
  `--memdebug-every` seconds: how the growth once found (glibc keeping freed pages, now trimmed
  by emulator/runtime/heap.py) was told from a leak. They stall the server: not for figures.
- Errors: every failed call by status code; UNKNOWN and INTERNAL must be zero (each is kept with
  the call, the status and the faults in force, for a reproduction). A NOT_FOUND that the ledger
  expects (a Get of a deleted key) is an answer, not an error.

Figures are printed one per line; bench/results/soak.json holds them with the details (errors by
call, examples, the fault log, the time series) and bench/results/soak.png plots RSS and
operations per second over time. Exit code 1 when a target is missed.

    python -m bench.soak [--seconds 600] [--seed 1] [--concurrency 16] [--broker embedded|none]
                         [--memdebug DIR [--memdebug-every 120]] [--results DIR]

(from the repository root). The plot needs matplotlib (imported only for it: without it the JSON
is still written).
"""

# One job a module (this docstring is also --help, so the map is here): `config` (sizes,
# timeouts), `calls` (every call, counted by status), `ledger` (what was acknowledged), `context`
# (what the parts share), the load (`ub`, `messages`, `churn`, `collectives`, `ems`, `ems_batch`,
# mixed by `load`), `faults` (the chaos), `sampling` (RSS), `verify` (the final read-back),
# `report` (figures, JSON, plot), `run` (one soak against a running supernode) and `__main__`
# (arguments, `cmemu up`, the output).
