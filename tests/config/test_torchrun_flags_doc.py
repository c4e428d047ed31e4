"""docs/torchrun.md's option table is the converter's own table, and that table lists exactly torchrun's options."""

from __future__ import annotations

from argparse import ArgumentParser
from pathlib import Path

from torch.distributed.launch import parse_args as launch_parse_args
from torch.distributed.run import get_args_parser

from runner.config.torchrun_flags import FLAGS, markdown_table

DOC = Path(__file__).parents[2] / "docs" / "torchrun.md"


def options(parser: ArgumentParser) -> set[str]:
    """Every option string of a parser but -h/--help."""
    return {o for action in parser._actions for o in action.option_strings} - {"-h", "--help"}


def test_table_lists_exactly_torchruns_options() -> None:
    """FLAGS has every option string of torchrun's parser, and torch.distributed.launch's --use-env, nothing else."""
    ours = {o for flag in FLAGS if not flag.launch_only for o in flag.options}
    assert ours == options(get_args_parser())
    launch_only = {o for flag in FLAGS if flag.launch_only for o in flag.options}
    assert launch_only == {"--use-env", "--use_env"}
    assert launch_parse_args(["--use_env", "t.py"]).use_env


def test_pet_variables_are_the_ones_torch_reads() -> None:
    """A flag has a PET_* variable exactly when torch's action reads one (env / check_env), with torch's name."""
    actions = {a.option_strings[-1]: a for a in get_args_parser()._actions if a.option_strings}
    for flag in FLAGS:
        if flag.launch_only:
            continue
        action = actions[flag.options[-1]]
        reads_env = type(action).__name__ in ("env", "check_env")
        assert (flag.env_var is not None) == reads_env, flag.name
        if reads_env:
            assert flag.env_var == f"PET_{action.dest.upper()}", flag.name


def test_doc_table_is_generated_from_the_flags() -> None:
    """The block between the markers is markdown_table() as it is now: regenerate it after changing FLAGS."""
    text = DOC.read_text()
    block = text.split("<!-- flags:begin -->\n", 1)[1].split("<!-- flags:end -->", 1)[0]
    assert block == markdown_table()
    assert all(f"`{flag.name}`" in block for flag in FLAGS)
