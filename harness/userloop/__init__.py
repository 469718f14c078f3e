"""hetbench inside a user's own training loop (`hetbench.join`): per-device slices of each
global batch with the gradients weighted to the global batch's, the phases of every step
recorded from hooks, and a standard run directory at the end. The user's loop is the loop:
nothing here runs hetbench's step engine (harness/loop/engine.py); the records are built by
the collector's `timed_record` as the engine's are."""
