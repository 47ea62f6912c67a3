"""Integrations with training frameworks.

megatron: a Megatron-Core ``config.timers`` adapter and install() for Megatron loops.
relax:    Relax's argument chain and one analysis per Relax training process.

Each imports its framework lazily: importing this package needs neither.
"""
