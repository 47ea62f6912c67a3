"""The training side: what runs in the training process. Hooks and the stage timer's
Python side, the timed collective layer, the side-group gather (flat or hierarchical) to
the metrics rank, the decisions every rank applies at one step, runtime control, the
evidence collected on sampled steps (per-op and kernel records, run-queue waits, GC
pauses, a confirmed rank's stack) and the Analyzer that ties them to `install()`.
Judging happens in relax_straggler.judge, off the training thread."""
