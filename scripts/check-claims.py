#!/usr/bin/env python3
"""Checks that every number the docs quote next to a receipt is in that receipt.

Usage: scripts/check-claims.py [-v] [ROOT]

ROOT is the repository (by default this script's parent folder); -v also lists every
number that holds, with its receipts. Reads README.md and docs/**/*.md under ROOT
(Python 3.11, standard library only). Prints one line per failure,

    FILE:LINE: "NUMBER" not in receipts/X.json (nearest: VALUE, WHERE IN THE JSON)

then

    claims: N numbers checked against M receipts, K failures

and exits 1 when K > 0, else 0.

Citations
---------
A citation is a link to a receipt: an inline Markdown link `[text](path)` whose path
(without `#fragment`), resolved against the Markdown file's folder, names a `.json` file
under ROOT/receipts/ (receipts/experiments/ and receipts/raw/ included). A bare path
in prose that starts with `receipts/` and ends with `.json` is a citation too, read
from ROOT (the docs write such paths from the repository root); in a comma-separated
list that starts with one, the bare file names that follow (`receipts/a.json, b.json`)
are in the same folder. A bare path with `*` cites every receipt it matches (and fails
when it matches none). Nothing inside code (fenced blocks, `inline code`) or HTML
comments is a citation or a claim.

Units: which numbers a citation vouches for
-------------------------------------------
* Table rows. Every number in a body row's cells belongs to every receipt cited in
  that row. A row that cites none takes the receipts cited by the table's caption: the
  paragraph directly above the table (only blank lines and comments between). A row
  with neither is not checked. Header rows are not checked, nor any column whose header is `target` or
  `targets` (targets are fixed before a run, not measured).
* Prose (paragraphs, list items, headings). The text is cut into sentences: a sentence
  ends at `.`, `!` or `?` followed by white space (not after e.g., i.e., vs., cf.), and
  at the end of the paragraph, list item or heading. Citations that follow one another
  separated only by spaces, commas or "and" form a group. A group vouches for the
  numbers from the end of the previous group in the same sentence (or the sentence's
  start) up to the group's first citation: the receipt follows its claim. One more
  form: a group directly followed by a colon, after any parentheses it closes
  ("Outcome (receipts/x.json): 94.2% ..."), also vouches for the numbers after the
  colon, up to the end of the sentence, the next colon or the next group. Other numbers
  after a group are not checked.

What counts as a number
-----------------------
Integers, decimals, thousands separators (18,600), scientific (1.8e-3), percentages
(80.4%) and ratios (0.75×); a leading sign is ignored. In a range `a–b` (en dash) `a`
takes `b`'s exponent and `%` when it has none (3.4–4.7e-3, 84.8–86.8%). Not numbers,
by rule:
* text inside link texts and link targets, inline code, code blocks, HTML comments and
  bare URLs or receipt paths;
* parts of names: a number glued to a letter or `_` on either side (H200, sm_90, bf16,
  8b, 135M, Q4_K), joined by `-` to a letter or digit (llama-3.1-8b, x86-64, 16-bit,
  147-dispatch), or preceded by `.`, `#`, `^` or a letter and `/`;
* version numbers: two dots or more (580.159.04; one dot, as in 5.17, needs the comment
  below);
* shapes: numbers on either side of `×` between two numbers (8192×8192,
  2048×4096×4096, 14336 × 4096; this also skips counts written as `2 × 32`), and
  numbers followed by a superscript (4096³, 2⁻¹¹);
* fractions of a symbol: a number followed by `/` and a letter (1/N).

Anything else that is not a measurement is excluded where it stands, by a comment in
the Markdown: `<!-- claims: not-measured 5.17 930 -->` drops those numbers (as written,
thousands separators and `%`/`×` ignored) from the paragraph, list item or table that
holds the comment (an indented comment line right below a list item is in that item)
or, when the comment stands on lines of its own, from the next block.

When a number holds
-------------------
A number holds when some JSON number (not a boolean, not a string) anywhere in any
receipt of its unit, rounded the way the text evidently rounded, equals it: the text's
last digit sets the precision (226.7: ±0.05; 1.8e-3: ±0.05e-3; 18,600 and 160: ±0.5,
trailing zeros included). A receipt value may be in another unit by a power of 1000
(160 µs against 160307 ns or 0.1603 ms); a percentage may also be a fraction times 100
(82.7% against 0.8271); a ratio (×) must be there as a ratio. Signs are ignored.
Nothing is computed from several values (a ratio of two receipt values, a difference, a
sum), and numbers inside the receipts' strings are not seen: such a claim fails until
the text quotes what the receipt holds.

Other failures
--------------
A cited receipt that does not exist or is not valid JSON fails. A receipt cited from
README.md whose top-level `"git_dirty"` is true fails (the binary that made it was built
from a tree with uncommitted changes, so its git_commit does not name the code that ran).
README receipts without the field (older ones, and the PyTorch scripts' receipts) are
counted in a note, not failed.
"""

from __future__ import annotations

import glob
import json
import math
import os
import re
import sys
from dataclasses import dataclass, field

MASK = "\x00"

# ------------------------------------------------------------------------------------
# Markdown blocks


@dataclass
class Block:
    kind: str  # "prose", "table", "heading", "comment"
    lines: list[tuple[int, str]] = field(default_factory=list)  # (line number, text)


FENCE_RE = re.compile(r"^\s*(`{3,}|~{3,})")
HEADING_RE = re.compile(r"^\s{0,3}#{1,6}\s")
TABLE_RE = re.compile(r"^\s*\|")
LIST_RE = re.compile(r"^\s*(?:[-*+]|\d+[.)])\s+")
COMMENT_ONLY_RE = re.compile(r"^\s*<!--.*?-->\s*$", re.S)


def split_blocks(text: str) -> list[Block]:
    """Paragraphs, list items, headings and tables, with fenced code left out."""
    blocks: list[Block] = []
    cur: Block | None = None
    fence: str | None = None
    in_comment = False

    def close():
        nonlocal cur
        if cur is not None and cur.lines:
            blocks.append(cur)
        cur = None

    for n, line in enumerate(text.split("\n"), 1):
        if fence is not None:
            if line.strip().startswith(fence):
                fence = None
            continue
        if in_comment:
            cur.lines.append((n, line))
            if "-->" in line:
                in_comment = False
            continue
        m = FENCE_RE.match(line)
        if m:
            close()
            fence = m.group(1)[0] * 3
            continue
        if not line.strip():
            close()
            continue
        if line.lstrip().startswith("<!--") and "-->" not in line:
            close()
            cur = Block("comment", [(n, line)])
            in_comment = True
            continue
        if COMMENT_ONLY_RE.match(line):
            if cur is not None and cur.kind == "prose" and line[:1].isspace():
                cur.lines.append((n, line))  # indented: inside the list item above
                continue
            close()
            blocks.append(Block("comment", [(n, line)]))
            continue
        if HEADING_RE.match(line):
            close()
            blocks.append(Block("heading", [(n, line)]))
            continue
        if TABLE_RE.match(line):
            if cur is None or cur.kind != "table":
                close()
                cur = Block("table")
            cur.lines.append((n, line))
            continue
        if cur is None or cur.kind == "table" or cur.kind == "comment" or LIST_RE.match(line):
            close()
            cur = Block("prose")
        cur.lines.append((n, line))
    close()
    return blocks


# ------------------------------------------------------------------------------------
# Masking and citations

CODE_RE = re.compile(r"(`+)(.+?)(?<!`)\1(?!`)", re.S)
COMMENT_RE = re.compile(r"<!--(.*?)-->", re.S)
DIRECTIVE_RE = re.compile(r"claims:\s*not-measured\b([^>]*)")
LINK_RE = re.compile(r"!?\[((?:[^\[\]]|\[[^\[\]]*\])*)\]\(\s*<?([^()\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
URL_RE = re.compile(r"<?https?://[^\s)>]+>?")
BARE_RE = re.compile(r"(?<![\w./-])receipts/[\w.*+/-]*[\w*]")
LIST_ITEM_RE = re.compile(r"\s*,\s*(?:and\s+)?([\w.*+/-]*\.json)(?![\w])")
GROUP_GAP_RE = re.compile(r"^[\s,\x00]*(?:and\s+)?[\s,\x00]*$")
TRAILING_RE = re.compile(r"[\s\x00]*\)*:")


def mask(s: str, a: int, b: int) -> str:
    return s[:a] + "".join(c if c == "\n" else MASK for c in s[a:b]) + s[b:]


@dataclass
class Citation:
    start: int  # offsets in the block's text
    end: int
    path: str  # repository-relative, normalised
    line: int


def normalise_excluded(tok: str) -> str:
    return tok.replace(",", "").rstrip("%×").lstrip("+-−")


def prepare(block: Block, md_dir: str, root: str):
    """The block's text with non-claim text masked, its citations and exclusions."""
    text = "\n".join(t for _, t in block.lines)
    starts = []
    off = 0
    for n, t in block.lines:
        starts.append((off, n))
        off += len(t) + 1

    def line_of(pos: int) -> int:
        ln = block.lines[0][0]
        for o, n in starts:
            if o <= pos:
                ln = n
            else:
                break
        return ln

    excluded: set[str] = set()
    for m in COMMENT_RE.finditer(text):
        for d in DIRECTIVE_RE.finditer(m.group(1)):
            excluded.update(normalise_excluded(t) for t in d.group(1).split())
        text = mask(text, m.start(), m.end())
    for m in CODE_RE.finditer(text):
        text = mask(text, m.start(), m.end())

    cites: list[Citation] = []
    for m in LINK_RE.finditer(text):
        target = m.group(2).split("#", 1)[0]
        text = mask(text, m.start(), m.end())
        if not target or re.match(r"^[a-z]+:", target) or target.startswith("/"):
            continue
        p = os.path.normpath(os.path.join(md_dir, target))
        rel = os.path.relpath(p, root).replace(os.sep, "/")
        if rel.startswith("receipts/") and rel.endswith(".json"):
            cites.append(Citation(m.start(), m.end(), rel, line_of(m.start())))
    for m in URL_RE.finditer(text):
        text = mask(text, m.start(), m.end())
    for m in list(BARE_RE.finditer(text)):
        path = m.group(0)
        end = m.end()
        items = [(m.start(), end, path)]
        folder = path.rsplit("/", 1)[0]
        while True:
            n = LIST_ITEM_RE.match(text, end)
            if not n:
                break
            name = n.group(1)
            if name.startswith("receipts/"):
                folder = name.rsplit("/", 1)[0]
                items.append((n.start(1), n.end(1), name))
            else:
                items.append((n.start(1), n.end(1), folder + "/" + name))
            end = n.end()
        for a, b, p in items:
            text = mask(text, a, b)
            if not p.endswith(".json"):
                continue
            if "*" in p:
                hits = sorted(glob.glob(os.path.join(root, p)))
                paths = [os.path.relpath(h, root).replace(os.sep, "/") for h in hits] or [p]
            else:
                paths = [os.path.normpath(p).replace(os.sep, "/")]
            for q in paths:
                cites.append(Citation(a, b, q, line_of(a)))
    cites.sort(key=lambda c: c.start)
    return text, cites, excluded, line_of


# ------------------------------------------------------------------------------------
# Numbers in text

NUM_RE = re.compile(
    r"(?P<int>[0-9]{1,3}(?:,[0-9]{3})+(?![0-9])|[0-9]+)(?:\.(?P<frac>[0-9]+))?"
    r"(?:[eE](?P<exp>[-+−]?[0-9]+))?"
)
SUPERSCRIPTS = "⁰¹²³⁴⁵⁶⁷⁸⁹⁻⁺"
SENTENCE_END_RE = re.compile(r"[.!?](?:\*\*|\*|\))*\s+")
ABBREV_RE = re.compile(r"(?:\b(?:e\.g|i\.e|vs|cf|approx|resp))$")


def is_name_char(c: str) -> bool:
    return c.isascii() and (c.isalnum() or c == "_")


@dataclass
class Number:
    start: int
    end: int
    text: str  # as written, with its % or ×
    kind: str  # "plain", "percent" or "ratio"
    digits: str  # integer part without separators
    frac: str  # digits after the point
    exp: int | None  # the written exponent, if any

    @property
    def value(self) -> float:
        return float(f"{self.digits}.{self.frac or 0}e{self.exp or 0}")

    @property
    def half(self) -> float:
        """Half the step of the text's last digit: the rounding it allows."""
        return 10.0 ** ((self.exp or 0) - len(self.frac)) / 2


def numbers_in(text: str) -> list[Number]:
    out: list[Number] = []
    for m in NUM_RE.finditer(text):
        a, b = m.start(), m.end()
        before = text[a - 1] if a > 0 else " "
        before2 = text[a - 2] if a > 1 else " "
        after = text[b] if b < len(text) else " "
        after2 = text[b + 1] if b + 1 < len(text) else " "
        if is_name_char(before) or before in ".#^" or before in SUPERSCRIPTS:
            continue  # H200, sm_90, #12, 2^-11
        if before == "-" and is_name_char(before2):
            continue  # llama-3.1-8b, x86-64
        if before == "/" and before2.isascii() and before2.isalpha():
            continue
        if is_name_char(after) or after in SUPERSCRIPTS:
            continue  # 8b, 135M, 4096³
        if after == "." and after2.isdigit():
            continue  # a version: 580.159.04
        if after == "-" and is_name_char(after2):
            continue  # 16-bit, 3-stage
        if after == "/" and after2.isascii() and after2.isalpha():
            continue  # 1/N
        if re.match(r"\s*×\s*[0-9]", text[b:]) or re.search(r"[0-9]\s*×\s*$", text[:a]):
            continue  # a shape: 8192×8192, 14336 × 4096
        kind, end = "plain", b
        if after == "%":
            kind, end = "percent", b + 1
        elif after == "×":
            kind, end = "ratio", b + 1
        exp = m.group("exp")
        out.append(
            Number(
                a,
                end,
                text[a:end],
                kind,
                m.group("int").replace(",", ""),
                m.group("frac") or "",
                int(exp.replace("−", "-")) if exp else None,
            )
        )
    # ranges a–b: a takes b's exponent and % when it has none
    for x, y in zip(out, out[1:]):
        if text[x.end : y.start] == "–":
            if x.exp is None and y.exp is not None:
                x.exp = y.exp
            if x.kind == "plain" and y.kind == "percent":
                x.kind = "percent"
    return out


# ------------------------------------------------------------------------------------
# Receipts

UNIT_SCALES = [10.0 ** (3 * k) for k in range(-4, 5)]


class Receipt:
    def __init__(self, path: str, data):
        self.path = path
        self.data = data
        self.values: list[tuple[float, str]] = []
        self._walk(data, "")

    def _walk(self, x, where: str):
        if isinstance(x, bool) or x is None or isinstance(x, str):
            return
        if isinstance(x, (int, float)):
            if math.isfinite(x):
                self.values.append((abs(float(x)), where or "(top)"))
        elif isinstance(x, dict):
            for k, v in x.items():
                self._walk(v, f"{where}.{k}" if where else str(k))
        elif isinstance(x, list):
            for i, v in enumerate(x):
                self._walk(v, f"{where}[{i}]")


def scales_for(kind: str) -> list[float]:
    if kind == "percent":
        return [1.0, 100.0]
    if kind == "ratio":
        return [1.0]
    return UNIT_SCALES


def holds(num: Number, receipts: list[Receipt]) -> bool:
    x, h = abs(num.value), num.half * (1 + 1e-9) + abs(num.value) * 1e-12
    for r in receipts:
        for v, _ in r.values:
            for s in scales_for(num.kind):
                if abs(v * s - x) <= h:
                    return True
    return False


def nearest(num: Number, receipts: list[Receipt]) -> str:
    x = abs(num.value)
    best = None
    for r in receipts:
        for v, where in r.values:
            for s in scales_for(num.kind):
                d = abs(v * s - x) / max(x, 1e-300)
                if best is None or d < best[0]:
                    best = (d, v, s, where, r.path)
    if best is None:
        return "nearest: none, the receipts hold no numbers"
    _, v, s, where, path = best
    shown = f"{v * s:.6g}"
    if s != 1.0:
        shown += f" = {v:.6g} × {s:g}"
    src = f" in {path}" if len(receipts) > 1 else ""
    return f"nearest: {shown}, {where}{src}"


# ------------------------------------------------------------------------------------
# Units


@dataclass
class Unit:
    numbers: list[tuple[Number, int]]  # with line numbers
    cites: list[Citation]


def table_cells(line: str) -> list[tuple[int, int]]:
    """(start, end) of each cell of a table row, in the line's offsets."""
    seps = [i for i, c in enumerate(line) if c == "|" and (i == 0 or line[i - 1] != "\\")]
    cells = []
    if not seps:
        return [(0, len(line))]
    for a, b in zip(seps, seps[1:] + [len(line)]):
        if a + 1 <= b:
            cells.append((a + 1, b))
    if cells and not line[cells[-1][0] : cells[-1][1]].strip():
        cells.pop()
    return cells


def table_units(block, text, cites, line_of, caption_cites) -> list[Unit]:
    units = []
    rows = text.split("\n")
    offs = []
    o = 0
    for r in rows:
        offs.append(o)
        o += len(r) + 1
    header = [text[offs[0] + a : offs[0] + b].strip().lower() for a, b in table_cells(rows[0])]
    skip_cols = {i for i, h in enumerate(header) if h.strip("* ") in ("target", "targets")}
    for ri, row in enumerate(rows):
        if ri == 0 or re.match(r"^\s*\|?[\s:|-]+$", row) and "-" in row:
            continue
        base = offs[ri]
        row_cites = [c for c in cites if base <= c.start < base + len(row) + 1]
        use = row_cites or caption_cites
        if not use:
            continue
        nums = []
        for ci, (a, b) in enumerate(table_cells(row)):
            if ci in skip_cols:
                continue
            cell = text[base + a : base + b]
            for n in numbers_in(cell):
                n.start += base + a
                n.end += base + a
                nums.append((n, line_of(n.start)))
        units.append(Unit(nums, use))
    return units


def sentence_starts(text: str) -> list[int]:
    starts = [0]
    for m in SENTENCE_END_RE.finditer(text):
        if ABBREV_RE.search(text[: m.start()]):
            continue
        starts.append(m.end())
    return starts


def prose_units(text, cites, line_of) -> list[Unit]:
    if not cites:
        return []
    groups: list[list[Citation]] = []
    for c in cites:
        if groups and GROUP_GAP_RE.match(text[groups[-1][-1].end : c.start]):
            groups[-1].append(c)
        else:
            groups.append([c])
    nums = numbers_in(text)
    starts = sentence_starts(text)
    units = []
    prev_end = 0
    for g in groups:
        s_start = max(s for s in starts if s <= g[0].start)
        lo = max(s_start, prev_end)
        hi = g[0].start
        chosen = [(n, line_of(n.start)) for n in nums if lo <= n.start and n.end <= hi]
        units.append(Unit(chosen, g))
        prev_end = g[-1].end
    # "Outcome (receipts/x.json): 94.2% ...": a group followed by a colon (after the
    # parentheses it closes) also vouches for what follows, up to the sentence's end or
    # the next colon
    for i, g in enumerate(groups):
        m = TRAILING_RE.match(text, g[-1].end)
        if not m:
            continue
        hi = min([s for s in starts if s > m.end()] + [len(text)])
        colon = text.find(":", m.end())
        if colon >= 0:
            hi = min(hi, colon)
        if i + 1 < len(groups):
            hi = min(hi, groups[i + 1][0].start)
        chosen = [(n, line_of(n.start)) for n in nums if m.end() <= n.start and n.end <= hi]
        units.append(Unit(chosen, g))
    return units


# ------------------------------------------------------------------------------------
# Driver


def markdown_files(root: str) -> list[str]:
    files = []
    if os.path.isfile(os.path.join(root, "README.md")):
        files.append("README.md")
    docs = os.path.join(root, "docs")
    for d, subdirs, names in os.walk(docs):
        subdirs.sort()
        for n in sorted(names):
            if n.endswith(".md"):
                files.append(os.path.relpath(os.path.join(d, n), root).replace(os.sep, "/"))
    return files


def check(root: str, out=sys.stdout, verbose: bool = False) -> int:
    root = os.path.abspath(root)
    failures: list[tuple[str, int, str]] = []
    receipts: dict[str, Receipt | None] = {}
    readme_receipts: dict[str, int] = {}
    checked = 0

    def load(path: str, where: tuple[str, int]) -> Receipt | None:
        if path in receipts:
            return receipts[path]
        full = os.path.join(root, path)
        r = None
        if "*" in path:
            failures.append((*where, f"{path} matches no receipt"))
        elif not os.path.isfile(full):
            failures.append((*where, f"{path} does not exist"))
        else:
            try:
                with open(full, encoding="utf-8") as f:
                    r = Receipt(path, json.load(f))
            except (ValueError, UnicodeDecodeError) as e:
                failures.append((*where, f"{path} is not valid JSON ({e})"))
        receipts[path] = r
        return r

    for md in markdown_files(root):
        with open(os.path.join(root, md), encoding="utf-8") as f:
            blocks = split_blocks(f.read())
        md_dir = os.path.dirname(os.path.join(root, md))
        pending: set[str] = set()
        prev = None  # (kind, citations) of the block before
        for block in blocks:
            text, cites, excluded, line_of = prepare(block, md_dir, root)
            if block.kind == "comment":
                pending |= excluded
                continue
            excluded |= pending
            pending = set()
            for c in cites:
                r = load(c.path, (md, c.line))
                if md == "README.md":
                    readme_receipts.setdefault(c.path, c.line)
            if block.kind == "table":
                caption = prev[1] if prev and prev[0] == "prose" else []
                units = table_units(block, text, cites, line_of, caption)
            else:
                units = prose_units(text, cites, line_of)
            prev = (block.kind, cites)
            for u in units:
                rs = [receipts[c.path] for c in u.cites if receipts.get(c.path) is not None]
                rs = list({id(r): r for r in rs}.values())
                names = ", ".join(dict.fromkeys(c.path for c in u.cites))
                if not rs:
                    continue  # the missing or broken receipt is already a failure
                for n, line in u.numbers:
                    if normalise_excluded(n.text) in excluded:
                        continue
                    checked += 1
                    if not holds(n, rs):
                        failures.append((md, line, f'"{n.text}" not in {names} ({nearest(n, rs)})'))
                    elif verbose:
                        print(f'{md}:{line}: "{n.text}" holds ({names})', file=out)

    no_field = []
    for path, line in readme_receipts.items():
        r = receipts.get(path)
        if r is None:
            continue
        dirty = r.data.get("git_dirty") if isinstance(r.data, dict) else None
        if dirty is True:
            failures.append(
                ("README.md", line, f"{path} has \"git_dirty\": true (made from a tree with uncommitted changes)")
            )
        elif dirty is None:
            no_field.append(path)

    for md, line, msg in sorted(failures, key=lambda f: (f[0], f[1])):
        print(f"{md}:{line}: {msg}", file=out)
    n_receipts = sum(1 for r in receipts.values() if r is not None)
    if no_field:
        print(
            f"claims: {len(no_field)} of the README's receipts record no git_dirty field, not failed: "
            + ", ".join(sorted(no_field)),
            file=out,
        )
    print(f"claims: {checked} numbers checked against {n_receipts} receipts, {len(failures)} failures", file=out)
    return 1 if failures else 0


def main(argv: list[str]) -> int:
    args = argv[1:]
    verbose = "-v" in args
    args = [a for a in args if a != "-v"]
    if len(args) > 1 or any(a.startswith("-") for a in args):
        print("usage: check-claims.py [-v] [ROOT]", file=sys.stderr)
        return 2
    root = args[0] if args else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    return check(root, verbose=verbose)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
