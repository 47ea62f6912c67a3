"""Integrations with training frameworks.

megatron:        a Megatron-Core ``config.timers`` adapter and install() for Megatron loops.
megatron_lm:     the calls patches/megatron-lm/ adds to Megatron-LM's arguments and train().
megatron_compat: the Megatron-LM internals megatron_lm relies on, checked live and on sources.
relax:           Relax's argument chain and one analysis per Relax training process.

Each imports its framework lazily: importing this package needs neither.
"""
