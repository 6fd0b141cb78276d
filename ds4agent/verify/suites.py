"""The cases of `ds4 eval`, written for ds4agent: what a local model is used for, each with an
answer that can be checked without judgement.

- reasoning: arithmetic and logic with one right answer (an integer, a choice, a word, a set);
- code: a function to write, run against tests the model does not see;
- tools: the agent in a throwaway repository, with a change to make that a check then verifies;
- recall: facts planted in a long prompt of look-alike facts, asked back.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

SUITES = ("reasoning", "code", "tools", "recall")


@dataclass(frozen=True)
class Case:
    id: str
    suite: str
    kind: str  # what is graded: choice, integer, exact, lines (extract.py), test (code), check (tools)
    prompt: str
    expect: str  # the extracted answer that passes; for test/check: what passing means
    # tokens the answer may take, reasoning included (thinking on a short problem takes the real
    # model hundreds to a few thousand tokens; a cap reached is a failed case, "length")
    budget: int = 4096
    tests: str = ""  # code: Python appended to the answer's code, run; it must exit 0
    files: dict[str, str] = field(default_factory=dict)  # tools: the repository's files
    check: str = ""  # tools: a Python script run in the repository afterwards; exit 0 passes


_ANSWER_LINE = " End with a line 'Answer: ' and the answer alone."

REASONING = [
    Case("journey-minutes", "reasoning", "integer",
         "A train leaves at 14:35 and arrives at 17:10 the same day. How many minutes does the journey take?"
         + _ANSWER_LINE, "155"),
    Case("product", "reasoning", "integer", "What is 37 multiplied by 43?" + _ANSWER_LINE, "1591"),
    Case("apples", "reasoning", "integer",
         "I have 4 boxes of 12 apples. I eat 6 apples, then give away a third of the apples I have left. "
         "How many apples do I have now?" + _ANSWER_LINE, "28"),
    Case("letter-count", "reasoning", "integer",
         "How many times does the letter r occur in the word strawberry?" + _ANSWER_LINE, "3"),
    Case("prime-choice", "reasoning", "choice",
         "Which of these numbers is prime? A) 51 B) 57 C) 59 D) 63" + _ANSWER_LINE.replace("the answer", "the letter"),
         "C"),
    Case("syllogism", "reasoning", "choice",
         "All bloops are razzies and all razzies are lazzies. Which statement must be true? "
         "A) All lazzies are bloops B) All bloops are lazzies C) Some razzies are not bloops D) No bloop is a lazzie"
         + _ANSWER_LINE.replace("the answer", "the letter"), "B"),
    Case("reverse-word", "reasoning", "exact",
         "Write the word 'stressed' backwards." + _ANSWER_LINE.replace("the answer", "the word"), "desserts"),
    Case("primes-list", "reasoning", "lines",
         "List every prime number between 10 and 30. After a line 'Answer:', write them one per line and "
         "nothing else.", "11,13,17,19,23,29"),
]

_CODE = " Write it in Python in one ```python block; the tests import nothing else from you."
_CODE_BUDGET = 6144

CODE = [
    Case("palindrome", "code", "test",
         "Write a function is_palindrome(s: str) -> bool that tells whether s reads the same backwards, ignoring "
         "case and every character that is not a letter or a digit." + _CODE, "its tests pass", budget=_CODE_BUDGET,
         tests="assert is_palindrome('A man, a plan, a canal: Panama')\nassert not is_palindrome('ds4 agent')\n"
               "assert is_palindrome('')\nassert is_palindrome('No lemon, no melon')\n"),
    Case("fizzbuzz", "code", "test",
         "Write a function fizzbuzz(n: int) -> list[str] giving the strings for 1..n: 'Fizz' for multiples of 3, "
         "'Buzz' for multiples of 5, 'FizzBuzz' for both, else the number." + _CODE, "its tests pass",
         budget=_CODE_BUDGET,
         tests="assert fizzbuzz(5) == ['1', '2', 'Fizz', '4', 'Buzz']\nassert fizzbuzz(15)[-1] == 'FizzBuzz'\n"
               "assert fizzbuzz(0) == []\n"),
    Case("merge-intervals", "code", "test",
         "Write a function merge(intervals: list[tuple[int, int]]) -> list[tuple[int, int]] that merges "
         "overlapping or touching closed intervals and returns them sorted by start." + _CODE, "its tests pass",
         budget=_CODE_BUDGET,
         tests="assert merge([(1, 3), (2, 6), (8, 10), (15, 18)]) == [(1, 6), (8, 10), (15, 18)]\n"
               "assert merge([(1, 4), (4, 5)]) == [(1, 5)]\nassert merge([]) == []\n"
               "assert merge([(5, 7), (1, 2)]) == [(1, 2), (5, 7)]\n"),
    Case("roman", "code", "test",
         "Write a function roman_to_int(s: str) -> int that converts a Roman numeral (I, V, X, L, C, D, M, with "
         "subtractive pairs such as IV and CM) to an integer." + _CODE, "its tests pass", budget=_CODE_BUDGET,
         tests="assert roman_to_int('III') == 3\nassert roman_to_int('LVIII') == 58\n"
               "assert roman_to_int('MCMXCIV') == 1994\nassert roman_to_int('XLIV') == 44\n"),
]

TOOLS = [
    Case("fix-failing-test", "tools", "check",
         "The tests in test_calc.py fail (run: python3 test_calc.py). Fix calc.py so that they pass. Do not "
         "change test_calc.py.", "test_calc.py passes and is unchanged", budget=8192,
         files={"calc.py": "def add(a, b):\n    return a - b\n\n\ndef mul(a, b):\n    return a * b\n",
                "test_calc.py": "from calc import add, mul\n\nassert add(2, 3) == 5\nassert add(-1, 1) == 0\n"
                                "assert mul(4, 5) == 20\nprint('ok')\n"},
         check="import hashlib, subprocess, sys\n"
               "want = {TEST_SHA!r}\n"
               "got = hashlib.sha256(open('test_calc.py', 'rb').read()).hexdigest()\n"
               "ran = subprocess.run([sys.executable, 'test_calc.py']).returncode\n"
               "sys.exit(0 if got == want and ran == 0 else 1)\n"),
    Case("add-function", "tools", "check",
         "Add a function word_count(text) to textutil.py that returns the number of words in text (words are "
         "separated by any whitespace). Keep the existing function.", "word_count works, shout is kept",
         budget=8192,
         files={"textutil.py": "def shout(text):\n    return text.upper() + '!'\n"},
         check="import sys\nsys.path.insert(0, '.')\nfrom textutil import shout, word_count\n"
               "assert word_count('a b  c\\n d') == 4 and word_count('') == 0 and word_count('  one ') == 1\n"
               "assert shout('hi') == 'HI!'\n"),
]


def _recall(case_id: str, words: int, seed: int) -> Case:
    """A report of look-alike facts (vaults, colours, four-digit codes) with the asked one
    planted about two thirds in; ``words`` of text (about 1.3 tokens each)."""
    rng = random.Random(seed)
    colours = ["red", "green", "amber", "violet", "grey", "white", "black", "orange", "teal", "ochre"]
    places = ["north wing", "south wing", "east annex", "west annex", "basement", "attic", "old tower", "new hall"]
    target = (rng.choice(colours[:5]), rng.choice(places), rng.randint(1000, 9999))
    sentences = []
    n = 0
    planted = False
    while n < words:
        if not planted and n >= 2 * words // 3:
            c, p, code = target
            sentences.append(f"The {c} vault in the {p} opens with the code {code}.")
            planted = True
        else:
            c, p, code = rng.choice(colours), rng.choice(places), rng.randint(1000, 9999)
            if (c, p) == target[:2]:
                continue  # no second code for the asked vault
            kind = rng.randrange(3)
            if kind == 0:
                sentences.append(f"The {c} vault in the {p} opens with the code {code}.")
            elif kind == 1:
                sentences.append(f"On day {rng.randint(1, 90)} the {p} logged {rng.randint(2, 60)} visitors "
                                 f"and the {c} lamp was replaced.")
            else:
                sentences.append(f"Inventory of the {p}: {rng.randint(3, 400)} boxes, {rng.randint(1, 30)} "
                                 f"{c} crates, seal number {code}.")
        n += len(sentences[-1].split())
    text = " ".join(sentences)
    c, p, code = target
    return Case(case_id, "recall", "integer",
                f"Here is a facility report.\n\n{text}\n\nWhat is the code of the {c} vault in the {p}?"
                + _ANSWER_LINE, str(code), budget=2048)


RECALL = [_recall("vault-2k", 1500, 1), _recall("vault-8k", 6000, 2), _recall("vault-24k", 18000, 3)]


def cases() -> list[Case]:
    """Every case, in suite order."""
    tools = [c if "{TEST_SHA!r}" not in c.check else _with_test_sha(c) for c in TOOLS]
    return REASONING + CODE + tools + RECALL


def _with_test_sha(c: Case) -> Case:
    import hashlib
    from dataclasses import replace

    sha = hashlib.sha256(c.files["test_calc.py"].encode()).hexdigest()
    return replace(c, check=c.check.replace("{TEST_SHA!r}", repr(sha)))
