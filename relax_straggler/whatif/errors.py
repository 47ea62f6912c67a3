"""The what-if replay's input error."""

from relax_straggler.readers import InputError


class WhatIfInputError(InputError):
    """The input cannot be replayed; the message names the file and row or field."""
