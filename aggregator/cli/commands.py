"""Command line: the parser and the dispatch to the commands of the sibling modules (`serve`; `upstreams`:
list-upstreams, search, refresh; `calls`: tools, describe, call; `clients`: import, install, uninstall;
`doctor`; ...).

Every command loads the config the same way (DESIGN §1); a broken config
prints one line naming the file, the key and the fix, and exits with code 2.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
import typing
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel

from aggregator import __version__
from aggregator.cli.exit_codes import EXIT_USAGE
from aggregator.config import AggregatorConfig, ConfigError, load_config
from aggregator.faults import Fault
from aggregator.log import configure_logging, get_logger, redact_text, register_secrets
from aggregator.safetext import escaped_output
from aggregator.settings import Settings, load_settings
from aggregator.suggest import closest

log = get_logger(__name__)


class _Parser(argparse.ArgumentParser):
    """Usage errors in one line (exit 2), like config errors; subcommand parsers are made of it too.

    An option this parser does not know is the error named, whatever argparse tripped over first
    (`aggregator --bogus` is missing its COMMAND too, but the option is what the user got wrong).
    """

    _words: list[str] = []  # noqa: RUF012 - replaced per instance by parse_known_args

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        self._words = [str(word) for word in (sys.argv[1:] if args is None else args)]
        return super().parse_known_args(args, namespace)

    def error(self, message: str) -> typing.NoReturn:
        unknown = unknown_option(self, self._words)
        said = unknown if unknown is not None else _with_suggestion(message)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {said} (see {self.prog} --help)\n")


def unknown_option(parser: argparse.ArgumentParser, words: Sequence[str]) -> str | None:
    """ "unknown option '--lmit'; did you mean '--limit'?" for the first option in `words` that `parser` does not
    take (as argparse reads them: up to `--`, and for a parser of commands up to the command), else None."""
    known = parser._option_string_actions
    commands = next((a.choices for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
    takes_value = False
    for index, word in enumerate(words):
        if takes_value:
            takes_value = False
            continue
        if word == "--" or (commands is not None and word in commands):
            return None
        if not word.startswith("-") or word == "-" or parser._negative_number_matcher.match(word):
            continue
        option = word.partition("=")[0]
        matches = [o for o in known if o == option or (len(option) > 2 and o.startswith(option))]
        if matches:
            takes_value = "=" not in word and known[matches[0]].nargs != 0
            continue
        owner = _command_taking(option, commands, words[index + 1 :]) if commands is not None else None
        if owner is not None:
            return f"{option!r} is an option of {owner!r}: put it after the command"
        guess = closest(option.lstrip("-"), [o.lstrip("-") for o in known if o.startswith("--")])
        return f"unknown option {option!r}" + (f"; did you mean '--{guess}'?" if guess else "")
    return None


def _command_taking(option: str, commands: Any, rest: Sequence[str]) -> str | None:
    """The command among `rest` whose parser takes `option` (`aggregator --port 1 serve`), else None."""
    named = next((word for word in rest if word in commands), None)
    return named if named is not None and option in commands[named]._option_string_actions else None


_INVALID_CHOICE = re.compile(r"invalid choice: '(?P<word>[^']*)' \(choose from (?P<choices>.*)\)$")


def _with_suggestion(message: str) -> str:
    """argparse's "invalid choice: 'serch' (choose from ...)" with a "did you mean" when one is close."""
    found = _INVALID_CHOICE.search(message)
    if found is None:
        return message
    choices = re.findall(r"'([^']*)'", found["choices"]) or found["choices"].split(", ")
    word = found["word"]
    what = (
        "unknown command" if message.startswith("argument COMMAND:") else f"{message[: found.start()]}invalid choice:"
    )
    starting = sorted(choice for choice in choices if word and choice.startswith(word))
    if len(starting) > 1:  # `install claude`: claude-code or claude-desktop, not the closer spelling alone
        return f"{what} {word!r}; did you mean {' or '.join(repr(choice) for choice in starting)}?"
    guess = closest(word, choices)
    if guess is None:
        return f"{what} {word!r} (choose from {', '.join(choices)})"
    return f"{what} {word!r}; did you mean {guess!r}?"


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not a port number (0-65535)")
    return port


def build_parser(*, serving: bool = False) -> argparse.ArgumentParser:
    """The whole command line; `serving`: a `serve` is about to run, so the subcommands of the sibling
    modules are left out (importing them costs `serve` 0.7 MB it never uses; issue 24). A parser built so
    still knows `serve` and the commands defined here, and `main` only builds it when the command word is
    `serve` with no help asked before it, so help and did-you-mean always see every command."""
    # SUPPRESS: an option given before the subcommand is not reset by the subcommand's default.
    common = _Parser(add_help=False, argument_default=argparse.SUPPRESS)
    common.add_argument("--config", type=Path, help="YAML (or mcpServers JSON) config file")
    common.add_argument("--log-level", help="debug, info, warning (default), error")
    common.add_argument("--log-file", type=Path, help="write logs to this file instead of stderr")

    parser = _Parser(prog="aggregator", description="One MCP entry for many MCP servers.", parents=[common])
    parser.add_argument("--version", action="version", version=f"aggregator {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = sub.add_parser(
        "serve",
        parents=[common],
        help="serve MCP over stdio (default) or streamable HTTP",
        description="Serve MCP: what a client (Claude Desktop, Claude Code, Cursor, VS Code) starts. Over stdio "
        "by default; with --transport http on http://HOST:PORT/mcp (AGGREGATOR_TOKEN is the bearer token).",
    )
    serve.add_argument(
        "--transport",
        choices=["stdio", "http", "socket"],
        default="stdio",
        help="stdio (default), streamable HTTP, or socket (the per-user service `aggregator connect` attaches to)",
    )
    serve.add_argument("--host", default="127.0.0.1", help="HTTP bind address (default 127.0.0.1)")
    serve.add_argument("--port", type=_port, default=8765, help="HTTP port (default 8765)")
    serve.add_argument("--allow-host", action="append", default=[], help="extra Host header value to accept")
    serve.add_argument("--data-dir", type=Path, help="where persistent search indexes and catalog snapshots live")

    upstreams = sub.add_parser(
        "list-upstreams",
        parents=[common],
        help="show configured upstreams",
        description="Show each configured upstream: transport, state, tool count, snapshot. Starts nothing "
        "unless --probe. Exit 1 when a probed upstream is not ready.",
    )
    upstreams.add_argument("--probe", action="store_true", help="start every upstream concurrently and report")
    upstreams.add_argument("--json", action="store_true", help="print JSON instead of a table")

    search = sub.add_parser(
        "search",
        parents=[common],
        help="rank upstream tools for a query",
        description="Rank the upstreams' tools for a query, as the catalog_search_tools tool does for a model.",
    )
    search.add_argument("query", help='words describing the tool you need, e.g. "convert time zones"')
    search.add_argument("--load", action="store_true", help="start upstreams whose catalogs are not loaded")
    search.add_argument("--limit", type=int, default=8, help="how many results (1-50, default 8)")
    search.add_argument("--json", action="store_true", help="print the tool's JSON result")
    search.add_argument("--explain", action="store_true", help="show how each result's score is made")

    refresh = sub.add_parser(
        "refresh",
        parents=[common],
        help="start upstreams, rewrite their catalog snapshots, stop them",
        description="Start the named upstreams (default: all) concurrently, write their catalog snapshots, "
        "stop them. Exit 1 when one could not be refreshed.",
    )
    refresh.add_argument("names", nargs="*", metavar="NAME", help="upstreams to refresh (default: all)")
    refresh.add_argument("--json", action="store_true", help="print JSON instead of a table")
    for command in (upstreams, search, refresh):
        command.add_argument("--data-dir", type=Path, help="where catalog snapshots live")
    if not serving:
        _register_commands(sub, common)  # tools, describe, call, doctor, import, install, uninstall
    return parser


def _innermost(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The (sub)command parser `args` came through (`aggregator auth status`), so an error names its help."""
    while True:
        chosen = [
            action.choices[getattr(args, action.dest)]
            for action in parser._actions
            if isinstance(action, argparse._SubParsersAction) and getattr(args, action.dest, None) in action.choices
        ]
        if not chosen:
            return parser
        parser = chosen[0]


def main(argv: Sequence[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else list(argv)
    if words == ["--version"]:  # answered before anything imports the commands (and the SDK)
        print(f"aggregator {__version__}")
        return 0
    from aggregator.downstream.stdio import plug_standard_fds

    plug_standard_fds()  # before anything opens a file: `serve <&-` must not read from a stray descriptor
    parser = build_parser(serving=_serving(words))
    if not words:
        parser.print_help()  # a bare `aggregator`: what it can do, not a usage error
        return 0
    args, extra = parser.parse_known_args(argv)
    if extra and not (hasattr(args, "pairs") and all("=" in word and not word.startswith("-") for word in extra)):
        if args.command == "add":
            parser.error(f"unrecognized arguments: {' '.join(extra)}; put -- before the server's command")
        _innermost(parser, args).error(f"unrecognized arguments: {' '.join(extra)}")
    if extra:  # `call S T --args '{...}' k=v`: argparse does not take positionals after an option
        args.pairs += extra
    if args.command == "serve":  # stdout carries protocol messages only
        return _dispatch(args, real_process=argv is None)
    with escaped_output():  # an upstream's name, description or result never drives the terminal
        return _dispatch(args, real_process=argv is None)


def _serving(words: Sequence[str]) -> bool:
    """Whether `words` run `serve`: its word is the command and no help is asked for before it."""
    from aggregator.cli import _command_index  # the word `aggregator.cli.main` dispatches on

    at = _command_index(list(words))
    return at is not None and words[at] == "serve" and not {"-h", "--help"} & set(words[:at])


def _dispatch(args: argparse.Namespace, *, real_process: bool) -> int:
    """Load settings, logging and the config, then run the command; `real_process`: not a test calling main()."""
    try:
        settings = load_settings()
        register_secrets([settings.token.get_secret_value()] if settings.token else [])
        configure_logging(
            getattr(args, "log_level", None) or _default_log_level(args, settings),
            getattr(args, "log_file", None) or settings.log_file,
        )
        # doctor, import, install, uninstall read (and report on) the config themselves
        standalone: Callable[[argparse.Namespace, Settings], Awaitable[int]] | None = getattr(args, "standalone", None)
        if standalone is not None:
            return _run(standalone, args, settings)
        config = load_config(getattr(args, "config", None))  # reads AGGREGATOR_CONFIG itself
    except ConfigError as exc:
        print(f"aggregator: config error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (ValueError, OSError) as exc:
        print(f"aggregator: {exc}", file=sys.stderr)
        return EXIT_USAGE
    _report_broken(config, serving=args.command == "serve")
    if settings.max_result_bytes is not None:
        config = config.model_copy(update={"max_result_bytes": settings.max_result_bytes})
    code = _run(getattr(args, "handler", None) or _command(args.command), args, config, settings)
    if args.command == "serve" and real_process:
        _exit_now(code)
    return code


def _command(name: str) -> Callable[[argparse.Namespace, AggregatorConfig, Settings], Awaitable[int]]:
    """The handler of a command defined in this module's parser, imported only when it runs."""
    if name == "serve":
        from aggregator.cli.serve import serve

        return serve
    from aggregator.cli import upstreams

    return {"list-upstreams": upstreams.list_upstreams, "search": upstreams.search, "refresh": upstreams.refresh}[name]


def _exit_now(code: int) -> typing.NoReturn:
    """Leave without the interpreter's teardown, which frees every object one by one (a second or more on
    a busy machine, while the client waits for us to go): every upstream is stopped and every line
    written by now, so only the buffers are left to flush."""
    import logging

    build = sys.modules.get("aggregator.upstream.guard_build")
    if build is not None:  # a background build of the C guard ends with us (docs/guard.md)
        build.stop_background_build()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def _report_broken(config: AggregatorConfig, *, serving: bool) -> None:
    """One warning per upstream whose entry cannot be used here (it is left out; the others serve)."""
    for name, problem in config.broken.items():
        if serving:
            log.warning("upstream disabled: its entry cannot be used here", upstream=name, problem=problem)
        else:
            print(f"aggregator: upstream {name} disabled: {problem} (see: aggregator doctor)", file=sys.stderr)


def _default_log_level(args: argparse.Namespace, settings: Settings) -> str:
    """`warning` for `serve`; a one-shot command says what went wrong itself, so only errors are logged
    unless AGGREGATOR_LOG_LEVEL or --log-level asks for more."""
    if "log_level" in settings.model_fields_set or args.command == "serve":
        return settings.log_level
    return "error"


def _run(command: Callable[..., Awaitable[int]], *args: Any) -> int:
    try:
        return anyio.run(command, *args, backend_options=_backend_options())
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return _stdout_closed()
    except BaseExceptionGroup as group:
        if group.split(BrokenPipeError)[1] is not None:
            return _unexpected(group)
        return _stdout_closed()
    except Exception as exc:
        return _unexpected(exc)


def _unexpected(exc: BaseException) -> int:
    """One line for what no command handled: a fault's own message, else the error and where to see more."""
    leaves = _leaves(exc)
    if any(isinstance(leaf, KeyboardInterrupt) for leaf in leaves):
        return 130
    fault = next((leaf for leaf in leaves if isinstance(leaf, Fault)), None)
    if fault is not None:
        print(f"aggregator: {fault.reason}: {fault.message}", file=sys.stderr)
        return EXIT_USAGE if fault.kind == "programmer" else 1
    first = leaves[0] if leaves else exc
    log.debug("unexpected error", exc_info=exc)
    text = redact_text(str(first).splitlines()[0] if str(first) else "")
    print(
        f"aggregator: unexpected {type(first).__name__}: {text} (--log-level debug shows where; please report it)",
        file=sys.stderr,
    )
    return 1


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]


def _stdout_closed() -> int:
    """The reader went away (`aggregator tools x | head`): exit quietly, as a killed-by-SIGPIPE tool would."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error when Python flushes at exit
    return 141  # 128 + SIGPIPE


def _backend_options() -> dict[str, Any]:
    """uvloop when installed: a proxy's latency is mostly event-loop turns. `AGGREGATOR_UVLOOP=0` runs
    asyncio's own loop and leaves uvloop unimported (1.1 MB less; docs/performance.md has both measured)."""
    import importlib.util

    if os.environ.get("AGGREGATOR_UVLOOP", "1") == "0" or importlib.util.find_spec("uvloop") is None:
        return {}
    return {"use_uvloop": True}


if __name__ == "__main__":  # pragma: no cover
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())


def _register_commands(sub: Any, common: argparse.ArgumentParser) -> None:
    """Each sibling module's ``register(sub, common)`` adds its subparsers and sets ``handler`` (an async
    ``(args, config, settings) -> exit code`` run with the loaded config) or ``standalone`` (an async
    ``(args, settings) -> exit code`` that reads the config itself, e.g. to report on a broken one)."""
    from aggregator.cli import auth, calls, clients, doctor, editing, service  # here: `--version` imports no SDK

    for module in (editing, auth, calls, clients, doctor, service):
        module.register(sub, common)
