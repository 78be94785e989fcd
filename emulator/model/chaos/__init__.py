"""Chaos scenarios as data: the document and its parser, target selectors, the fault schedule,
the timeline and the verdict. Pure: the runner (emulator/runtime/chaos/) does the I/O."""
