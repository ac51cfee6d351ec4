"""The user's pages (README.md and docs/): short, every link resolves, every code block runs
or says why not, and no page names a date, a commit, an issue or a machine.

Code blocks of README.md and docs/**/*.md (the benchmark page, generated when the site is
built, is checked by tests/test_benchmark_page.py):

- A ```python block runs as a user pastes it: in a fresh interpreter, in an empty temporary
  directory, with ``MPLBACKEND=Agg`` and ``TF_CPP_MIN_LOG_LEVEL=3``.
- A shell block (```bash, ```sh, ```shell, ```console) runs only where the line right before
  its fence is ``<!-- run with: ARGS -->``. Then every ``python -m heatinv.<module> ...``
  line of the block runs, one after another in one empty temporary directory, with ARGS
  appended (``<!-- run with: debug=smoke -->``: the page shows the real command, the test
  runs its smoke-sized version). A trailing ``# comment`` is dropped, a line ending in ``\\``
  continues on the next, and in a console block only the ``$ `` lines are commands. Such a
  block holds nothing else but ``tensorboard`` lines, which start a server that does not
  return and are not run; anything else fails the test, so a ``run with`` marker cannot
  silently skip a command.
- Any python or shell block may instead have ``<!-- not run: REASON -->`` right before its
  fence; the reason must not be empty (e.g. "installs packages", "needs a Slurm cluster",
  "a 20-minute run; tests/test_x.py runs it with debug=smoke"). A shell block without
  either marker fails the test, and so does a marker anywhere but right before a python or
  shell fence.

HTML comments do not show on the rendered site. The blocks that run are kept to about two
CPU-minutes in all: a long command is marked ``not run`` with the test that covers it.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]


def _user_pages() -> list[Path]:
    """README.md and every page under docs/ but docs/development/ (contributors' pages)."""
    docs = sorted(p for p in (ROOT / "docs").rglob("*.md") if "development" not in p.relative_to(ROOT / "docs").parts)
    return [ROOT / "README.md", *docs]


USER_PAGES = _user_pages()
CODE_PAGES = USER_PAGES  # the generated benchmark page is checked by tests/test_benchmark_page.py


def _name(page: Path) -> str:
    return str(page.relative_to(ROOT))


def test_the_readme_is_at_most_200_lines_and_holds_the_two_commands():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    ci = (ROOT / ".ci" / "run").read_text().replace("pip install -q ", "pip install ")  # CI's installs are quiet
    assert "pip install -e . && python -m heatinv.train target=digit7" in readme
    test_command = 'pip install -e ".[test]" && pip install --no-deps lxt==2.1 && python -m pytest -q -n 2'
    assert test_command in readme
    for part in ('pip install -e ".[test]"', "pip install --no-deps lxt==2.1", "python -m pytest -q -n 2"):
        assert part in ci, part


def _generated_pages() -> set[Path]:
    """The pages the site's build writes (scripts/docs/generated.py), under docs/."""
    sys.path.insert(0, str(ROOT / "scripts" / "docs"))
    from generated import GENERATED_PAGES

    return {(ROOT / "docs" / name).resolve() for name in GENERATED_PAGES}


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_every_relative_link_and_image_resolves(page):
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text())
    generated = _generated_pages()
    broken = [link for link in links if "://" not in link and not (page.parent / link).exists()
              and (page.parent / link).resolve() not in generated]
    assert not broken, f"{page.name} links to missing files: {broken}"


# --------------------------------------------------------------------------- code blocks

PYTHON = {"python", "py", "python3"}
SHELL = {"bash", "sh", "shell", "console", "zsh"}
FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<lang>[^\s`~]*)")
MARKER = re.compile(r"^\s*<!--\s*(?P<kind>not run|run with)\s*:(?P<text>.*?)-->\s*$")
LOOKS_LIKE_A_MARKER = re.compile(r"^\s*<!--\s*(not[ -]?run|run[ -]?with|run)\b", re.I)
SERVERS = {"tensorboard"}  # a run-with block may show them; they do not return, so they are not run


@dataclass
class Block:
    page: str
    line: int  # the fence's line, 1-based
    lang: str
    code: str  # dedented
    kind: str | None  # "not run", "run with" or None
    text: str  # the marker's reason or arguments

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def parse(text: str, page: str = "<page>") -> tuple[list[Block], list[str]]:
    """The page's fenced blocks with their markers, and what breaks the convention."""
    lines = text.splitlines()
    blocks, problems, used_markers = [], [], set()
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        indent, fence, lang = opening["indent"], opening["fence"], opening["lang"].lower()
        end = i + 1
        while end < len(lines) and not re.fullmatch(rf"[ \t]*{re.escape(fence[0])}{{{len(fence)},}}[ \t]*", lines[end]):
            end += 1
        body = [line[len(indent):] if line.startswith(indent) else line.lstrip() for line in lines[i + 1 : end]]
        code = textwrap.dedent("\n".join(body) + "\n")
        before = lines[i - 1] if i > 0 else ""
        marker = MARKER.match(before)
        kind, marker_text = (marker["kind"], marker["text"].strip()) if marker else (None, "")
        where = f"{page}:{i + 1}"
        if marker:
            used_markers.add(i - 1)
            if lang not in PYTHON | SHELL:
                problems.append(f"{where}: a '{kind}' marker on a ```{lang} block (only python and shell blocks run)")
            elif not marker_text:
                problems.append(f"{where}: '<!-- {kind}: -->' needs a {'reason' if kind == 'not run' else 'list of arguments'}")
            elif kind == "run with" and lang in PYTHON:
                problems.append(f"{where}: 'run with' is for shell blocks; a python block runs as it is")
        elif lang in SHELL:
            problems.append(f"{where}: a ```{lang} block needs <!-- run with: ARGS --> or <!-- not run: REASON --> right before it")
        block = Block(page, i + 1, lang, code, kind, marker_text)
        if kind == "run with" and lang in SHELL and marker_text:
            try:
                commands(block)
            except ValueError as error:
                problems.append(f"{where}: {error}")
        blocks.append(block)
        i = end + 1
    for n, line in enumerate(lines):
        if (MARKER.match(line) or LOOKS_LIKE_A_MARKER.match(line)) and n not in used_markers:
            problems.append(f"{page}:{n + 1}: {line.strip()!r} is not a marker right before a python or shell fence")
    return blocks, problems


def commands(block: Block) -> list[list[str]]:
    """The argument lists a run-with block runs: its heatinv commands with the marker's arguments appended."""
    extra = shlex.split(block.text)
    joined, lines = "", []
    for line in block.code.splitlines():
        if block.lang == "console":
            if not line.startswith("$ ") and not joined:
                continue  # the command's output
            line = line[2:] if line.startswith("$ ") else line
        if line.rstrip().endswith("\\"):
            joined += line.rstrip()[:-1] + " "
            continue
        lines.append(joined + line)
        joined = ""
    runs = []
    for line in lines:
        words = shlex.split(line, comments=True)
        if not words or words[0] in SERVERS:
            continue
        if any(word in {"&&", "||", ";", "|", "&", ">", "<"} or word.endswith(";") for word in words):
            raise ValueError(f"'run with' runs one command per line, without shell operators: {line.strip()!r}")
        if words[:2] != ["python", "-m"] or len(words) < 3 or not words[2].startswith("heatinv."):
            raise ValueError(f"'run with' runs only python -m heatinv.* lines (and shows {sorted(SERVERS)} lines): {line.strip()!r}")
        runs.append([sys.executable, *words[1:], *extra])
    if not runs:
        raise ValueError("a 'run with' block without a python -m heatinv.* line")
    return runs


BLOCKS = [block for page in CODE_PAGES for block in parse(page.read_text(), _name(page))[0]]
PYTHON_BLOCKS = [block for block in BLOCKS if block.lang in PYTHON and block.kind is None]
SHELL_RUNS = [block for block in BLOCKS if block.lang in SHELL and block.kind == "run with"]


def _env() -> dict[str, str]:
    return {**os.environ, "MPLBACKEND": "Agg", "TF_CPP_MIN_LOG_LEVEL": "3"}


@pytest.mark.parametrize("page", CODE_PAGES, ids=_name)
def test_every_code_block_runs_or_says_why_not(page):
    _, problems = parse(page.read_text(), _name(page))
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("block", PYTHON_BLOCKS, ids=lambda b: b.id)
def test_each_python_block_runs(block, tmp_path):
    """Each block as a user pastes it, in a fresh interpreter in an empty directory."""
    done = subprocess.run([sys.executable, "-c", block.code], capture_output=True, text=True, timeout=600,
                          env=_env(), cwd=tmp_path)
    assert done.returncode == 0, f"{block.id}'s Python block failed:\n{block.code}\n{done.stderr[-3000:]}"


@pytest.mark.parametrize("block", SHELL_RUNS, ids=lambda b: b.id)
def test_each_run_with_block_runs(block, tmp_path):
    """Each heatinv command of the block with the marker's arguments, one after another in one empty directory."""
    for argv in commands(block):
        done = subprocess.run(argv, capture_output=True, text=True, timeout=600, env=_env(), cwd=tmp_path)
        shown = shlex.join(["python", *argv[1:]])
        assert done.returncode == 0, f"{block.id}: `{shown}` exited {done.returncode}:\n{done.stderr[-3000:]}"


def test_the_block_convention_is_enforced():
    """Planted pages: each way of breaking the convention is found, a page that keeps it is clean."""
    good = textwrap.dedent("""\
        ```python
        print(1)
        ```
        <!-- not run: installs packages -->
        ```bash
        pip install heatinv
        ```
        <!-- run with: debug=smoke -->
        ```bash
        python -m heatinv.train target=digit7 \\
          loss=l1                       # a comment
        tensorboard --logdir outputs
        ```
        ```json
        {"steps": 4}
        ```
        """)
    blocks, problems = parse(good)
    assert problems == []
    assert [b.kind for b in blocks] == [None, "not run", "run with", None]
    assert commands(blocks[2]) == [[sys.executable, "-m", "heatinv.train", "target=digit7", "loss=l1", "debug=smoke"]]
    assert textwrap.dedent(parse("- item\n\n  ```python\n  x = 1\n  if x:\n      pass\n  ```\n")[0][0].code) == "x = 1\nif x:\n    pass\n"
    bad = {
        "a reason": "<!-- not run: -->\n```python\nx\n```\n",
        "needs <!-- run with": "```bash\npython -m heatinv.train\n```\n",
        "is not a marker right before": "<!-- not run: a blank line between -->\n\n```bash\nls\n```\n",
        "runs only python -m heatinv": "<!-- run with: debug=smoke -->\n```bash\npip install x\n```\n",
        "without shell operators": "<!-- run with: debug=smoke -->\n```bash\npython -m heatinv.train && ls\n```\n",
        "'run with' is for shell blocks": "<!-- run with: debug=smoke -->\n```python\nx = 1\n```\n",
        "only python and shell blocks run": "<!-- not run: data -->\n```json\n{}\n```\n",
        "not a marker right": "<!-- notrun because -->\n```python\nx = 1\n```\n",
    }
    for expected, page in bad.items():
        _, problems = parse(page)
        assert any(expected in p for p in problems), (expected, problems)


# --------------------------------------------------------------------------- dates, commits, issues, machines

MONTHS = "January|February|March|April|May|June|July|August|September|October|November|December"
SHORT_MONTHS = "Jan|Feb|Mar|Apr|Jun|Jul|Aug|Sep|Sept|Oct|Nov|Dec"
FORBIDDEN = {
    "a date": re.compile(
        r"\b(?:19|20)\d\d-[01]\d-[0-3]\d\b"  # 2026-12-05
        r"|\b\d{1,2}/\d{1,2}/(?:19|20)\d\d\b"  # 12/05/2026
        rf"|\b(?:{MONTHS}|{SHORT_MONTHS})\.? \d{{1,2}}(?:st|nd|rd|th)?,? (?:19|20)\d\d\b"  # December 5, 2026
        rf"|\b\d{{1,2}}(?:st|nd|rd|th)? (?:of )?(?:{MONTHS}|{SHORT_MONTHS})\.?,? (?:19|20)\d\d\b"  # 5 December 2026
        rf"|\b(?:{MONTHS}) (?:19|20)\d\d\b"  # December 2026
    ),
    # 7 to 40 lowercase hex digits holding a digit and a letter: not a word ("facade"), not a
    # number, not a colour (#c0ffee1), not the digits after a decimal point (1.0000000e5)
    "a commit hash": re.compile(r"(?<![\w#.])(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}(?![\w])"),
    "an issue": re.compile(r"(?i)\b(?:issues?|PRs?|pull requests?|tickets?|bugs?)\s*#?\d+\b|/(?:issues|pull)/\d+\b"),
    "a machine": re.compile(
        r"\b(?:EPYC|Xeon|Intel|AMD|Ryzen|Threadripper|Opteron|Graviton|Neoverse|Apple M[1-9]|Core i[3579]"
        r"|AVX[\w-]*|AMX|SSE\d\w*|H100|H200|A100|V100)\b"
        r"|(?i:\bthis (?:machine|computer|host|box|CPU|laptop|session|commit)\b)"
        r"|(?i:\b(?:the|a|our) (?:dev|development|CI|build) (?:machine|box|host)\b)"
        r"|(?i:\b\d+[- ](?:shared[- ])?(?:CPU[- ])?cores?\b)"
        r"|(?i:\bload average\b)"
    ),
}
# "#12" is an issue in prose; in code it is heatinv's own output ("test example #4", "failed: #1")
ISSUE_IN_PROSE = re.compile(r"(?<![\w&#/])#\d+\b")


def _without_code(text: str) -> str:
    """The page with its fenced blocks and inline code blanked, line numbers kept."""
    text = re.sub(r"(?ms)^([ \t]*)(`{3,}|~{3,}).*?^\1\2[ \t]*$", lambda m: "\n" * m.group(0).count("\n"), text)
    return re.sub(r"`[^`\n]*`", "``", text)


def forbidden(text: str, exempt: re.Pattern | None = None) -> list[str]:
    """Each date, commit hash, issue number and machine name the page names, with its line."""
    found = []
    prose = _without_code(text).splitlines()
    for n, line in enumerate(text.splitlines()):
        if exempt is not None and exempt.search(line):
            continue
        for what, pattern in FORBIDDEN.items():
            found += [f"line {n + 1}: {what}: {m.group(0)!r}" for m in pattern.finditer(line)]
        found += [f"line {n + 1}: an issue: {m.group(0)!r}" for m in ISSUE_IN_PROSE.finditer(prose[n])]
    return found


@pytest.mark.parametrize("page", USER_PAGES, ids=_name)
def test_no_user_page_names_a_date_a_commit_an_issue_or_a_machine(page):
    """A user's page says what a command does, not when, where or in which commit it was measured."""
    found = forbidden(page.read_text())
    assert not found, f"{_name(page)}:\n" + "\n".join(found)


@pytest.mark.parametrize("planted", [
    "measured on 2026-12-05", "on December 5, 2026", "5 December 2026", "in March 2026", "on 12/05/2026",
    "before commit `c75d0bb`", "git show 6f56d0f:configs/x.yaml", "see 99c9a11d0e4b5f6a7b8c9d0e1f2a3b4c5d6e7f80",
    "issue 16's goals", "(issue #14)", "fixed in #12.", "PR 7", "github.com/o/r/issues/3",
    "on the AMD EPYC", "an Intel Xeon", "with AVX-512", "AVX2 kernels", "on this machine", "the 2-core machine",
    "2 shared CPU cores", "load average 3.4", "this session measured", "on this commit",
])
def test_the_page_check_finds_a_planted_date_commit_issue_or_machine(planted):
    assert forbidden(f"Some text\n{planted}\nand more.\n"), planted


@pytest.mark.parametrize("clean", [
    "the colour #ff00aa and #c0ffee1", "1.0000000e5 and 6.9e12", "2240 passed", "a facade, decade, effaced",
    "Ross et al. 2017", "ICML 2024", "`failed: #1` in the log", "```\nexample #4\n```", "## Heading",
    "one per CPU", "the reference mlp trained 34 of at most 200 epochs", "sha-free text",
    "outputs/<date>/<time>_loss=l1", "a GPU", "issues of scale",
])
def test_the_page_check_leaves_ordinary_text_alone(clean):
    assert not forbidden(f"Some text\n{clean}\nand more.\n"), clean
