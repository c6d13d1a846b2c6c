//! Chat templates rendered by minijinja ([`ChatTemplate`]) against transformers' own rendering, and the
//! tokenizer of a Hugging Face checkpoint folder ([`ChatTokenizer::from_hf_dir`], `save_hf`).
//!
//! The real templates are stored under tests/data/chat_templates/ (README.md there says where each came
//! from); SmolLM2's is read from its GGUF (tests/models.rs). The reference renderings are transformers'
//! (`render_jinja_template`, the function `apply_chat_template` calls), run by
//! tests/chat_template_reference.py in the torch environment: those tests are ignored where the build
//! found no torch (`cfg(rlx_torch)`).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use rlx_trainer::chat_template::{parse_json, strftime, ChatTemplate, Value as TemplateValue};
use rlx_trainer::tokenizer::{ChatTokenizer, Message};
use serde_json::{json, Map, Value};

/// 2025-10-09 08:53:20 UTC: the pinned clock of every `strftime_now`.
const NOW: i64 = 1_760_000_000;

fn data(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/chat_templates")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn tokens(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn m(role: &str, content: &str) -> Message {
    Message::new(role, content)
}

/// One rendering to compare: messages, the generation prompt, extra variables (a JSON object, its keys
/// in order, as both sides receive it).
struct Case {
    messages: Vec<Message>,
    add_generation_prompt: bool,
    kwargs: String,
}

/// The variables of a JSON object, in order, as template values.
fn variables(json: &str) -> Vec<(String, TemplateValue)> {
    let value = parse_json(json).unwrap();
    let mut out = Vec::new();
    for key in value.try_iter().unwrap() {
        let item = value.get_item(&key).unwrap();
        out.push((key.as_str().unwrap().to_string(), item));
    }
    out
}

fn render(
    t: &ChatTemplate,
    messages: &[Message],
    add_generation_prompt: bool,
    json: &str,
) -> Result<String, String> {
    let vars = variables(json);
    let vars: Vec<(&str, TemplateValue)> =
        vars.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
    t.render_with(messages, add_generation_prompt, &vars)
}

/// The conversations every real template is rendered on, each with and without the generation prompt.
fn conversations() -> Vec<Vec<Message>> {
    vec![
        vec![m("user", "Hi")],
        vec![m("system", "Be brief."), m("user", "Hi")],
        vec![
            m("user", "What is 2+2?"),
            m("assistant", "4"),
            m("user", "And 3+3?\nShow  the work."),
        ],
        vec![
            m("system", "  You answer in French.\n"),
            m("user", "naïve café — 東京 🚀 \"quoted\" {braces} <tags>"),
            m("assistant", "  D'accord.  "),
            m("user", "Merci"),
        ],
    ]
}

fn plain_cases() -> Vec<Case> {
    let mut cases = Vec::new();
    for messages in conversations() {
        for add_generation_prompt in [true, false] {
            cases.push(Case {
                messages: messages.clone(),
                add_generation_prompt,
                kwargs: "{}".into(),
            });
        }
    }
    cases
}

/// A tool as a JSON text (its keys in the order a caller wrote them, not sorted).
fn weather_tool() -> String {
    r#"[{"type": "function", "function": {"name": "get_weather",
        "description": "The weather in a city, in °C; the city's name < 100 chars & 'quoted'",
        "parameters": {"type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer", "default": 1.5}},
            "required": ["city"]}}}]"#
        .into()
}

fn with_tools() -> String {
    format!(r#"{{"tools": {}}}"#, weather_tool())
}

/// transformers' renderings of `cases` with `template` (tests/chat_template_reference.py).
fn reference(template: &str, special: &BTreeMap<String, String>, cases: &[Case]) -> Vec<Value> {
    let request = json!({
        "template": template,
        "now": NOW,
        "special_tokens": special,
        "cases": cases.iter().map(|c| json!({
            "messages": c.messages.iter().map(|m| json!({"role": m.role, "content": m.content})).collect::<Vec<_>>(),
            "add_generation_prompt": c.add_generation_prompt,
            "kwargs_json": c.kwargs,
        })).collect::<Vec<_>>(),
    });
    let out = python(&["render"], &request);
    match out {
        Value::Array(items) => items,
        other => panic!("unexpected reference output {other}"),
    }
}

fn python(args: &[&str], request: &Value) -> Value {
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/chat_template_reference.py"
    );
    let mut child = Command::new(rlx_tools::python())
        .arg(script)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run the torch environment's python (scripts/install-torch.sh)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(request.to_string().as_bytes())
        .unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(
        output.status.success(),
        "chat_template_reference.py {args:?} failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap()
}

/// Renders every case with minijinja and with transformers and asserts the texts are equal byte for
/// byte, or that both fail, which `failures` cases must do. Returns the renderings ("" for a failure).
fn compare(
    name: &str,
    template: &str,
    special: &[(&str, &str)],
    cases: &[Case],
    failures: usize,
) -> Vec<String> {
    let special = tokens(special);
    let ours = ChatTemplate::new(template, name, special.clone())
        .unwrap()
        .with_clock(NOW);
    let theirs = reference(template, &special, cases);
    assert_eq!(theirs.len(), cases.len());
    let mut texts = Vec::new();
    let mut failed = 0;
    for (case, reference) in cases.iter().zip(&theirs) {
        let rendered = render(
            &ours,
            &case.messages,
            case.add_generation_prompt,
            &case.kwargs,
        );
        let what = format!(
            "{name}: {:?} add_generation_prompt={} kwargs={}",
            case.messages, case.add_generation_prompt, case.kwargs
        );
        match (reference.get("text").and_then(Value::as_str), rendered) {
            (Some(expected), Ok(got)) => {
                assert_eq!(got, expected, "{what}");
                texts.push(got);
            }
            (None, Err(_)) => {
                failed += 1;
                texts.push(String::new());
            }
            (expected, got) => {
                panic!("{what}: transformers {expected:?} ({reference}), minijinja {got:?}")
            }
        }
    }
    assert_eq!(
        failed, failures,
        "{name}: renderings that failed on both sides"
    );
    if std::env::var_os("RLX_SHOW_RENDERINGS").is_some() {
        for text in &texts {
            eprintln!("---- {name}\n{text}");
        }
    }
    texts
}

// ---------------------------------------------------------------------------------------------------
// Real templates, byte for byte against transformers.

#[test]
#[cfg_attr(
    not(rlx_torch),
    ignore = "needs transformers: run scripts/install-torch.sh"
)]
fn qwen2_5_instruct_renders_as_in_transformers() {
    let template = data("Qwen2.5-Instruct.jinja");
    let special = [("eos_token", "<|im_end|>"), ("pad_token", "<|endoftext|>")];
    let mut cases = plain_cases();
    cases.push(Case {
        messages: vec![m("user", "Weather in Oslo?")],
        add_generation_prompt: true,
        kwargs: with_tools(),
    });
    let texts = compare("Qwen2.5-Instruct", &template, &special, &cases, 0);
    // The default system prompt comes first when the conversation has none.
    assert!(texts[0].starts_with(
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
    ));
    assert!(texts[0].ends_with("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"));
    // tojson of the tool: spaced JSON, no HTML escaping, non-ASCII as it is.
    let tools = texts.last().unwrap();
    assert!(
        tools.contains(r#"{"type": "function", "function": {"name": "get_weather""#)
            && tools.contains("in °C; the city's name < 100 chars & 'quoted'")
            && tools.contains(r#""default": 1.5"#),
        "{tools}"
    );
}

#[test]
#[cfg_attr(
    not(rlx_torch),
    ignore = "needs transformers: run scripts/install-torch.sh"
)]
fn qwen3_renders_as_in_transformers() {
    let template = data("Qwen3.jinja");
    let special = [("eos_token", "<|im_end|>"), ("pad_token", "<|endoftext|>")];
    let mut cases = plain_cases();
    // `<think>` handling: reasoning of turns before the last user query is dropped, the reasoning of the
    // turns after it kept (the messages[::-1] loop with its namespace finds that query); a user message
    // that is a tool response does not count as a query.
    let thinking = vec![
        m("user", "What is 2+2?"),
        m("assistant", "<think>\nAdd them.\n</think>\n\n4"),
        m("user", "And 3+3?"),
        m("assistant", "<think>\nAgain.\n</think>\n\n6"),
    ];
    let tool_turn = vec![
        m("system", "Use tools."),
        m("user", "Weather in Oslo?"),
        m("assistant", "<think>\nCall it.\n</think>\n\nCalling."),
        m("user", "<tool_response>\n12 °C\n</tool_response>"),
        m("assistant", "<think>\nRead it.\n</think>\n\nIt is 12 °C."),
    ];
    for messages in [thinking, tool_turn] {
        for add_generation_prompt in [true, false] {
            cases.push(Case {
                messages: messages.clone(),
                add_generation_prompt,
                kwargs: "{}".into(),
            });
        }
    }
    for enable_thinking in [true, false] {
        cases.push(Case {
            messages: vec![m("user", "Hi")],
            add_generation_prompt: true,
            kwargs: format!(r#"{{"enable_thinking": {enable_thinking}}}"#),
        });
    }
    cases.push(Case {
        messages: vec![m("system", "Be brief."), m("user", "Weather in Oslo?")],
        add_generation_prompt: true,
        kwargs: with_tools(),
    });
    let texts = compare("Qwen3", &template, &special, &cases, 0);
    let n = plain_cases().len();
    // The earlier turn's reasoning is gone, the last turn's kept.
    assert_eq!(
        texts[n + 1],
        "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|>\n\
         <|im_start|>user\nAnd 3+3?<|im_end|>\n\
         <|im_start|>assistant\n<think>\nAgain.\n</think>\n\n6<|im_end|>\n"
    );
    assert_eq!(
        texts[n + 5],
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    );
    assert_eq!(
        texts[n + 4],
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    );
}

#[test]
#[cfg_attr(
    not(rlx_torch),
    ignore = "needs transformers: run scripts/install-torch.sh"
)]
fn llama_3_2_instruct_renders_as_in_transformers() {
    let template = data("Llama-3.2-Instruct.jinja");
    let special = [
        ("bos_token", "<|begin_of_text|>"),
        ("eos_token", "<|eot_id|>"),
    ];
    let mut cases = plain_cases();
    cases.push(Case {
        messages: vec![m("user", "Hi")],
        add_generation_prompt: true,
        kwargs: r#"{"date_string": "26 Jul 2024"}"#.into(),
    });
    cases.push(Case {
        messages: vec![m("system", "Be brief."), m("user", "Weather in Oslo?")],
        add_generation_prompt: true,
        kwargs: with_tools(),
    });
    // raise_exception: tools in the first user message with no user message.
    cases.push(Case {
        messages: vec![m("system", "Be brief.")],
        add_generation_prompt: true,
        kwargs: with_tools(),
    });
    let texts = compare("Llama-3.2-Instruct", &template, &special, &cases, 1);
    // strftime_now("%d %b %Y") at the pinned clock.
    assert_eq!(
        texts[0],
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n\
         Cutting Knowledge Date: December 2023\nToday Date: 09 Oct 2025\n\n<|eot_id|>\
         <|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>\
         <|start_header_id|>assistant<|end_header_id|>\n\n"
    );
    assert!(texts[texts.len() - 2].contains("\"type\": \"object\",\n            \"properties\""));
    // The failing case failed on both sides (compare); the message says why.
    let ours = ChatTemplate::new(&template, "Llama-3.2-Instruct.jinja", tokens(&special)).unwrap();
    let err = render(&ours, &[m("system", "Be brief.")], true, &with_tools()).unwrap_err();
    assert!(
        err.starts_with("chat template of Llama-3.2-Instruct.jinja, line 53: the template raised an exception: Cannot put tools in the first user message when there's no first user message!"),
        "{err}"
    );
}

/// What minijinja and Jinja2 print differently unless set up as transformers is: Python's printing of
/// None/True/lists/dicts/floats, tojson's arguments, str/dict methods, namespace, loop controls, dict(),
/// whitespace control, strftime_now.
#[test]
#[cfg_attr(
    not(rlx_torch),
    ignore = "needs transformers: run scripts/install-torch.sh"
)]
fn python_semantics_match_transformers() {
    let template = r#"{{ none }}|{{ true }}|{{ false }}|{{ 1.0 }}|{{ 2.5e-7 }}|{{ 1e16 }}|{{ 3 }}|{{ undefined_name }}
{{ [1, 'a', "it's", none, true, 0.1] }}|{{ {'k': [1, 2], 'b': none} }}|{{ value }}
{{ value | tojson }}
{{ value | tojson(indent=2) }}
{{ value | tojson(indent=4, sort_keys=true) }}
{{ value | tojson(ensure_ascii=true) }}
{{ value | tojson(separators=(',', ':')) }}
{%- for k, v in value.items() %} {{ k }}={{ v }}{% endfor %}
{{ "  strip me  ".strip() }}|{{ "a,b,c".split(",") }}|{{ "Hello".startswith("He") }}|{{ "x".upper() }}|{{ "abc".endswith("bc") }}|{{ " a ".lstrip() }}|{{ "t<think>x".split("<think>")[-1] }}
{%- set ns = namespace(count=0) %}
{%- for message in messages %}
    {%- if loop.index0 > 1 %}{% break %}{% endif %}
    {%- set ns.count = ns.count + 1 %}
{%- endfor %}
count={{ ns.count }} {{ dict(a=1, b="two") | tojson }} {{ messages | length }} {{ messages[-1]['content'] }} {{ messages[::-1][0].role }}
  {% if add_generation_prompt %}
    gen
  {% endif %}
{{ strftime_now("%Y-%m-%d %H:%M:%S %a %A %b %B %j %y %I %p") }}
{{ bos_token }}{{ eos_token }}{{ pad_token }}
"#;
    // Keys deliberately unsorted: both sides keep their order.
    let value = r#"{"name": "x<y>&'z' \"q\"", "naïve": "東京 🚀\n\ttab\u0001",
        "n": [1, -2, 0.5, 1.0, 1e-5, 12345678901234567890, 1e300, 0.0001],
        "nested": {"z": null, "empty_list": [], "empty_map": {}, "t": true, "f": false}}"#;
    let special = [
        ("bos_token", "<s>"),
        ("eos_token", "</s>"),
        ("pad_token", "<pad>"),
    ];
    let mut cases = Vec::new();
    for add_generation_prompt in [true, false] {
        cases.push(Case {
            messages: vec![m("user", "one"), m("assistant", "two"), m("user", "three")],
            add_generation_prompt,
            kwargs: format!(r#"{{"value": {value}}}"#),
        });
    }
    let texts = compare("python semantics", template, &special, &cases, 0);
    assert!(
        texts[0].starts_with("None|True|False|1.0|2.5e-07|1e+16|3|\n"),
        "{}",
        texts[0]
    );
    assert!(texts[0].contains("2025-10-09 08:53:20 Thu Thursday Oct October 282 25 08 AM"));

    // Line ends: Jinja2 turns \r\n and \r into \n before lexing (a template saved on Windows).
    let crlf = "a\r\n{% if add_generation_prompt %}\r\nb\r{% endif %}\r\n  {{ 'c\r\nd' }}\r\n";
    let cases = [Case {
        messages: vec![],
        add_generation_prompt: true,
        kwargs: "{}".into(),
    }];
    let texts = compare("line ends", crlf, &[], &cases, 0);
    assert_eq!(texts[0], "a\nb\n  c\nd");
}

// ---------------------------------------------------------------------------------------------------
// Template errors and limits (no torch needed).

#[test]
fn template_errors_name_the_origin_line_and_problem() {
    let err = ChatTemplate::new(
        "{% for m in messages %}\n{{ m.content }\n{% endfor %}",
        "/ckpt/chat_template.jinja",
        BTreeMap::new(),
    )
    .unwrap_err();
    assert!(
        err.starts_with(
            "chat template of /ckpt/chat_template.jinja, line 2 does not compile: syntax error:"
        ),
        "{err}"
    );
    let err = ChatTemplate::new("{% if x %}", "t.jinja", BTreeMap::new()).unwrap_err();
    assert!(
        err.contains("syntax error") && err.contains("t.jinja"),
        "{err}"
    );

    let alternate = "{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}\
        {{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}\
        {{ message['content'] }}{% endfor %}";
    let t = ChatTemplate::new(alternate, "mistral", BTreeMap::new()).unwrap();
    assert_eq!(
        t.render(&[m("user", "a"), m("assistant", "b")], false)
            .unwrap(),
        "ab"
    );
    let err = t
        .render(&[m("user", "a"), m("user", "b")], false)
        .unwrap_err();
    assert_eq!(
        err,
        "chat template of mistral, line 1: the template raised an exception: Conversation roles must \
         alternate user/assistant/user/assistant/..."
    );

    // Errors at render time: an unknown filter, a method on the wrong type, a missing attribute chain.
    let t = ChatTemplate::new("x\n{{ messages | nosuchfilter }}", "o", BTreeMap::new());
    let err = match t {
        Ok(t) => t.render(&[m("user", "a")], false).unwrap_err(),
        Err(e) => e,
    };
    assert!(
        err.contains("line 2") && err.contains("nosuchfilter"),
        "{err}"
    );
    let t = ChatTemplate::new(
        "{{ messages[0].content.nosuchmethod() }}",
        "o",
        BTreeMap::new(),
    )
    .unwrap();
    let err = t.render(&[m("user", "a")], false).unwrap_err();
    assert!(
        err.contains("chat template of o, line 1") && err.contains("nosuchmethod"),
        "{err}"
    );
    // strftime_now with a directive it does not know.
    let t = ChatTemplate::new("{{ strftime_now('%Q') }}", "o", BTreeMap::new()).unwrap();
    let err = t.render(&[], false).unwrap_err();
    assert!(
        err.contains("the directive \"%Q\" is not supported"),
        "{err}"
    );
    // Reserved variables cannot be overridden.
    let t = ChatTemplate::new("{{ messages }}", "o", BTreeMap::new()).unwrap();
    let err = t
        .render_with(&[], false, &[("messages", TemplateValue::from(()))])
        .unwrap_err();
    assert!(err.contains("`messages` cannot be passed"), "{err}");
}

#[test]
fn an_endless_template_runs_out_of_fuel() {
    let t = ChatTemplate::new(
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
        "endless",
        BTreeMap::new(),
    )
    .unwrap();
    let err = t.render(&[], false).unwrap_err();
    assert!(
        err.contains("chat template of endless") && err.contains("fuel"),
        "{err}"
    );
}

#[test]
fn strftime_formats_utc_dates() {
    // 2024-02-29 23:05:09 UTC (a leap day), and the epoch.
    let t = 1_709_247_909;
    assert_eq!(
        strftime("%d %b %Y|%-d %e|%A %a|%B|%j|%H:%M:%S|%I %p|%F %T|%y|%Z %z|%%", t).unwrap(),
        "29 Feb 2024|29 29|Thursday Thu|February|060|23:05:09|11 PM|2024-02-29 23:05:09|24|UTC +0000|%"
    );
    assert_eq!(strftime("%d %b %Y %a", 0).unwrap(), "01 Jan 1970 Thu");
    assert_eq!(strftime("%Y-%m-%d", -86_400).unwrap(), "1969-12-31");
    assert_eq!(strftime("%e|%-m", 1_704_153_600).unwrap(), " 2|1"); // 2024-01-02
}

// ---------------------------------------------------------------------------------------------------
// A Hugging Face checkpoint folder.

fn tmp(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("chat-template-{name}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

const WORDS: [&str; 10] = [
    "<unk>",
    "<s>",
    "</s>",
    "<|im_start|>",
    "<|im_end|>",
    "hello",
    "world",
    "user",
    "assistant",
    "system",
];

/// A WordLevel tokenizer.json over [`WORDS`]: ids 0–4 are special added tokens, the rest whole words
/// split on whitespace and punctuation; with `bos_post_processor`, `<s>` is prepended by a
/// TemplateProcessing post-processor (as Llama 3's tokenizer.json prepends `<|begin_of_text|>`).
fn word_tokenizer_json(bos_post_processor: bool) -> Value {
    let vocab: Map<String, Value> = WORDS
        .iter()
        .enumerate()
        .map(|(i, w)| (w.to_string(), json!(i)))
        .collect();
    let added: Vec<Value> = WORDS[..5]
        .iter()
        .enumerate()
        .map(|(i, w)| {
            json!({"id": i, "content": w, "single_word": false, "lstrip": false, "rstrip": false,
                   "normalized": false, "special": true})
        })
        .collect();
    let post = if bos_post_processor {
        json!({
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}
        })
    } else {
        Value::Null
    };
    json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": added,
        "normalizer": null, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": post,
        "decoder": null, "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"}
    })
}

const TEMPLATE: &str = "{{ bos_token }}{% for m in messages %}<|im_start|>{{ m.role }} {{ m.content }}<|im_end|>{% endfor %}\
                        {% if add_generation_prompt %}<|im_start|>assistant{% endif %}";

fn write(dir: &Path, name: &str, text: &str) {
    std::fs::write(dir.join(name), text).unwrap();
}

/// A checkpoint folder: WordLevel tokenizer.json (no post-processor), tokenizer_config.json with
/// `add_bos_token`, special tokens as strings and `{"content"}` objects, the template, and a
/// generation_config.json with two eos ids.
fn hf_folder(name: &str) -> PathBuf {
    let dir = tmp(name);
    write(
        &dir,
        "tokenizer.json",
        &word_tokenizer_json(false).to_string(),
    );
    let config = json!({
        "add_bos_token": true,
        "bos_token": {"__type": "AddedToken", "content": "<s>", "lstrip": false, "normalized": false,
                      "rstrip": false, "single_word": false},
        "eos_token": "<|im_end|>",
        "unk_token": "<unk>",
        "chat_template": TEMPLATE,
        "tokenizer_class": "PreTrainedTokenizerFast",
    });
    write(&dir, "tokenizer_config.json", &config.to_string());
    write(
        &dir,
        "generation_config.json",
        &json!({"bos_token_id": 1, "eos_token_id": [2, 4], "pad_token_id": 0}).to_string(),
    );
    dir
}

fn assert_folder_tokenizer(tok: &ChatTokenizer) {
    assert_eq!(tok.vocab_size(), 10);
    assert_eq!((tok.bos, tok.eos, tok.pad), (Some(1), 4, 0));
    // generation_config's eos ids ∪ tokenizer_config's eos_token.
    assert_eq!(tok.stop_ids(), [2, 4]);
    assert!(tok.adds_bos());
    // encode adds the BOS (add_bos_token); a rendered chat prompt is encoded as it is.
    assert_eq!(tok.encode("hello world").unwrap(), [1, 5, 6]);
    // The BOS comes first even when the text starts with one (transformers 4.x's add_bos_token).
    assert_eq!(tok.encode("<s> hello").unwrap(), [1, 1, 5]);
    assert_eq!(tok.encode_chat("hello world").unwrap(), [5, 6]);
    assert_eq!(tok.encode("nope").unwrap(), [1, 0]);
    let prompt = tok
        .chat_prompt(&[m("system", "hello"), m("user", "world")], true)
        .unwrap();
    assert_eq!(
        prompt,
        "<s><|im_start|>system hello<|im_end|><|im_start|>user world<|im_end|><|im_start|>assistant"
    );
    assert_eq!(
        tok.chat_ids("hello").unwrap(),
        [1, 3, 7, 5, 4, 3, 8],
        "one BOS, written by the template"
    );
    assert_eq!(tok.decode(&[5, 6], false).unwrap(), "hello world");
    assert_eq!(tok.decode(&[1, 5, 4], true).unwrap(), "hello");
    assert_eq!(
        tok.special_tokens(),
        &tokens(&[
            ("bos_token", "<s>"),
            ("eos_token", "<|im_end|>"),
            ("unk_token", "<unk>")
        ])
    );
    assert_eq!(tok.chat_template().unwrap().source(), TEMPLATE);
}

#[test]
fn hf_folder_tokenizer_and_its_round_trip() {
    let dir = hf_folder("round-trip");
    let tok = ChatTokenizer::from_hf_dir(&dir).unwrap();
    assert_folder_tokenizer(&tok);
    assert!(tok
        .chat_template()
        .unwrap()
        .origin()
        .ends_with("tokenizer_config.json (`chat_template`)"));

    let saved = tmp("round-trip-saved");
    tok.save_hf(&saved).unwrap();
    let again = ChatTokenizer::from_hf_dir(&saved).unwrap();
    assert_folder_tokenizer(&again);
    // Saved twice, the files are the same.
    let twice = tmp("round-trip-saved-twice");
    again.save_hf(&twice).unwrap();
    for name in [
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
    ] {
        assert_eq!(
            std::fs::read(saved.join(name)).unwrap(),
            std::fs::read(twice.join(name)).unwrap(),
            "{name}"
        );
    }
}

#[test]
fn hf_folder_variants() {
    // The BOS from tokenizer.json's post-processor, add_bos_token absent: one BOS, not two.
    let dir = hf_folder("post-processor");
    write(
        &dir,
        "tokenizer.json",
        &word_tokenizer_json(true).to_string(),
    );
    let mut config: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("tokenizer_config.json")).unwrap())
            .unwrap();
    config.as_object_mut().unwrap().remove("add_bos_token");
    // Older files: a list of named templates, the "default" one taken.
    config["chat_template"] = json!([
        {"name": "tool_use", "template": "tools"},
        {"name": "default", "template": TEMPLATE},
    ]);
    write(&dir, "tokenizer_config.json", &config.to_string());
    std::fs::remove_file(dir.join("generation_config.json")).unwrap();
    let tok = ChatTokenizer::from_hf_dir(&dir).unwrap();
    assert!(!tok.adds_bos());
    assert_eq!(tok.encode("hello world").unwrap(), [1, 5, 6]);
    assert_eq!(tok.encode_chat("hello world").unwrap(), [5, 6]);
    assert_eq!(tok.chat_ids("hello").unwrap(), [1, 3, 7, 5, 4, 3, 8]);
    // No generation_config.json: the stop id is the eos_token alone; pad falls back to eos.
    assert_eq!((tok.stop_ids(), tok.eos, tok.pad), (&[4][..], 4, 4));
    assert!(tok
        .chat_template()
        .unwrap()
        .origin()
        .ends_with("(`chat_template` \"default\")"));

    // chat_template.jinja takes precedence over tokenizer_config.json's template.
    write(&dir, "chat_template.jinja", "{{ messages[0].content }}!\n");
    let tok = ChatTokenizer::from_hf_dir(&dir).unwrap();
    assert_eq!(
        tok.chat_prompt(&[m("user", "hello")], true).unwrap(),
        "hello!"
    );
    assert!(tok
        .chat_template()
        .unwrap()
        .origin()
        .ends_with("chat_template.jinja"));

    // No template at all: the tokenizer loads, a chat prompt is an error.
    std::fs::remove_file(dir.join("chat_template.jinja")).unwrap();
    config.as_object_mut().unwrap().remove("chat_template");
    write(&dir, "tokenizer_config.json", &config.to_string());
    let tok = ChatTokenizer::from_hf_dir(&dir).unwrap();
    assert_eq!(tok.encode("hello").unwrap(), [1, 5]);
    let err = tok.chat_ids("hello").unwrap_err().to_string();
    assert!(err.contains("has no chat template"), "{err}");
}

fn hf_error(dir: &Path) -> String {
    match ChatTokenizer::from_hf_dir(dir) {
        Ok(_) => panic!("{} loaded", dir.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn hf_folder_errors_name_the_file() {
    let missing = tmp("missing").join("nothing");
    assert!(hf_error(&missing).contains("is not a directory"));

    let dir = hf_folder("errors");
    std::fs::remove_file(dir.join("tokenizer.json")).unwrap();
    let err = hf_error(&dir);
    assert!(
        err.contains(&dir.join("tokenizer.json").display().to_string())
            && err.contains("No such file"),
        "{err}"
    );

    write(&dir, "tokenizer.json", "{\"model\": 3}");
    let err = hf_error(&dir);
    assert!(
        err.contains("tokenizer.json: not a tokenizers tokenizer.json"),
        "{err}"
    );

    write(
        &dir,
        "tokenizer.json",
        &word_tokenizer_json(false).to_string(),
    );
    let good_config = std::fs::read_to_string(dir.join("tokenizer_config.json")).unwrap();
    write(&dir, "tokenizer_config.json", "{\"eos_token\": ");
    let err = hf_error(&dir);
    assert!(err.contains("tokenizer_config.json: invalid JSON"), "{err}");
    write(&dir, "tokenizer_config.json", "[1, 2]");
    assert!(hf_error(&dir).contains("tokenizer_config.json: not a JSON object"));

    let mut config: Value = serde_json::from_str(&good_config).unwrap();
    config["eos_token"] = json!("<|eot_id|>");
    write(&dir, "tokenizer_config.json", &config.to_string());
    let err = hf_error(&dir);
    assert!(
        err.contains("tokenizer_config.json: `eos_token` \"<|eot_id|>\" is not a token of"),
        "{err}"
    );
    config["eos_token"] = json!(7);
    write(&dir, "tokenizer_config.json", &config.to_string());
    assert!(hf_error(&dir).contains("`eos_token` is 7, not a string"));

    config["eos_token"] = json!("<|im_end|>");
    config["chat_template"] = json!("{% for m in messages %}\n{{ m.content }");
    write(&dir, "tokenizer_config.json", &config.to_string());
    let err = hf_error(&dir);
    assert!(
        err.contains(
            "tokenizer_config.json (`chat_template`), line 2 does not compile: syntax error"
        ) && err.contains("does not compile"),
        "{err}"
    );
    config["chat_template"] = json!([{"name": "tool_use", "template": "x"}]);
    write(&dir, "tokenizer_config.json", &config.to_string());
    assert!(hf_error(&dir).contains("lists [\"tool_use\"] but none named \"default\""));
    write(&dir, "tokenizer_config.json", &good_config);

    write(&dir, "chat_template.jinja", "{% if %}");
    let err = hf_error(&dir);
    assert!(
        err.contains("chat_template.jinja, line 1 does not compile: syntax error"),
        "{err}"
    );
    std::fs::remove_file(dir.join("chat_template.jinja")).unwrap();

    write(
        &dir,
        "generation_config.json",
        "{\"eos_token_id\": [2, 99]}",
    );
    let err = hf_error(&dir);
    assert!(
        err.contains("generation_config.json: `eos_token_id` 99 is not a token of"),
        "{err}"
    );
    write(
        &dir,
        "generation_config.json",
        "{\"eos_token_id\": \"</s>\"}",
    );
    assert!(hf_error(&dir).contains("`eos_token_id` holds \"</s>\", not a token id"));
    write(&dir, "generation_config.json", "not json");
    assert!(hf_error(&dir).contains("generation_config.json: invalid JSON"));
    std::fs::remove_file(dir.join("generation_config.json")).unwrap();
    assert!(ChatTokenizer::from_hf_dir(&dir).is_ok());

    // A template that raises at render time names where it came from.
    let mut config: Value = serde_json::from_str(&good_config).unwrap();
    config["chat_template"] =
        json!("{% if messages[0].role != 'system' %}{{ raise_exception('a system message first') }}{% endif %}");
    write(&dir, "tokenizer_config.json", &config.to_string());
    let tok = ChatTokenizer::from_hf_dir(&dir).unwrap();
    let err = tok.chat_ids("hello").unwrap_err().to_string();
    assert!(
        err.contains("tokenizer_config.json (`chat_template`), line 1: the template raised an exception: a system message first"),
        "{err}"
    );
}

/// save_hf's folder as transformers loads it: AutoTokenizer encodes the same ids, renders the same chat
/// text and chat ids, and has the same special ids.
#[test]
#[cfg_attr(
    not(rlx_torch),
    ignore = "needs transformers: run scripts/install-torch.sh"
)]
fn save_hf_loads_in_transformers() {
    let tok = ChatTokenizer::from_hf_dir(&hf_folder("for-transformers")).unwrap();
    let saved = tmp("for-transformers-saved");
    tok.save_hf(&saved).unwrap();
    let texts = ["hello world", "world <|im_end|> hello", "nope"];
    let messages = [m("system", "hello"), m("user", "world")];
    let out = python(
        &["tokenizer", saved.to_str().unwrap()],
        &json!({
            "texts": texts,
            "messages": messages.iter().map(|m| json!({"role": m.role, "content": m.content})).collect::<Vec<_>>(),
            "add_generation_prompt": true,
        }),
    );
    for (i, text) in texts.iter().enumerate() {
        assert_eq!(out["encode"][i], json!(tok.encode(text).unwrap()), "{text}");
    }
    assert_eq!(
        out["chat_text"],
        json!(tok.chat_prompt(&messages, true).unwrap())
    );
    assert_eq!(
        out["chat_ids"],
        json!(tok.chat_prompt_ids(&messages, true).unwrap())
    );
    assert_eq!(out["eos_token_id"], json!(tok.eos));
    assert_eq!(out["bos_token_id"], json!(tok.bos));
}

/// SmolLM2's tokenizer built from its GGUF, saved as a Hugging Face folder: transformers loads it and
/// encodes text, renders the GGUF's chat template and encodes the chat exactly as this tokenizer does
/// (what `rlx export --hf` relies on).
#[test]
#[cfg_attr(
    not(all(rlx_assets, rlx_torch)),
    ignore = "needs the assets and transformers: run scripts/fetch-assets.sh and scripts/install-torch.sh"
)]
fn smollm2_gguf_tokenizer_saved_as_hf_loads_in_transformers() {
    let gguf =
        rlx_trainer::gguf::Gguf::open(&rlx_trainer::assets::smollm2_gguf().unwrap()).unwrap();
    let tok = gguf.tokenizer().unwrap();
    let saved = tmp("smollm2-saved");
    tok.save_hf(&saved).unwrap();
    let again = ChatTokenizer::from_hf_dir(&saved).unwrap();
    assert_eq!(
        (again.bos, again.eos, again.pad, again.stop_ids()),
        (tok.bos, tok.eos, tok.pad, tok.stop_ids())
    );
    let texts = [
        "Hello, world!",
        "  two  spaces\nnew line\n\n\ttab 12345",
        "naïve café — 東京 🚀 emoji",
        "<|im_start|>user\nhi<|im_end|>\n",
    ];
    let messages = [m("user", "What is the capital of France?")];
    let out = python(
        &["tokenizer", saved.to_str().unwrap()],
        &json!({
            "texts": texts,
            "messages": messages.iter().map(|m| json!({"role": m.role, "content": m.content})).collect::<Vec<_>>(),
            "add_generation_prompt": true,
        }),
    );
    for (i, text) in texts.iter().enumerate() {
        assert_eq!(
            out["encode"][i],
            json!(tok.encode(text).unwrap()),
            "{text:?}"
        );
        assert_eq!(again.encode(text).unwrap(), tok.encode(text).unwrap());
    }
    assert_eq!(
        out["chat_text"],
        json!(tok.chat_prompt(&messages, true).unwrap())
    );
    assert_eq!(
        out["chat_ids"],
        json!(tok.chat_prompt_ids(&messages, true).unwrap())
    );
    assert_eq!(out["eos_token_id"], json!(tok.eos));
    assert_eq!(out["pad_token_id"], json!(tok.pad));
}
