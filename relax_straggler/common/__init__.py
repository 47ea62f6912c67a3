"""The vocabulary every wing shares: the closed stage set, the names published under
``straggler/``, Megatron timer names, the parallel layout, the gathered row format, the
default thresholds and the small checks of configuration values. Nothing here imports
another wing (docs/ARCHITECTURE.md, "Python layers")."""
