"""Help that fits a screen: what a command does, two or three examples, its own options; the
reranker, telemetry and logging options every command shares behind ``--help-all``.

The help is plain Click text (the application sets no Rich markup mode): it wraps to the
terminal (at most `MAX_WIDTH` columns) and reads the same in a pipe. A parameter error reads
as Click words it, without the "Value error, " of the validator underneath.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Annotated, Any, ClassVar

import typer
from typer.core import TyperCommand, TyperGroup

__all__ = [
    "EXAMPLES",
    "HELP_ALL",
    "MAX_WIDTH",
    "HelpCommand",
    "HelpGroup",
    "help_all_parameter",
    "with_bare_values",
]

MAX_WIDTH = 100
"""The widest help is wrapped to (Click's default is 80)."""

HELP_ALL = "--help-all"

EXAMPLES: dict[str, list[tuple[str, str]]] = {
    "demo": [
        ("rerank the bundled corpus for a query, offline", 'demo "read a file line by line"'),
        ("dense recall, the best 5", "demo --recall dense --top-k 5"),
        ("through a TEI server", "demo --endpoint http://localhost:8080"),
    ],
    "rerank": [
        (
            "your candidates (JSON lines), best first",
            'rerank -q "delete a directory tree" -i examples/candidates.jsonl',
        ),
        (
            "from stdin, as a table",
            'rerank -q "delete a directory tree" --format table < examples/candidates.jsonl',
        ),
        (
            "through a vLLM server (key, if any, in RERANK_API_KEY)",
            "rerank -q QUERY -i FILE --endpoint http://localhost:8000 --provider vllm",
        ),
    ],
    "eval": [
        ("the bundled example, embedding model vs BM25", "eval --reranker embedding"),
        (
            "your judged queries, BM25's top 50 reranked",
            "eval --queries Q.tsv --qrels QRELS --docs DOCS.jsonl",
        ),
        ("the report as JSON", "eval --json"),
    ],
    "serve": [
        ("the packaged MiniLM on 127.0.0.1:8080, TEI's API", "serve"),
        (
            "a cross-encoder from a model folder, on port 8082",
            "serve --reranker local --model DIR --port 8082",
        ),
    ],
    "": [
        ("does it run? (offline)", "demo"),
        ("what did it change?", "rerank -q QUERY -i examples/candidates.jsonl"),
        ("is it better?", "eval"),
    ],
}
"""Per command (``""``: the application itself), what an example shows and its arguments."""

_PREFIX = "Value error, "

_END_OF_OPTIONS = "--"


def with_bare_values(args: list[str], bare: Mapping[str, str]) -> list[str]:
    """`args` with each option of `bare` given without a value spelled ``--option=VALUE``,
    VALUE being what `bare` says the bare option means.

    The parser Typer vendors has no options with an optional value (Click's ``is_flag=False,
    flag_value=...`` is not there), so an option that may stand alone is rewritten before it
    parses. Bare means last, or followed by another option (a word starting with ``-``): the
    values these options take (URLs) never start with one. Nothing after ``--`` is touched.
    """
    if not bare:
        return args
    out = list(args)
    for i, arg in enumerate(out):
        if arg == _END_OF_OPTIONS:
            break
        if arg in bare and (i + 1 == len(out) or out[i + 1].startswith("-")):
            out[i] = f"{arg}={bare[arg]}"
    return out


def _show_all_help(ctx: typer.Context, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        ctx.meta[HELP_ALL] = True
        typer.echo(ctx.get_help(), color=ctx.color)
        raise typer.Exit()


def help_all_parameter() -> inspect.Parameter:
    """The ``--help-all`` flag, as a keyword parameter a command's signature can take (Typer
    builds the option from it; its value never reaches the command)."""
    return inspect.Parameter(
        "help_all",
        inspect.Parameter.KEYWORD_ONLY,
        default=False,
        annotation=Annotated[
            bool,
            typer.Option(
                HELP_ALL,
                is_eager=True,
                expose_value=False,
                callback=_show_all_help,
                help="Show every option, the shared ones included, and exit.",
            ),
        ],
    )


def _write_examples(name: str, formatter: Any, program: str) -> None:
    examples = EXAMPLES.get(name)
    if not examples:
        return
    with formatter.section("Examples"):
        for what, args in examples:
            formatter.write_text(f"# {what}")
            # One line each, never re-wrapped: a wrapped command no longer pastes.
            formatter.write(f"{' ' * formatter.current_indent}{program} {args}\n")


def _flags_without_type(params: list[Any]) -> list[Any]:
    """`params` with flags shown bare: a flag labelled ``<bool>`` reads as if it took a value."""
    for param in params:
        if getattr(param, "is_flag", False) and param.metavar is None:
            param.metavar = ""
    return params


def _plain_bad_parameter(exc: typer.BadParameter) -> typer.BadParameter:
    """`exc` without the validator's "Value error, " prefix: "Invalid value for '--reranker':
    'foo' is not one of ..."."""
    if exc.message.startswith(_PREFIX):
        exc.message = exc.message.removeprefix(_PREFIX)
    return exc


class HelpCommand(TyperCommand):
    """A command whose ``--help`` shows its own options and examples, and ``--help-all`` every
    option. `shared` names the parameters that ``--help`` only lists by name."""

    shared: ClassVar[frozenset[str]] = frozenset()
    shared_heading: ClassVar[str] = "Reranker, telemetry and logging options"
    bare: ClassVar[Mapping[str, str]] = {}
    """Options that may also be given without a value, and the value they then take
    (`with_bare_values`); show them with a bracketed metavar, ``--option [URL]``."""
    synonyms: ClassVar[Mapping[str, str]] = {
        "--url": "--endpoint",
        "--base-url": "--endpoint",
        "--endpoint-url": "--endpoint",
        "--server": "--endpoint",
        "--key": "--api-key",
        "--token": "--api-key",
    }
    """Names other tools give an option, and ours: a mistyped option that is one of them is
    answered with ours (the spelling click finds closest can be an unrelated option)."""

    def get_params(self, ctx: Any) -> list[Any]:
        return _flags_without_type(super().get_params(ctx))

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        try:
            return list(super().parse_args(ctx, with_bare_values(args, self.bare)))
        except typer.BadParameter as exc:
            raise _plain_bad_parameter(exc) from exc.__cause__
        except Exception as exc:
            # Typer's own click raises NoSuchOption, which it does not export: known by the
            # two attributes that make its "(Possible options: ...)".
            ours = self.synonyms.get(getattr(exc, "option_name", None) or "")
            if (
                ours is not None
                and hasattr(exc, "possibilities")
                and any(ours in p.opts for p in self.get_params(ctx))
            ):
                exc.possibilities = [ours]
            raise

    def format_options(self, ctx: Any, formatter: Any) -> None:
        everything = bool(ctx.meta.get(HELP_ALL))
        arguments: list[tuple[str, str]] = []
        own: list[tuple[str, str]] = []
        shared: list[tuple[str, str]] = []
        names: list[str] = []
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is None:
                continue
            if param.param_type_name == "argument":
                arguments.append(record)
            elif param.name in self.shared:
                shared.append(record)
                names.append(param.opts[0])
            else:
                own.append(record)
        if arguments:
            with formatter.section("Arguments"):
                formatter.write_dl(arguments)
        with formatter.section("Options"):
            formatter.write_dl(own)
        if everything:
            with formatter.section(self.shared_heading):
                formatter.write_dl(shared)
        elif names:
            with formatter.section(self.shared_heading):
                formatter.write_text(f"{', '.join(names)}: {HELP_ALL} describes them.")

    def format_epilog(self, ctx: Any, formatter: Any) -> None:
        super().format_epilog(ctx, formatter)
        _write_examples(self.name or "", formatter, ctx.find_root().info_name or "")


class HelpGroup(TyperGroup):
    """The application's group: its commands, then examples of each."""

    def get_params(self, ctx: Any) -> list[Any]:
        return _flags_without_type(super().get_params(ctx))

    def format_epilog(self, ctx: Any, formatter: Any) -> None:
        super().format_epilog(ctx, formatter)
        _write_examples("", formatter, ctx.info_name or "")
        formatter.write_paragraph()
        formatter.write_text(
            f"'{ctx.info_name} COMMAND --help' shows a command's options and examples."
        )
