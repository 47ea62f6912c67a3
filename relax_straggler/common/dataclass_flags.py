"""argparse flags derived from the fields of a config dataclass, so the fields are written once.

A field declared with `flag_field(default, help)` becomes one ``--<prefix><name>`` flag whose
dest is ``<dest prefix><name>``; its type is the field's annotation (Optional[T] -> T) and its
default the field's default. Booleans take an explicit argparse action (`store_true`,
`store_false`). `config_from_args` reads the same dests back into the dataclass.
"""

from __future__ import annotations

import argparse
import dataclasses
import typing
from typing import Any, Optional, TypeVar

_META_KEY = "flag"
C = TypeVar("C")


@dataclasses.dataclass(frozen=True)
class FlagSpec:
    """How one field appears on the command line.

    help: the flag's help text. name: the flag after the prefix (default: the field name with
    dashes). dest: the full argparse dest (default: dest prefix + field name). action: an
    argparse action for booleans ("store_true", "store_false"); None takes a typed value."""

    help: str
    name: Optional[str] = None
    dest: Optional[str] = None
    action: Optional[str] = None


def flag_field(default: Any, help: str, *, name: Optional[str] = None, dest: Optional[str] = None,
               action: Optional[str] = None) -> Any:
    """A dataclass field with a `FlagSpec` in its metadata (see FlagSpec for the arguments)."""
    return dataclasses.field(default=default, metadata={_META_KEY: FlagSpec(help, name, dest, action)})


def _spec(cls: type, f: dataclasses.Field) -> FlagSpec:
    spec = f.metadata.get(_META_KEY)
    if not isinstance(spec, FlagSpec):
        raise TypeError(f"{cls.__name__}.{f.name} is not declared with flag_field(); every field needs a flag")
    return spec


def _value_type(hint: Any) -> type:
    """int for `int`, str for `Optional[str]`: the type argparse converts the value with."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) is typing.Union and len(args) == 1:
        return args[0]
    return hint


def _dest(spec: FlagSpec, f: dataclasses.Field, dest_prefix: str) -> str:
    return spec.dest or dest_prefix + f.name


def add_field_flags(group: Any, cls: type, *, prefix: str = "--", dest_prefix: str = "",
                    metavar: Optional[str] = None, show_default: bool = False) -> None:
    """Adds one flag per field of dataclass `cls` to `group` (a parser or an argument group), in
    field order. metavar: for every typed (non-boolean) flag. show_default: append
    " (default X)" to each typed flag's help. Raises TypeError for a field without flag_field()."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        spec = _spec(cls, f)
        flag = prefix + (spec.name or f.name.replace("_", "-"))
        if spec.action is not None:
            group.add_argument(flag, dest=_dest(spec, f, dest_prefix), action=spec.action, default=f.default,
                               help=spec.help)
            continue
        help_text = spec.help + (f" (default {f.default})" if show_default else "")
        group.add_argument(flag, dest=_dest(spec, f, dest_prefix), type=_value_type(hints[f.name]),
                           default=f.default, metavar=metavar, help=help_text)


def config_from_args(cls: type[C], args: argparse.Namespace, *, dest_prefix: str = "") -> C:
    """`cls` built from the dests `add_field_flags` filled in `args`. Raises what cls raises
    (ValueError on bad values) and AttributeError when a flag was never added."""
    kwargs = {f.name: getattr(args, _dest(_spec(cls, f), f, dest_prefix)) for f in dataclasses.fields(cls)}
    return cls(**kwargs)
