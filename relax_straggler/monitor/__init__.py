"""The online detection service (``relax-straggler monitor``): timers land in a metrics
store, the monitor watches every registered job, notices slow or stopped iterations,
analyses only the slow window and answers over HTTP. See docs/MONITOR.md."""
