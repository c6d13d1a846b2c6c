#!/usr/bin/env python3
"""An rlx reward program (docs/signals.md, `kind = "program"`): one JSON request per line on stdin,
one JSON object per line on stdout, in the same order.

Each request has `completion` (the decoded text), `answer` (the row's reference answer, from
`task.answer_key`), `row` (every column of the dataset row), `prompt`, `messages`, `group`, `sample`,
`index`, `tokens` and `keys` (the output keys the config reads). This grader answers

    correct  1.0 when the last <answer>…</answer> equals the reference as a number (1/2 = 0.5)
    format   1.0 when the completion has an <answer>…</answer> tag at all

It reads line by line and flushes every answer, so the same file serves `persistent = true` (one
process for the whole run) and one process per batch. Errors go to stderr, where rlx shows their last
lines when the program fails.
"""

import json
import re
import sys
from fractions import Fraction

TAG = re.compile(r"<answer>(.*?)</answer>", re.IGNORECASE | re.DOTALL)


def number(text):
    """The value of `text` as an exact fraction (`3`, `-2.5`, `1,000`, `7/2`), or None."""
    text = str(text).strip().replace(",", "")
    try:
        return Fraction(text)
    except (ValueError, ZeroDivisionError):
        return None


def grade(request):
    tags = TAG.findall(request["completion"])
    answer = tags[-1] if tags else None
    reference = request.get("answer")
    correct = (
        answer is not None
        and reference is not None
        and number(answer) is not None
        and number(answer) == number(reference)
    )
    return {"correct": 1.0 if correct else 0.0, "format": 1.0 if tags else 0.0}


def main():
    for line in sys.stdin:
        if not line.strip():
            continue
        print(json.dumps(grade(json.loads(line))), flush=True)


if __name__ == "__main__":
    main()
