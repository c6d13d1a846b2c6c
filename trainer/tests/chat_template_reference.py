"""Reference renderings for trainer/tests/chat_template.rs, by Hugging Face transformers itself.

    python chat_template_reference.py render < request.json
        request: {"template": str, "now": unix seconds, "special_tokens": {name: text},
                  "cases": [{"messages": [...], "add_generation_prompt": bool,
                             "kwargs_json": a JSON object as text, so that its key order is kept}]}
        prints:  [{"text": str} or {"error": str}, ...]
    python chat_template_reference.py tokenizer DIR < request.json
        request: {"texts": [str], "messages": [...], "add_generation_prompt": bool}
        prints:  {"encode": [[int]], "chat_text": str, "chat_ids": [int], "eos_token_id": int,
                  "pad_token_id": int, "bos_token_id": int or null}

`render` compiles the template with transformers' own environment (`_compile_jinja_template`) and renders
it with `render_jinja_template` (the function `apply_chat_template` calls), special tokens passed as
`apply_chat_template` passes them; `strftime_now` is pinned to `now` (UTC) so both sides print the same
date. A `tools` entry in the kwargs is passed as `tools=`, as `apply_chat_template(tools=...)` does.
"""

import json
import sys
from datetime import datetime, timezone


def render(request):
    from transformers.utils import chat_template_utils as ctu

    template = request["template"]
    compiled = ctu._compile_jinja_template(template)
    now = datetime.fromtimestamp(request["now"], timezone.utc)
    # Template globals are a ChainMap over the environment's: this pins the clock for this template only.
    compiled.globals["strftime_now"] = lambda fmt: now.strftime(fmt)
    results = []
    for case in request["cases"]:
        kwargs = dict(request["special_tokens"])
        kwargs.update(json.loads(case["kwargs_json"]))
        tools = kwargs.pop("tools", None)
        documents = kwargs.pop("documents", None)
        try:
            if hasattr(ctu, "render_jinja_template"):
                out = ctu.render_jinja_template(
                    conversations=[case["messages"]],
                    tools=tools,
                    documents=documents,
                    chat_template=template,
                    add_generation_prompt=case["add_generation_prompt"],
                    **kwargs,
                )
                rendered = out[0] if isinstance(out, tuple) else out
                text = rendered[0]
            else:
                text = compiled.render(
                    messages=case["messages"],
                    tools=tools,
                    documents=documents,
                    add_generation_prompt=case["add_generation_prompt"],
                    **kwargs,
                )
            results.append({"text": text})
        except Exception as error:  # the Rust side must fail too; the message is shown on a mismatch
            results.append({"error": f"{type(error).__name__}: {error}"})
    return results


def tokenizer(directory, request):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(directory)
    chat_text = tok.apply_chat_template(
        request["messages"], add_generation_prompt=request["add_generation_prompt"], tokenize=False
    )
    chat_ids = tok.apply_chat_template(
        request["messages"], add_generation_prompt=request["add_generation_prompt"], tokenize=True
    )
    if isinstance(chat_ids, dict) or hasattr(chat_ids, "keys"):
        chat_ids = chat_ids["input_ids"]
    return {
        "encode": [tok(text)["input_ids"] for text in request["texts"]],
        "chat_text": chat_text,
        "chat_ids": list(chat_ids),
        "eos_token_id": tok.eos_token_id,
        "pad_token_id": tok.pad_token_id,
        "bos_token_id": tok.bos_token_id,
    }


def main():
    request = json.load(sys.stdin)
    if sys.argv[1] == "render":
        result = render(request)
    elif sys.argv[1] == "tokenizer":
        result = tokenizer(sys.argv[2], request)
    else:
        raise SystemExit(f"unknown mode {sys.argv[1]!r}")
    json.dump(result, sys.stdout, ensure_ascii=False)


if __name__ == "__main__":
    main()
