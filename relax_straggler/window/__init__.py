"""The window detector: six clusterers and their vote over a window of reports
(detector), its live use on the metrics rank (live) and the offline ensemble that names
stragglers, slow links and slow pipeline stages in a recorded run (ensemble)."""
