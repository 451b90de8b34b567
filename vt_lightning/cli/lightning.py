"""Turning VizTraceCallback on from outside the code (docs/cli.md): 1. any stock ``LightningCLI``
reads the typed constructor (``--trainer.callbacks+=vt_lightning.VizTraceCallback``) and needs
nothing from here; 2. an off-by-default ``--viztrace`` option for projects that own their CLI
(``VizTraceLightningCLI``); 3. ``VT_LIGHTNING=1`` for any ``Trainer``, through Lightning's
``lightning.pytorch.callbacks_factory`` entry point (``callbacks_from_env``).

Importing this module is cheap: jsonargparse and the callback are imported only when used.
"""

from __future__ import annotations

import os
import sys
import types
import typing
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from vt_lightning.constants import ENV_PREFIX, ENV_SWITCH

if TYPE_CHECKING:  # pragma: no cover
    from lightning.pytorch.cli import LightningArgumentParser

    VizTraceLightningCLI: type  # built on first use by ``__getattr__`` below

DEFAULT_KEY = "viztrace"

_TRUE = frozenset({"1", "true", "yes", "on", "y", "t"})
_FALSE = frozenset({"0", "false", "no", "off", "n", "f", ""})
_NONE = frozenset({"none", "null"})


# 3. environment switch (entry point group "lightning.pytorch.callbacks_factory")
def callbacks_from_env(environ: Mapping[str, str] | None = None) -> list[Any]:
    """Entry point for Lightning's ``lightning.pytorch.callbacks_factory`` group, called in every
    ``Trainer.__init__``: ``[]`` (and nothing imported) unless ``VT_LIGHTNING`` is true, else
    ``[VizTraceCallback(**options_from_env())]``."""
    env = os.environ if environ is None else environ
    if not _env_switch(env):
        return []
    from vt_lightning.callback import VizTraceCallback

    options = options_from_env(env)
    try:
        callback = VizTraceCallback(**options)
    except (TypeError, ValueError) as err:
        message = str(err)
        named = [n for n in options if f"`{n}`" in message] or list(options)
        culprits = ", ".join(f"{ENV_PREFIX}{n.upper()}={env[ENV_PREFIX + n.upper()]!r}" for n in named)
        raise ValueError(
            f"{culprits or 'vt_lightning defaults'}: {message} "
            f"(vt_lightning was switched on by {ENV_SWITCH}={env[ENV_SWITCH]!r}; "
            f"fix the variable or unset {ENV_SWITCH})"
        ) from err
    callback.vt_lightning_source = "env"  # lets the callback tell itself apart from one given in code
    return [callback]


def options_from_env(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """``VizTraceCallback`` keyword arguments from ``VT_LIGHTNING_<OPTION>`` environment variables,
    parsed by the constructor's type hints (docs/cli.md); every bad or unknown variable is named in
    one ``ValueError``."""
    env = os.environ if environ is None else environ
    hints = _constructor_hints()
    options: dict[str, Any] = {}
    errors: list[str] = []
    for var in sorted(env):
        if not var.startswith(ENV_PREFIX):
            continue
        name = var[len(ENV_PREFIX) :].lower()
        if name not in hints or var != ENV_PREFIX + name.upper():
            known = ", ".join(ENV_PREFIX + n.upper() for n in hints)
            errors.append(f"{var} is not a vt_lightning option (known: {known})")
            continue
        try:
            options[name] = _parse(env[var], hints[name])
        except ValueError as err:
            errors.append(f"{var} {err}, got {env[var]!r}")
    if errors:
        raise ValueError("vt_lightning environment: " + "; ".join(errors))
    return options


def _env_switch(env: Mapping[str, str]) -> bool:
    raw = env.get(ENV_SWITCH)
    if raw is None:
        return False
    value = raw.strip().lower()
    if value in _FALSE:
        return False
    if value in _TRUE:
        return True
    raise ValueError(f"{ENV_SWITCH} must be 1/true/yes/on or 0/false/no/off, got {raw!r}")


def _constructor_hints() -> dict[str, Any]:
    """Parameter name -> resolved type hint of ``VizTraceCallback.__init__`` (in signature order)."""
    import inspect

    from vt_lightning.callback import VizTraceCallback

    resolved = typing.get_type_hints(VizTraceCallback.__init__)
    hints: dict[str, Any] = {}
    for name, param in inspect.signature(VizTraceCallback.__init__).parameters.items():
        if name == "self" or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        hints[name] = resolved.get(name, Any)
    return hints


def _parse(raw: str, hint: Any) -> Any:
    """One environment value by its type hint; raises ValueError('must be ...') on a bad value."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        members = [a for a in args if a is not type(None)]
        if len(members) < len(args) and raw.strip().lower() in _NONE | {""}:
            return None
        errors = []
        for member in members:
            try:
                return _parse(raw, member)
            except ValueError as err:
                errors.append(str(err))
        suffix = " or none" if len(members) < len(args) else ""
        raise ValueError(" or ".join(errors) + suffix)
    if hint is bool:
        value = raw.strip().lower()
        if value in _TRUE - {""}:
            return True
        if value in _FALSE - {""}:
            return False
        raise ValueError("must be true or false (1/0, true/false, yes/no, on/off)")
    if hint in (int, float):
        try:
            return hint(raw.strip())
        except ValueError:
            raise ValueError("must be an integer" if hint is int else "must be a number") from None
    if hint is str or hint is Any:
        return raw
    if origin in (list, tuple, Sequence):
        item = args[0] if args else str
        pieces = [p.strip() for p in raw.replace(os.pathsep, ",").split(",")]
        pieces = [p for p in pieces if p]
        if not pieces:
            raise ValueError("must be a non-empty list separated by ',' or os.pathsep")
        try:
            return [_parse(p, item) for p in pieces]
        except ValueError as err:
            raise ValueError(f"must be a list whose items each {err}") from None
    raise ValueError(f"has a type vt_lightning cannot read from the environment ({hint!r})")


# 2. --viztrace for projects that own their LightningCLI
def add_viztrace_arguments(parser: LightningArgumentParser, nested_key: str = DEFAULT_KEY) -> list[str]:
    """Add an off-by-default ``--viztrace`` option (all ``VizTraceCallback`` arguments) to a parser:
    Lightning's ``parser.add_lightning_class_args(VizTraceCallback, "viztrace", subclass_mode=True,
    required=False)``. Left unset, LightningCLI (2.6) hands the Trainer a ``None`` callback that
    crashes ``fit``: derive from :class:`VizTraceLightningCLI`, which removes it, rather than calling
    this from a plain ``LightningCLI`` subclass."""
    from vt_lightning.callback import VizTraceCallback

    return parser.add_lightning_class_args(VizTraceCallback, nested_key, subclass_mode=True, required=False)


def _rewrite_switch(args: list[str], key: str, class_path: str) -> list[str]:
    """``--viztrace=true`` -> ``--viztrace=<class path>``; ``--viztrace=false`` -> ``--viztrace=null``."""
    flag = f"--{key}"
    out: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":  # everything after belongs to someone else
            out.extend(args[i:])
            break
        value = None
        if arg.startswith(flag + "="):
            value, consumed = arg[len(flag) + 1 :], 1
        elif arg == flag and i + 1 < len(args):
            value, consumed = args[i + 1], 2
        if value is not None and value.strip().lower() in (_TRUE | _FALSE) - {""}:
            on = value.strip().lower() in _TRUE
            out.append(f"{flag}={class_path if on else 'null'}")
            i += consumed
            continue
        out.append(arg)
        i += 1
    return out


def _make_cli_class() -> type:
    from lightning.pytorch.cli import LightningCLI

    from vt_lightning.callback import VizTraceCallback

    class_path = f"{VizTraceCallback.__module__.split('.')[0]}.{VizTraceCallback.__name__}"

    class VizTraceLightningCLI(LightningCLI):
        """``LightningCLI`` with an off-by-default ``--viztrace`` option for :class:`VizTraceCallback`:
        on with ``--viztrace=true``, any ``--viztrace.<option>=...`` or a ``viztrace:`` section in a
        config file, off again with ``--viztrace=false``; ``--viztrace.help VizTraceCallback`` lists
        the options. Added in ``add_default_arguments_to_parser``, so subclasses may override
        ``add_arguments_to_parser`` without calling ``super()``; ``viztrace_key`` renames it."""

        viztrace_key: str = DEFAULT_KEY

        def add_default_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
            super().add_default_arguments_to_parser(parser)
            add_viztrace_arguments(parser, self.viztrace_key)

        def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
            if args is None:
                argv = _rewrite_switch(sys.argv[1:], self.viztrace_key, class_path)
                if argv != sys.argv[1:]:
                    saved = sys.argv
                    sys.argv = [saved[0], *argv]
                    try:
                        return super().parse_arguments(parser, None)
                    finally:
                        sys.argv = saved
            elif isinstance(args, (list, tuple)):
                args = _rewrite_switch(list(args), self.viztrace_key, class_path)
            return super().parse_arguments(parser, args)

        def _instantiate_trainer(self, config: dict[str, Any], callbacks: list[Any]) -> Any:
            # An optional callback group left unset arrives here as None: drop it.
            return super()._instantiate_trainer(config, [c for c in callbacks if c is not None])

    VizTraceLightningCLI.__module__ = __name__
    VizTraceLightningCLI.__qualname__ = "VizTraceLightningCLI"
    return VizTraceLightningCLI


def __getattr__(name: str) -> Any:
    # Built on first use so that importing this module (the entry point) stays free of jsonargparse.
    if name == "VizTraceLightningCLI":
        cls = _make_cli_class()
        globals()[name] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
