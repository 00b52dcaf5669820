"""How many prefixes the number readout scores at each tolerance, and how far its mean moves from
exact: the trade-off behind predict_numbers' time, counted rather than timed.

    python benchmarks/bench_readout_prefixes.py                        # random Llama, V = 128,256
    python benchmarks/bench_readout_prefixes.py --model smollm2-135m-instruct   # a local folder
    python benchmarks/bench_readout_prefixes.py --from-rows ROWS.jsonl --timings TIMINGS.jsonl

The readout's time is mostly the number of nodes of the prefix tree it scores (each a one-token
forward through the model, attending to the prompt's cache), so the cost here is a count, which
does not depend on what else the machine runs. Cases: 1 to 5 digits, 8 prompts, tolerances 0
(exact), 1e-3 (``FAST_TOLERANCE``), 3e-3, 1e-2, 3e-2 and 1e-1; the model, vocabulary and prompts
are bench_readout.py's (``random_llama``, ``random_prompts``, ``arithmetic_prompts``: the same
seed and count, so the trees are those its timed rows scored). ``number_distribution`` runs as
``predict_numbers`` runs it (a ``CachedScorer`` per group of prompts, groups of the size
predict_numbers picks, prompts tokenized alone, pad id 0), its scorer wrapped in a
``CountingScorer`` that records the rows of ``start()`` and of every ``extend()`` call and, for
exact, the log-probability of every node.

Measures per digit count and tolerance: scored nodes per prompt (the extend rows over the
prompts; ``start()`` adds one row per prompt, the prompt pass) and per level; the largest
unexplored mass (``pruned``), the largest ``pruned / (mass + pruned)`` (the bound on the mean's
move as a share of the range), the largest ``pruned / (tolerance · s)`` (the share of its budget
the rule used, ``s`` the prompt's number mass, from the ``start()`` logits), the median covered
mass; where exact ran at that digit count, the largest ``|mean - exact mean| / (10**digits - 1)``
and the same for the median; and the fewest nodes that would have done (``fewest``): from the
exact tree, per prompt, the fewest prefixes any choice closed under prefixes (a prefix scored only
after its parent, as the scorer needs) must score so that the unexplored mass is at most
``tolerance · s`` (what the rule guarantees; ``fewest, same bound``) or at most the mass the rule
did leave unexplored (``fewest, same pruned``), by a knapsack over the tree (scoring a prefix
takes its probability off the unexplored mass and puts back that of its children within
``max_digits``: an oracle that knows the whole tree, which a level-by-level rule cannot). And the
greedy decode's token count per prompt for comparison: its prompt tokens and ``digits + 1`` new
ones.

Limits (a setting that would pass one stops before the scorer call, and its row says why): the
logits of one ``extend()`` call at most ``--logits-gib`` (default 2) in float32, and at most
``--max-nodes`` (default 200,000, about 10 minutes of SmolLM2-135M on 2 idle CPU threads) scored
nodes over the 8 prompts, each group of prompts held to its share, so that a setting past the
limit stops early; exact up to ``--exact-digits`` (default 4), and only where its widest
level fits both.

``--timings`` (bench_readout.py's rows for the same model and prompts): a calibration, the
``fast`` (tolerance ``FAST_TOLERANCE``) and ``exact`` medians fitted by least squares as
``fixed + ms per node · nodes`` on this run's counts of the same settings, and from it each
setting's predicted time as a multiple of that digit count's ``generate`` median: a model fitted to
committed timings, not a timing. ``--from-rows`` rebuilds the Markdown from a JSONL file of this
script without scoring anything. Results go to
``benchmarks/results/<date>T<time>-readout-prefixes-<model>-<device>.{jsonl,md}``, rewritten after
each setting; ``--note`` is stored in every row.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from bench_common import provenance
from bench_readout import arithmetic_prompts, random_llama, random_prompts

from numtok import NumberVocab
from numtok.numbers.spans import span_tables
from numtok.readout.decoding import prompts_per_group
from numtok.readout.distribution import (
    FAST_TOLERANCE,
    NumberDistribution,
    number_distribution,
    number_log_probs,
    widest_level,
)
from numtok.readout.scorers import CachedScorer

RESULTS = Path(__file__).resolve().parent / "results"
DIGITS = (1, 2, 3, 4, 5)
PROMPTS = 8
TOLERANCES = (0.0, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1)
#: How far past an allowance (a share of the prompt's number mass) the oracle's choice may go.
SLACK = 1e-6
#: The predicted-time target of the calibration, as a multiple of greedy generate().
TARGET_RATIO = 3.0


class OverLimitError(Exception):
    """A setting stopped before the scorer call that would have passed a limit; the message says
    which."""


class CountingScorer:
    """A NextTokenScorer that hands every call to ``inner`` and records it.

    ``start_rows``: the rows of ``start()``; ``start_log_probs`` (P, N): its number tokens'
    log-probabilities; ``prompt_of``: per ``extend()`` call, the prompt of each row (so its
    length is the call's row count); ``nodes``: the extend rows in all. With ``record``, per call
    also ``parents`` and ``path_log_probs``: each new node's log-probability from its prompt.
    ``row_limit`` and ``node_limit`` raise :class:`OverLimitError` before a call that would pass
    them (more rows in one call; more nodes in all).
    """

    def __init__(
        self,
        inner: Any,
        vocab: NumberVocab,
        *,
        record: bool = False,
        row_limit: int | None = None,
        node_limit: int | None = None,
    ) -> None:
        self.inner = inner
        self.vocab = vocab
        self.column = {token: column for column, token in enumerate(vocab.ids.tolist())}
        self.record = record
        self.row_limit = row_limit
        self.node_limit = node_limit
        self.start_rows = 0
        self.start_log_probs = torch.zeros(0, len(vocab.ids), dtype=torch.float64)
        self.prompt_of: list[torch.Tensor] = []
        self.parents: list[torch.Tensor] = []
        self.path_log_probs: list[torch.Tensor] = []
        self.nodes = 0
        self._last = self.start_log_probs  # the number log-probs of the previous call's rows

    def start(self) -> torch.Tensor:
        logits = self.inner.start()
        self.start_rows = logits.shape[0]
        self.start_log_probs = self._last = number_log_probs(logits, self.vocab).cpu()
        return logits

    def extend(self, parents: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        rows = len(parents)
        level = len(self.prompt_of) + 1
        if self.row_limit is not None and rows > self.row_limit:
            raise OverLimitError(
                f"level {level} would score {rows:,} prefixes in one call, more than the "
                f"{self.row_limit:,} whose logits fit the limit"
            )
        if self.node_limit is not None and self.nodes + rows > self.node_limit:
            raise OverLimitError(
                f"level {level} would take the nodes past this group's share of the limit, "
                f"{self.node_limit:,} ({self.nodes:,} scored, {rows:,} more asked)"
            )
        parents = parents.cpu()
        self.prompt_of.append(parents if level == 1 else self.prompt_of[-1][parents])
        if self.record:
            columns = torch.tensor([self.column[t] for t in tokens.tolist()], dtype=torch.long)
            above = self.path_log_probs[-1][parents] if self.path_log_probs else 0.0
            self.path_log_probs.append(above + self._last[parents, columns])
            self.parents.append(parents)
        logits = self.inner.extend(parents, tokens)
        if self.record:
            self._last = number_log_probs(logits, self.vocab).cpu()
        self.nodes += rows
        return logits

    def nodes_by_level(self) -> torch.Tensor:
        """(P, levels): the rows each prompt put into each extend call."""
        counts = [torch.bincount(p, minlength=self.start_rows) for p in self.prompt_of]
        return torch.stack(counts, dim=1) if counts else torch.zeros(self.start_rows, 0).long()

    def trees(self) -> list[list[tuple[np.ndarray, np.ndarray]]]:
        """Per prompt (with ``record``), per level, each node's parent (its index in the level
        above, 0 at the first) and its probability."""
        trees: list[list[tuple[np.ndarray, np.ndarray]]] = []
        for prompt in range(self.start_rows):
            levels = []
            local_of_row = torch.zeros(0, dtype=torch.long)
            for level, (owner, parents, path) in enumerate(
                zip(self.prompt_of, self.parents, self.path_log_probs, strict=True)
            ):
                mine = owner == prompt
                if level == 0:
                    parent = torch.zeros(int(mine.sum()), dtype=torch.long)
                else:
                    parent = local_of_row[parents[mine]]
                levels.append((parent.numpy(), path[mine].exp().numpy()))
                local_of_row = torch.cumsum(mine.long(), 0) - 1
            trees.append(levels)
        return trees


def max_plus(a: np.ndarray, b: np.ndarray, cap: int) -> np.ndarray:
    """``out[k] = max_{i + j = k} a[i] + b[j]`` for k up to ``cap``."""
    if len(a) < len(b):
        a, b = b, a
    size = min(len(a) + len(b) - 1, cap + 1)
    out = np.full(size, -np.inf)
    for j, value in enumerate(b[:size]):
        n = min(len(a), size - j)
        np.maximum(out[j : j + n], a[:n] + value, out=out[j : j + n])
    return out


def fewest_nodes(
    levels: list[tuple[np.ndarray, np.ndarray]], allowances: list[float], cap: int
) -> list[int | None]:
    """For each allowance, the fewest nodes of one prompt's exact tree (``levels``: per level
    each node's parent index in the level above and its probability) that a choice closed under
    prefixes must score to leave at most that mass unexplored (None: more than ``cap``).

    Scoring node ``v`` takes its probability off the unexplored mass and adds its children's (the
    candidates of the next level, all of them in the exact tree): ``gain(v) = π(v) − Σ π(child)``,
    and what a choice ``S`` leaves unexplored is ``s − Σ_{v∈S} gain(v)``, ``s`` the first level's
    mass. ``best_v[j]``, the largest gain of ``j`` nodes of ``v``'s subtree with ``v`` among them,
    is merged up the tree by max-plus products (a knapsack with unit sizes). The allowance is
    met within :data:`SLACK` of ``s``: the exact run's float32 logits and another run's, batched
    otherwise, differ in their last bits."""
    probabilities = [p for _, p in levels]
    gains = []
    for k, probability in enumerate(probabilities):
        children = 0.0
        if k + 1 < len(levels):
            parent, child = levels[k + 1]
            children = np.bincount(parent, weights=child, minlength=len(probability))
        gains.append(np.maximum(probability - children, 0.0))
    best = [np.array([0.0, gain]) for gain in gains[-1]]
    for k in range(len(levels) - 2, -1, -1):
        merged = [np.zeros(1) for _ in range(len(probabilities[k]))]
        for child, parent in enumerate(levels[k + 1][0]):
            merged[parent] = max_plus(merged[parent], best[child], cap)
        best = [
            np.concatenate(([0.0], gain + below))[: cap + 1]
            for gain, below in zip(gains[k], merged, strict=True)
        ]
    root = np.zeros(1)
    for subtree in best:
        root = max_plus(root, subtree, cap)
    mass = float(probabilities[0].sum())
    answers: list[int | None] = []
    for allowance in allowances:
        enough = np.flatnonzero(root >= mass - allowance - SLACK * mass)
        answers.append(int(enough[0]) if len(enough) else None)
    return answers


def number_mass(log_probs: torch.Tensor, vocab: NumberVocab, digits: int) -> torch.Tensor:
    """(P,): each prompt's probability of a first number token of at most ``digits`` digits, the
    ``s`` the tolerance is a share of."""
    fits = span_tables(vocab).digit_counts <= digits
    return log_probs[:, fits].exp().sum(dim=1)


def count_setting(
    model: Any,
    vocab: NumberVocab,
    ids: list[list[int]],
    digits: int,
    tolerance: float,
    *,
    record: bool,
    row_limit: int | None,
    node_limit: int | None,
) -> tuple[NumberDistribution, list[CountingScorer]]:
    """number_distribution over the prompts ``ids`` in predict_numbers' groups, each group's
    CachedScorer in a CountingScorer; :class:`OverLimitError` from the first call past a limit
    (``node_limit`` over all the prompts, each group held to its share of it)."""
    group = prompts_per_group(vocab, digits)
    parts, scorers = [], []
    model.eval()
    for begin in range(0, len(ids), group):
        prompts = ids[begin : begin + group]
        inner = CachedScorer(model, prompts, pad_id=0, batch_size=None)
        # Each group its share of the limit, so that a setting past it stops early.
        share = None if node_limit is None else node_limit * len(prompts) // len(ids)
        scorer = CountingScorer(inner, vocab, record=record, row_limit=row_limit, node_limit=share)
        parts.append(number_distribution(scorer, vocab, max_digits=digits, tolerance=tolerance))
        scorers.append(scorer)
    distribution = NumberDistribution(*(torch.cat(field) for field in zip(*parts, strict=True)))
    return distribution, scorers


def largest(values: torch.Tensor) -> float:
    return float(values.max()) if len(values) else math.nan


def measure(
    distribution: NumberDistribution,
    scorers: list[CountingScorer],
    vocab: NumberVocab,
    digits: int,
    tolerance: float,
    exact: NumberDistribution | None,
) -> dict[str, Any]:
    """The row's measures of one setting that ran (see the module docstring)."""
    levels = max(len(s.prompt_of) for s in scorers)
    by_level = torch.cat(
        [
            torch.nn.functional.pad(s.nodes_by_level(), (0, levels - len(s.prompt_of)))
            for s in scorers
        ]
    )  # (P, levels)
    prompts = by_level.shape[0]
    mass_s = torch.cat([number_mass(s.start_log_probs, vocab, digits) for s in scorers])
    pruned, mass = distribution.pruned, distribution.mass
    row: dict[str, Any] = {
        "nodes_per_prompt": round(float(by_level.sum()) / prompts, 2),
        "nodes_per_level": [round(float(n) / prompts, 2) for n in by_level.sum(dim=0)],
        "nodes_by_prompt": by_level.sum(dim=1).tolist(),
        "start_rows": sum(s.start_rows for s in scorers),
        "widest_call_rows": max(len(p) for s in scorers for p in s.prompt_of),
        "largest_unexplored_mass": largest(pruned),
        "largest_pruned_share": largest(pruned / (mass + pruned)),
        "largest_budget_used": largest(pruned / (tolerance * mass_s)) if tolerance else 0.0,
        "covered_mass_median": float(mass.median()),
        "number_mass_median": float(mass_s.median()),
        "mean_error_share": None,
        "median_error_share": None,
    }
    if exact is not None:
        scale = 10**digits - 1
        row["mean_error_share"] = largest((distribution.mean - exact.mean).abs() / scale)
        row["median_error_share"] = largest((distribution.median - exact.median).abs() / scale)
    return row


def oracle(
    trees: list[list[tuple[np.ndarray, np.ndarray]]],
    rows: dict[float, dict[str, Any]],
) -> None:
    """Adds ``fewest_same_bound`` and ``fewest_same_pruned`` (nodes per prompt) to each
    tolerance's row that ran, from the exact ``trees``."""
    ran = {t: r for t, r in rows.items() if t > 0 and r["status"] == "ran"}
    same_bound = {t: 0 for t in ran}
    same_pruned = {t: 0 for t in ran}
    worse = {t: 0 for t in ran}
    for prompt, levels in enumerate(trees):
        s = float(levels[0][1].sum())
        tolerances = list(ran)
        allowances = [t * s for t in tolerances]
        allowances += [ran[t]["pruned_by_prompt"][prompt] for t in tolerances]
        cap = sum(len(p) for _, p in levels)
        answers = fewest_nodes(levels, allowances, cap)
        for i, t in enumerate(tolerances):
            bound, achieved = answers[i], answers[len(tolerances) + i]
            same_bound[t] += bound if bound is not None else cap
            same_pruned[t] += achieved if achieved is not None else cap
            worse[t] += int(achieved is None or achieved > ran[t]["nodes_by_prompt"][prompt])
    for t, row in ran.items():
        row["fewest_same_bound"] = round(same_bound[t] / len(trees), 2)
        row["fewest_same_pruned"] = round(same_pruned[t] / len(trees), 2)
        # Prompts where the oracle needs more than the rule scored: the trees differ (0 expected).
        row["fewest_above_rule_prompts"] = worse[t]


def run(args: argparse.Namespace) -> Path:
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    device = torch.device(args.device)
    import transformers

    if args.model is None:
        model, vocab = random_llama(device)
        ids = random_prompts(PROMPTS)
        label = "random-llama-128k"
    else:
        tokenizer = transformers.AutoTokenizer.from_pretrained(args.model)
        model = transformers.AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
        model = model.to(device).eval()
        vocab = NumberVocab.from_tokenizer(tokenizer, vocab_size=model.config.vocab_size)
        ids = [tokenizer(p)["input_ids"] for p in arithmetic_prompts(PROMPTS)]
        label = args.model.name
    lengths = [len(prompt) for prompt in ids]
    row_limit = int(args.logits_gib * 2**30) // (4 * vocab.vocab_size)
    meta = {
        **provenance(device, compiled=False),
        "transformers": transformers.__version__,
        "threads": args.threads,
        "model": label,
        "number_tokens": len(vocab),
        "prompts": PROMPTS,
        "prompt_tokens": lengths,
        "row_limit": row_limit,
        "node_limit": args.max_nodes,
        "note": args.note,
    }
    out = args.out
    if out is None:
        stamp = meta["date"][:16].replace(":", "")
        out = RESULTS / f"{stamp}-readout-prefixes-{label}-{device.type}.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    for digits in args.digits:
        exact: NumberDistribution | None = None
        trees = None
        by_tolerance: dict[float, dict[str, Any]] = {}
        widest = widest_level(vocab, digits)
        for tolerance in TOLERANCES:
            row = {
                **meta,
                "digits": digits,
                "tolerance": tolerance,
                "greedy_new_tokens": digits + 1,
                "greedy_tokens_per_prompt": round(sum(lengths) / len(lengths) + digits + 1, 2),
                "greedy_padded_tokens_per_prompt": max(lengths) + digits + 1,
            }
            why_not = None
            if tolerance == 0 and digits > args.exact_digits:
                why_not = f"exact not run above --exact-digits {args.exact_digits}"
            elif tolerance == 0 and widest > row_limit:
                why_not = (
                    f"exact's widest level, {widest:,} prefixes a prompt, passes the row limit"
                )
            elif tolerance == 0 and widest * PROMPTS > args.max_nodes:
                why_not = (
                    f"exact's widest level alone, {widest * PROMPTS:,} nodes, passes the limit"
                )
            begun = time.perf_counter()
            if why_not is None:
                try:
                    distribution, scorers = count_setting(
                        model,
                        vocab,
                        ids,
                        digits,
                        tolerance,
                        record=tolerance == 0,
                        row_limit=row_limit,
                        node_limit=args.max_nodes,
                    )
                except OverLimitError as reason:
                    why_not = f"stopped: {reason}"
            row["seconds"] = round(time.perf_counter() - begun, 1)
            if why_not is None:
                row["status"] = "ran"
                row.update(measure(distribution, scorers, vocab, digits, tolerance, exact))
                row["pruned_by_prompt"] = distribution.pruned.tolist()
                if tolerance == 0:
                    exact = distribution
                    trees = [tree for scorer in scorers for tree in scorer.trees()]
            else:
                row["status"] = why_not
            by_tolerance[tolerance] = row
            rows.append(row)
            print(f"{digits} digits, tolerance {tolerance:g}: {one_line(row)}", flush=True)
            if trees is not None and tolerance == TOLERANCES[-1]:
                oracle(trees, by_tolerance)
            # Written after every setting, so that a run stopped at a time limit keeps its rows.
            out.write_text("".join(json.dumps(r) + "\n" for r in rows))
            write_summary(out, rows, args.timings)
    print(f"results: {out}", file=sys.stderr)
    return out


def one_line(row: dict[str, Any]) -> str:
    if row["status"] != "ran":
        return f"{row['status']} ({row['seconds']} s)"
    error = row["mean_error_share"]
    return (
        f"{row['nodes_per_prompt']:,.1f} nodes/prompt {row['nodes_per_level']}, unexplored "
        f"{row['largest_unexplored_mass']:.3g}, mean error "
        f"{'-' if error is None else f'{error:.3g}'} ({row['seconds']} s)"
    )


def calibration(rows: list[dict[str, Any]], timings: list[dict[str, Any]]) -> dict[str, Any]:
    """The fit of the timed ``fast`` and ``exact`` medians on this run's node counts, and per
    digit count the largest tolerance whose predicted time is at most TARGET_RATIO × generate."""
    counted = {(r["digits"], r["tolerance"]): r for r in rows if r["status"] == "ran"}
    generate = {t["digits"]: t["median_ms"] for t in timings if t["variant"] == "generate"}
    points = []
    for timed in timings:
        tolerance = {"fast": FAST_TOLERANCE, "exact": 0.0}.get(timed["variant"])
        row = counted.get((timed["digits"], tolerance))
        if tolerance is None or row is None:
            continue
        nodes = row["nodes_per_prompt"] * row["prompts"]
        points.append(
            {
                "variant": timed["variant"],
                "digits": timed["digits"],
                "nodes": nodes,
                "median_ms": timed["median_ms"],
                "timed_unexplored_mass": (
                    timed["checks"].get("fast: largest unexplored mass") if tolerance else 0.0
                ),
                "counted_unexplored_mass": row["largest_unexplored_mass"],
            }
        )
    design = np.array([[1.0, p["nodes"]] for p in points])
    measured = np.array([p["median_ms"] for p in points])
    (fixed, per_node), *_ = np.linalg.lstsq(design, measured, rcond=None)
    # The same fit with each point's error relative to its time (small times weigh as much).
    (fixed_rel, per_node_rel), *_ = np.linalg.lstsq(
        design / measured[:, None], np.ones(len(points)), rcond=None
    )
    for p in points:
        p["predicted_ms"] = fixed + per_node * p["nodes"]
    choices = {}
    for digits, base in sorted(generate.items()):
        options = []
        for tolerance in TOLERANCES:
            row = counted.get((digits, tolerance))
            if row is None:
                continue
            nodes = row["nodes_per_prompt"] * row["prompts"]
            ratio = (fixed + per_node * nodes) / base
            ratio_rel = (fixed_rel + per_node_rel * nodes) / base
            options.append((tolerance, ratio, ratio_rel, row))
        within = [o for o in options if o[1] <= TARGET_RATIO]
        within_rel = [o for o in options if o[2] <= TARGET_RATIO]
        # The most accurate setting within the target: the smallest tolerance (exact first).
        chosen = min(within, key=lambda o: o[0]) if within else None
        chosen_rel = min(within_rel, key=lambda o: o[0]) if within_rel else None
        error = chosen[3]["mean_error_share"] if chosen else None
        if chosen and chosen[0] == 0:
            error = 0.0  # exact is its own reference
        choices[digits] = {
            "generate_ms": base,
            "ratios": {f"{o[0]:g}": round(o[1], 2) for o in options},
            "ratios_relative_fit": {f"{o[0]:g}": round(o[2], 2) for o in options},
            "tightest_tolerance_within": chosen[0] if chosen else None,
            "mean_error_share": error,
            "pruned_share": chosen[3]["largest_pruned_share"] if chosen else None,
            "tightest_tolerance_within_relative_fit": chosen_rel[0] if chosen_rel else None,
        }
    return {
        "fixed_ms": float(fixed),
        "ms_per_node": float(per_node),
        "fixed_ms_relative_fit": float(fixed_rel),
        "ms_per_node_relative_fit": float(per_node_rel),
        "points": points,
        "choices": choices,
    }


def number(value: Any, spec: str = ".2g") -> str:
    if value is None:
        return "–"
    if isinstance(value, float) and value == 0:
        return "0"
    return format(value, spec)


def summary(rows: list[dict[str, Any]], timings: list[dict[str, Any]] | None) -> str:
    digits_run = sorted({r["digits"] for r in rows})
    cell = {(r["digits"], r["tolerance"]): r for r in rows}
    head = "| digits | greedy tokens/prompt | " + " | ".join(
        "exact" if t == 0 else f"{t:g}" for t in TOLERANCES
    )
    rule = "|---|---|" + "---|" * len(TOLERANCES)
    lines = [
        "Nodes scored per prompt · largest |mean − exact mean| / (10**digits − 1) · largest "
        "unexplored mass (`pruned`); – where exact did not run at that digit count; a cell "
        "without numbers did not run (the list below says why).",
        "",
        head + " |",
        rule,
    ]
    for digits in digits_run:
        cells = []
        for tolerance in TOLERANCES:
            row = cell.get((digits, tolerance))
            if row is None or row["status"] != "ran":
                cells.append("not run")
                continue
            cells.append(
                f"{row['nodes_per_prompt']:,.0f} · {number(row['mean_error_share'])} · "
                f"{number(row['largest_unexplored_mass'])}"
            )
        greedy = cell[(digits, TOLERANCES[0])]["greedy_tokens_per_prompt"]
        lines.append(f"| {digits} | {greedy:g} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "The fewest nodes per prompt that would have done, from the exact tree (an oracle: a "
        "choice closed under prefixes, unexplored mass at most tolerance · s / at most what the "
        "rule left), against what the rule scored:",
        "",
        "| digits | tolerance | rule | fewest, same bound | fewest, same pruned | "
        "largest pruned / (mass + pruned) | largest pruned / (tolerance · s) | "
        "median error share |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        if "fewest_same_bound" not in row:
            continue
        lines.append(
            f"| {row['digits']} | {row['tolerance']:g} | {row['nodes_per_prompt']:,.1f} | "
            f"{row['fewest_same_bound']:,.1f} | {row['fewest_same_pruned']:,.1f} | "
            f"{number(row['largest_pruned_share'])} | {number(row['largest_budget_used'])} | "
            f"{number(row['median_error_share'])} |"
        )
    lines += ["", "Nodes per prompt per level (level k: prefixes of k tokens):", ""]
    for row in rows:
        if row["status"] == "ran":
            levels = ", ".join(f"{n:,.1f}" for n in row["nodes_per_level"])
            lines.append(
                f"- {row['digits']} digits, tolerance {row['tolerance']:g}: {levels} "
                f"(covered mass, median {row['covered_mass_median']:.3g}; number mass s, "
                f"median {row['number_mass_median']:.3g})"
            )
    rises = []
    for digits in digits_run:
        ran = [
            cell[(digits, t)]
            for t in TOLERANCES
            if cell.get((digits, t), {}).get("status") == "ran"
        ]
        for smaller, larger in itertools.pairwise(ran):
            pairs = zip(smaller["nodes_by_prompt"], larger["nodes_by_prompt"], strict=True)
            up = sum(b > a for a, b in pairs)
            if up:
                rises.append(
                    f"{digits} digits, {smaller['tolerance']:g} → {larger['tolerance']:g}: "
                    f"{up} prompt(s)"
                )
    lines += [
        "",
        "Prompts that score more nodes at the next larger tolerance: "
        + ("; ".join(rises) if rises else "none")
        + ".",
    ]
    stopped = [r for r in rows if r["status"] != "ran"]
    if stopped:
        lines += ["", "Not run:", ""]
        lines += [
            f"- {r['digits']} digits, tolerance {r['tolerance']:g}: {r['status']}" for r in stopped
        ]
    lines += [
        "",
        f"Prompt tokens: {rows[0]['prompt_tokens']}; greedy tokens per prompt: the mean prompt "
        "plus digits + 1 new tokens.",
    ]
    if timings:
        lines += ["", *calibration_lines(calibration(rows, timings))]
    return "\n".join(lines)


def calibration_lines(fit: dict[str, Any]) -> list[str]:
    lines = [
        "## Calibration to time (a model fitted to committed timings, not a timing)",
        "",
        f"bench_readout's medians of `fast` (tolerance {FAST_TOLERANCE:g}) and `exact`, fitted "
        "by least squares as fixed + ms per node × nodes (8 prompts) on this run's counts: "
        f"fixed {fit['fixed_ms']:.0f} ms, {fit['ms_per_node']:.3f} ms per node (each point's "
        f"error relative to its time instead: fixed {fit['fixed_ms_relative_fit']:.0f} ms, "
        f"{fit['ms_per_node_relative_fit']:.3f} ms per node).",
        "",
        "| variant | digits | nodes | timed ms | fitted ms | timed run's unexplored mass | "
        "this run's |",
        "|---|---|---|---|---|---|---|",
    ]
    for p in fit["points"]:
        lines.append(
            f"| {p['variant']} | {p['digits']} | {p['nodes']:,.0f} | {p['median_ms']:,.0f} | "
            f"{p['predicted_ms']:,.0f} | {number(p['timed_unexplored_mass'], '.3g')} | "
            f"{number(p['counted_unexplored_mass'], '.3g')} |"
        )
    lines += [
        "",
        f"Predicted time ÷ generate's median (a setting that did not run has none), and the "
        f"smallest tolerance predicted within {TARGET_RATIO:g}× (the most accurate setting "
        "within the target) with the mean error it gives (where exact did not run, the bound "
        "pruned / (mass + pruned)):",
        "",
        "| digits | generate ms | "
        + " | ".join("exact" if t == 0 else f"{t:g}" for t in TOLERANCES)
        + f" | smallest tolerance ≤ {TARGET_RATIO:g}× | its mean error share | the same, "
        "relative fit |",
        "|---|---|" + "---|" * (len(TOLERANCES) + 3),
    ]
    for digits, choice in fit["choices"].items():
        ratios = [choice["ratios"].get(f"{t:g}") for t in TOLERANCES]
        chosen = choice["tightest_tolerance_within"]
        error = choice["mean_error_share"]
        if chosen is None:
            what, err = "none", "–"
        else:
            what = "exact" if chosen == 0 else f"{chosen:g}"
            err = (
                number(error)
                if error is not None
                else f"≤ {number(choice['pruned_share'])} (bound)"
            )
        relative = choice["tightest_tolerance_within_relative_fit"]
        relative_text = (
            "none" if relative is None else "exact" if relative == 0 else f"{relative:g}"
        )
        lines.append(
            f"| {digits} | {choice['generate_ms']:,.0f} | "
            + " | ".join("–" if r is None else f"{r:.2f}" for r in ratios)
            + f" | {what} | {err} | {relative_text} |"
        )
    return lines


def write_summary(out: Path, rows: list[dict[str, Any]], timings_path: Path | None) -> None:
    timings = None
    if timings_path is not None:
        timings = [json.loads(line) for line in timings_path.read_text().splitlines() if line]
    notes = list(dict.fromkeys(row["note"] for row in rows if row["note"]))  # in order, once
    note = "".join(f"Note: {text}\n\n" for text in notes)
    out.with_suffix(".md").write_text(note + summary(rows, timings) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, help="a local causal LM folder (default: random)")
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    parser.add_argument(
        "--digits", type=lambda t: [int(d) for d in t.split(",")], default=list(DIGITS)
    )
    parser.add_argument(
        "--exact-digits", type=int, default=4, help="run exact up to this many digits (default 4)"
    )
    parser.add_argument(
        "--max-nodes",
        type=int,
        default=200_000,
        help="most nodes one setting scores over the 8 prompts (default 200,000)",
    )
    parser.add_argument(
        "--logits-gib",
        type=float,
        default=2.0,
        help="most GiB of float32 logits one extend() call returns (default 2)",
    )
    parser.add_argument("--timings", type=Path, help="bench_readout.py's rows: the calibration")
    parser.add_argument("--from-rows", type=Path, help="rebuild the Markdown of these rows only")
    parser.add_argument("--note", default="", help="stored in every row")
    parser.add_argument("--out", type=Path, help="JSONL file (default: results/...)")
    args = parser.parse_args()
    if args.from_rows is not None:
        rows = [json.loads(line) for line in args.from_rows.read_text().splitlines() if line]
        write_summary(args.from_rows, rows, args.timings)
        print(f"written: {args.from_rows.with_suffix('.md')}", file=sys.stderr)
        return
    run(args)


if __name__ == "__main__":
    main()
