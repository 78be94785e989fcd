"""The typed clients: domain types in and out, one error type (EmulatorError, with the
google.rpc reason) whether the target is remote or in this process.

One timeout rule for all of them (issue 18):
- a client of a service takes `timeout_s`, the wall deadline of each unary call it makes (None,
  the default: none). A caller that must go on when the service hangs sets it (the chaos
  runner's status polls); a hung service is then DeadlineExceededError after it;
- a method whose callers pass on what is left of their own budget takes `deadline_s` per call,
  which wins over the client's `timeout_s`: the Peer implementations the engines call
  (remote.py, gateway.py: their Protocols in emulator/engines/peers.py carry it on every
  method) and the fabric's `clock` and `link_stats`;
- the control plane's peers (control.py, dayplan.py) have none: a controller waits for its
  scheduler, router or training service to answer, as it would for a real one;
- streams that are meant to stay open (watches) have neither: their caller cancels them.
"""
