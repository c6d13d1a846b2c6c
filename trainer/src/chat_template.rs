//! A checkpoint's chat template (Jinja), rendered with minijinja the way Hugging Face transformers renders
//! it.
//!
//! transformers (5.x, `utils/chat_template_utils.py`) compiles a template in an
//! `ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)` with the `loopcontrols`
//! extension, a `tojson` filter of its own (Python's `json.dumps`, `ensure_ascii=False`, no HTML escaping),
//! and the globals `raise_exception(msg)`, `strftime_now(fmt)`, `dict` and `namespace`. It renders with
//! `messages`, `tools` (None), `documents` (None), `add_generation_prompt`, the tokenizer's named special
//! tokens (`bos_token`, `eos_token`, `unk_token`, `sep_token`, `pad_token`, `cls_token`, `mask_token`, those
//! it has) and any extra keyword arguments (Qwen3's `enable_thinking`). [`ChatTemplate`] sets up the same:
//!
//! - whitespace: `trim_blocks`, `lstrip_blocks`, a single trailing newline of the template dropped;
//! - Python's str/dict/list methods (`.strip()`, `.startswith()`, `.split()`, `.items()`, …) through
//!   minijinja-contrib's `pycompat`; `{% break %}`/`{% continue %}`; dicts keep their insertion order;
//! - values print as Python prints them: `None`, `True`/`False`, floats as `repr` does (`1.0`, `1e-05`),
//!   lists and dicts as their `repr` (strings in quotes);
//! - `tojson(indent=None, separators=None, sort_keys=False, ensure_ascii=False)` writes what
//!   `json.dumps` writes with those arguments (keyword arguments only). minijinja's own `tojson` is not
//!   used: it escapes `<`, `>`, `&` and `'` for HTML, which transformers' filter does not;
//! - `raise_exception(msg)` fails the render with an error carrying `msg`;
//! - `strftime_now(fmt)`: the current time in UTC (transformers uses local time), formatted with the
//!   common C `strftime` directives (`%d %b %Y` is Llama 3.x's); [`ChatTemplate::with_clock`] fixes the time
//!   so a rendering is reproducible.
//!
//! A template is untrusted input (it comes with a checkpoint): compiling or rendering never panics, every
//! failure is an error naming where the template came from and the line, and a render may execute at most
//! [`FUEL`] template instructions (a template cannot loop for ever). Messages carry string content only
//! (no multimodal content lists, no tool calls), so `message.tool_calls` and the like are undefined.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::{SystemTime, UNIX_EPOCH};

use indexmap::IndexMap;
use minijinja::value::{Kwargs, ValueKind};
use minijinja::{AutoEscape, Environment, Error, ErrorKind, Output, State};

/// A template variable: minijinja's value (`Value::from(false)`, or [`parse_json`] for lists and dicts).
pub use minijinja::Value;

use crate::tokenizer::Message;

/// The most template instructions one render may execute.
pub const FUEL: u64 = 50_000_000;

/// The names of the special tokens transformers passes to a chat template (its
/// `SPECIAL_TOKENS_ATTRIBUTES`), in its order.
pub const SPECIAL_TOKEN_NAMES: [&str; 7] = [
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
];

/// The name under which the template is compiled (minijinja's errors carry it).
const NAME: &str = "chat_template";

/// How the error of `raise_exception` begins (its detail; [`Raised`] is its source).
const RAISED: &str = "the template raised an exception: ";

/// The source of the error `raise_exception(msg)` fails a render with: what tells [`describe`] that
/// the template raised it (and then reports the template's own message).
#[derive(Debug)]
struct Raised(String);

impl std::fmt::Display for Raised {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{RAISED}{}", self.0)
    }
}

impl std::error::Error for Raised {}

/// A compiled chat template with the special tokens it is rendered with.
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    origin: String,
    special_tokens: BTreeMap<String, String>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("origin", &self.origin)
            .field("special_tokens", &self.special_tokens)
            .finish_non_exhaustive()
    }
}

impl ChatTemplate {
    /// Compiles `source`. `origin` says where the template came from (a file, a GGUF key) and starts every
    /// error; `special_tokens` maps names such as `bos_token` to their text (see [`SPECIAL_TOKEN_NAMES`]).
    /// A syntax error is an error naming `origin`, the line and the problem.
    pub fn new(
        source: &str,
        origin: &str,
        special_tokens: BTreeMap<String, String>,
    ) -> Result<ChatTemplate, String> {
        let mut env = Environment::new();
        let syntax = minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .keep_trailing_newline(false)
            .build()
            .map_err(|e| describe(origin, &e))?;
        env.set_syntax(syntax);
        env.set_auto_escape_callback(|_| AutoEscape::None);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.set_formatter(python_formatter);
        env.set_fuel(Some(FUEL));
        env.add_filter("tojson", tojson);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_function(None));
        // Jinja2's lexer turns every line end into "\n" before anything else; so does this.
        let normalized = source.replace("\r\n", "\n").replace('\r', "\n");
        env.add_template_owned(NAME, normalized)
            .map_err(|e| format!("{} does not compile: {}", place(origin, &e), problem(&e)))?;
        Ok(ChatTemplate {
            env,
            source: source.to_string(),
            origin: origin.to_string(),
            special_tokens,
        })
    }

    /// The same template with `strftime_now` reading a fixed time (seconds since the Unix epoch, UTC)
    /// instead of the clock, so that renders are reproducible.
    pub fn with_clock(mut self, unix_seconds: i64) -> ChatTemplate {
        self.env
            .add_function("strftime_now", strftime_function(Some(unix_seconds)));
        self
    }

    /// The template text.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Where the template came from, as given to [`ChatTemplate::new`].
    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// The special tokens the template is rendered with.
    pub fn special_tokens(&self) -> &BTreeMap<String, String> {
        &self.special_tokens
    }

    /// The text of `messages` (`{"role", "content"}` dicts, content a string), with the assistant's
    /// header after them when `add_generation_prompt`.
    pub fn render(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
    ) -> Result<String, String> {
        self.render_with(messages, add_generation_prompt, &[])
    }

    /// [`ChatTemplate::render`] with extra template variables, as transformers'
    /// `apply_chat_template(..., **kwargs)` passes them (`("enable_thinking", Value::from(false))` for
    /// Qwen3). They override the special tokens; `tools` and `documents` may be given this way (as
    /// `apply_chat_template(tools=...)` would pass them). `messages` and `add_generation_prompt` may not.
    pub fn render_with(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
        kwargs: &[(&str, Value)],
    ) -> Result<String, String> {
        for (name, _) in kwargs {
            if ["messages", "add_generation_prompt"].contains(name) {
                return Err(format!(
                    "chat template of {}: `{name}` cannot be passed as an extra variable",
                    self.origin
                ));
            }
        }
        let mut context: IndexMap<Value, Value> = self
            .special_tokens
            .iter()
            .map(|(name, text)| (Value::from(name.as_str()), Value::from(text.as_str())))
            .collect();
        let messages: Vec<Value> = messages
            .iter()
            .map(|m| {
                let mut map = IndexMap::new();
                map.insert(Value::from("role"), Value::from(m.role.as_str()));
                map.insert(Value::from("content"), Value::from(m.content.as_str()));
                Value::from(map)
            })
            .collect();
        context.insert(Value::from("messages"), Value::from(messages));
        context.insert(Value::from("tools"), Value::from(()));
        context.insert(Value::from("documents"), Value::from(()));
        context.insert(
            Value::from("add_generation_prompt"),
            Value::from(add_generation_prompt),
        );
        // Later entries win, as `{**special_tokens_map, **kwargs}` does.
        for (name, value) in kwargs {
            context.insert(Value::from(*name), value.clone());
        }
        let template = self
            .env
            .get_template(NAME)
            .map_err(|e| describe(&self.origin, &e))?;
        template
            .render(Value::from(context))
            .map_err(|e| describe(&self.origin, &e))
    }
}

/// A JSON text as a template value, objects keeping the order of their keys (as Python's `json.loads`
/// does, so `tojson` and `.items()` see them in that order).
pub fn parse_json(text: &str) -> Result<Value, String> {
    serde_json::from_str::<Ordered>(text)
        .map(|v| v.0)
        .map_err(|e| format!("invalid JSON: {e}"))
}

/// A template value deserialized in document order.
struct Ordered(Value);

impl<'de> serde::Deserialize<'de> for Ordered {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Ordered, D::Error> {
        deserializer.deserialize_any(OrderedVisitor)
    }
}

struct OrderedVisitor;

impl<'de> serde::de::Visitor<'de> for OrderedVisitor {
    type Value = Ordered;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Ordered, E> {
        Ok(Ordered(Value::from(v)))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Ordered, E> {
        Ok(Ordered(Value::from(v)))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Ordered, E> {
        Ok(Ordered(Value::from(v)))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Ordered, E> {
        Ok(Ordered(Value::from(v)))
    }
    fn visit_str<E>(self, v: &str) -> Result<Ordered, E> {
        Ok(Ordered(Value::from(v)))
    }
    fn visit_unit<E>(self) -> Result<Ordered, E> {
        Ok(Ordered(Value::from(())))
    }
    fn visit_none<E>(self) -> Result<Ordered, E> {
        Ok(Ordered(Value::from(())))
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Ordered, A::Error> {
        let mut items = Vec::new();
        while let Some(Ordered(item)) = seq.next_element()? {
            items.push(item);
        }
        Ok(Ordered(Value::from(items)))
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Ordered, A::Error> {
        let mut entries = IndexMap::new();
        while let Some((key, Ordered(value))) = map.next_entry::<String, Ordered>()? {
            entries.insert(Value::from(key), value);
        }
        Ok(Ordered(Value::from(entries)))
    }
}

/// `chat template of ORIGIN, line N: what went wrong`.
fn describe(origin: &str, error: &Error) -> String {
    format!("{}: {}", place(origin, error), problem(error))
}

/// `chat template of ORIGIN, line N`.
fn place(origin: &str, error: &Error) -> String {
    match error.line() {
        Some(line) => format!("chat template of {origin}, line {line}"),
        None => format!("chat template of {origin}"),
    }
}

/// What went wrong: minijinja's kind and detail (or what `raise_exception` was given), and the cause.
fn problem(error: &Error) -> String {
    let source = std::error::Error::source(error);
    if let Some(raised) = source.and_then(|s| s.downcast_ref::<Raised>()) {
        return raised.to_string();
    }
    let mut out = match error.detail() {
        Some(detail) => format!("{}: {detail}", error.kind()),
        None => error.kind().to_string(),
    };
    if let Some(source) = source {
        let _ = write!(out, " ({source})");
    }
    out
}

fn raise_exception(message: String) -> Result<Value, Error> {
    let raised = Raised(message);
    Err(Error::new(ErrorKind::InvalidOperation, raised.to_string()).with_source(raised))
}

// ---------------------------------------------------------------------------------------------------
// Printing values as Python does.

/// `{{ value }}` as Jinja2 prints it: Python's `str()` (strings as they are, `None`, `True`, lists and
/// dicts as their `repr`), undefined as nothing.
fn python_formatter(out: &mut Output, state: &mut State, value: &Value) -> Result<(), Error> {
    match value.kind() {
        ValueKind::Undefined => Ok(()),
        ValueKind::String => out
            .write_str(value.as_str().unwrap_or(""))
            .map_err(write_error),
        ValueKind::None | ValueKind::Bool | ValueKind::Number | ValueKind::Seq | ValueKind::Map => {
            let mut text = String::new();
            python_repr(value, &mut text)?;
            out.write_str(&text).map_err(write_error)
        }
        _ => minijinja::escape_formatter(out, state, value),
    }
}

fn write_error(_: std::fmt::Error) -> Error {
    Error::new(ErrorKind::WriteFailure, "formatting failed")
}

/// Python's `repr` of a value (close enough for what chat templates print: strings get quotes and
/// escapes for control characters, others characters stay as they are).
fn python_repr(value: &Value, out: &mut String) -> Result<(), Error> {
    match value.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("None"),
        ValueKind::Bool => out.push_str(if value.is_true() { "True" } else { "False" }),
        ValueKind::Number => out.push_str(&python_number(value, false)),
        ValueKind::String => python_str_repr(value.as_str().unwrap_or(""), out),
        ValueKind::Seq => {
            out.push('[');
            for (i, item) in value.try_iter()?.enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                python_repr(&item, out)?;
            }
            out.push(']');
        }
        ValueKind::Map => {
            out.push('{');
            for (i, key) in value.try_iter()?.enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                python_repr(&key, out)?;
                out.push_str(": ");
                python_repr(&value.get_item(&key)?, out)?;
            }
            out.push('}');
        }
        _ => {
            let _ = write!(out, "{value}");
        }
    }
    Ok(())
}

fn python_str_repr(s: &str, out: &mut String) {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push(quote);
}

/// A number as Python writes it (`str()`/`repr()`; `json` spells the non-finite floats differently).
fn python_number(value: &Value, json: bool) -> String {
    if value.is_integer() {
        return value.to_string();
    }
    match f64::try_from(value.clone()) {
        Ok(f) => python_float(f, json),
        Err(_) => value.to_string(),
    }
}

/// Python's `repr(float)`: the shortest digits that round-trip, in positional notation when the decimal
/// exponent is in [-4, 16), else in scientific notation with a signed two-digit exponent.
pub fn python_float(f: f64, json: bool) -> String {
    if f.is_nan() {
        return if json { "NaN" } else { "nan" }.into();
    }
    if f.is_infinite() {
        let text = if json { "Infinity" } else { "inf" };
        return if f < 0.0 {
            format!("-{text}")
        } else {
            text.into()
        };
    }
    // `{:e}` gives the shortest round-trip digits: "-1.2345e-7", "1e16", "0e0".
    let sci = format!("{f:e}");
    let (mantissa, exponent) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exponent: i32 = exponent.parse().unwrap_or(0);
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let point = exponent + 1; // digits before the decimal point
    let body = if (-3..=16).contains(&point) {
        if point <= 0 {
            format!("0.{}{digits}", "0".repeat((-point) as usize))
        } else if point as usize >= digits.len() {
            format!("{digits}{}.0", "0".repeat(point as usize - digits.len()))
        } else {
            format!(
                "{}.{}",
                &digits[..point as usize],
                &digits[point as usize..]
            )
        }
    } else {
        let (first, rest) = digits.split_at(1);
        let rest = if rest.is_empty() {
            String::new()
        } else {
            format!(".{rest}")
        };
        let exp_sign = if exponent < 0 { '-' } else { '+' };
        format!("{first}{rest}e{exp_sign}{:02}", exponent.abs())
    };
    format!("{sign}{body}")
}

// ---------------------------------------------------------------------------------------------------
// tojson: Python's json.dumps.

/// The `tojson` filter of transformers: `json.dumps(value, ensure_ascii=False, indent=None,
/// separators=None, sort_keys=False)`, each settable by keyword.
fn tojson(value: &Value, kwargs: Kwargs) -> Result<Value, Error> {
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    let indent: Option<Value> = kwargs.get("indent")?;
    let separators: Option<Value> = kwargs.get("separators")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    kwargs.assert_all_used()?;
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => Some(match v.as_str() {
            Some(s) => s.to_string(),
            None => {
                let n = i64::try_from(v.clone()).map_err(|_| {
                    Error::new(
                        ErrorKind::InvalidOperation,
                        format!("tojson: indent must be a number or a string, not {v}"),
                    )
                })?;
                " ".repeat(n.max(0) as usize)
            }
        }),
    };
    let (item_sep, key_sep) = match separators {
        Some(v) if !v.is_none() => {
            let parts: Vec<Value> = v.try_iter()?.collect();
            match parts.as_slice() {
                [a, b] if a.as_str().is_some() && b.as_str().is_some() => (
                    a.as_str().unwrap_or_default().to_string(),
                    b.as_str().unwrap_or_default().to_string(),
                ),
                _ => {
                    return Err(Error::new(
                        ErrorKind::InvalidOperation,
                        "tojson: separators must be two strings",
                    ))
                }
            }
        }
        _ => (
            if indent.is_some() { "," } else { ", " }.to_string(),
            ": ".to_string(),
        ),
    };
    let dumper = JsonDumper {
        ensure_ascii: ensure_ascii.unwrap_or(false),
        indent,
        item_sep,
        key_sep,
        sort_keys: sort_keys.unwrap_or(false),
    };
    let mut out = String::new();
    dumper.value(value, 0, &mut out)?;
    Ok(Value::from(out))
}

struct JsonDumper {
    ensure_ascii: bool,
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    sort_keys: bool,
}

impl JsonDumper {
    fn newline(&self, depth: usize, out: &mut String) {
        if let Some(indent) = &self.indent {
            out.push('\n');
            for _ in 0..depth {
                out.push_str(indent);
            }
        }
    }

    fn value(&self, value: &Value, depth: usize, out: &mut String) -> Result<(), Error> {
        if depth > 500 {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                "tojson: the value is nested too deeply",
            ));
        }
        match value.kind() {
            ValueKind::Undefined | ValueKind::None => out.push_str("null"),
            ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
            ValueKind::Number => out.push_str(&python_number(value, true)),
            ValueKind::String => self.string(value.as_str().unwrap_or(""), out),
            ValueKind::Seq | ValueKind::Iterable => {
                let items: Vec<Value> = value.try_iter()?.collect();
                if items.is_empty() {
                    out.push_str("[]");
                    return Ok(());
                }
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push_str(&self.item_sep);
                    }
                    self.newline(depth + 1, out);
                    self.value(item, depth + 1, out)?;
                }
                self.newline(depth, out);
                out.push(']');
            }
            ValueKind::Map => {
                let mut entries: Vec<(String, Value)> = Vec::new();
                for key in value.try_iter()? {
                    let item = value.get_item(&key)?;
                    let key = match key.kind() {
                        ValueKind::String => key.as_str().unwrap_or("").to_string(),
                        ValueKind::None => "null".into(),
                        ValueKind::Bool => if key.is_true() { "true" } else { "false" }.into(),
                        ValueKind::Number => python_number(&key, true),
                        _ => {
                            return Err(Error::new(
                                ErrorKind::InvalidOperation,
                                format!(
                                    "tojson: keys must be str, int, float, bool or None, not {key}"
                                ),
                            ))
                        }
                    };
                    entries.push((key, item));
                }
                if self.sort_keys {
                    entries.sort_by(|a, b| a.0.cmp(&b.0));
                }
                if entries.is_empty() {
                    out.push_str("{}");
                    return Ok(());
                }
                out.push('{');
                for (i, (key, item)) in entries.iter().enumerate() {
                    if i > 0 {
                        out.push_str(&self.item_sep);
                    }
                    self.newline(depth + 1, out);
                    self.string(key, out);
                    out.push_str(&self.key_sep);
                    self.value(item, depth + 1, out)?;
                }
                self.newline(depth, out);
                out.push('}');
            }
            _ => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!("tojson: a {} is not JSON serializable", value.kind()),
                ))
            }
        }
        Ok(())
    }

    fn string(&self, s: &str, out: &mut String) {
        out.push('"');
        for c in s.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                '\u{8}' => out.push_str("\\b"),
                '\u{c}' => out.push_str("\\f"),
                c if (c as u32) < 0x20 => {
                    let _ = write!(out, "\\u{:04x}", c as u32);
                }
                c if self.ensure_ascii && (c as u32) > 0x7e => {
                    let mut units = [0u16; 2];
                    for unit in c.encode_utf16(&mut units) {
                        let _ = write!(out, "\\u{unit:04x}");
                    }
                }
                c => out.push(c),
            }
        }
        out.push('"');
    }
}

// ---------------------------------------------------------------------------------------------------
// strftime_now.

fn strftime_function(
    fixed: Option<i64>,
) -> impl Fn(String) -> Result<Value, Error> + Send + Sync + 'static {
    move |format: String| {
        let seconds = match fixed {
            Some(s) => s,
            None => SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_secs() as i64)
                .unwrap_or(0),
        };
        strftime(&format, seconds).map(Value::from)
    }
}

const WEEKDAYS: [&str; 7] = [
    "Sunday",
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
];
const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];

/// The proleptic Gregorian (year, month 1–12, day 1–31) of a day count since 1970-01-01 (Howard
/// Hinnant's `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

fn is_leap(year: i64) -> bool {
    (year % 4 == 0 && year % 100 != 0) || year % 400 == 0
}

/// `time.strftime(format)` for a UTC time given in seconds since the Unix epoch. Supported: `%a %A %b
/// %B %d %e %H %I %j %m %M %p %S %y %Y %Z %z %F %T %%`, and `-` before a numeric directive to drop its
/// padding (glibc's `%-d`). Another directive is an error naming it.
pub fn strftime(format: &str, unix_seconds: i64) -> Result<String, Error> {
    let days = unix_seconds.div_euclid(86_400);
    let secs = unix_seconds.rem_euclid(86_400);
    let (year, month, day) = civil_from_days(days);
    let (hour, minute, second) = (secs / 3600, secs % 3600 / 60, secs % 60);
    let weekday = (days + 4).rem_euclid(7) as usize; // 1970-01-01 was a Thursday
    let cumulative = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    let yday = cumulative[month as usize - 1] + day as i64 + i64::from(month > 2 && is_leap(year));
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let mut directive = chars.next();
        let no_pad = directive == Some('-');
        if no_pad {
            directive = chars.next();
        }
        let number = |value: i64, width: usize| {
            if no_pad {
                value.to_string()
            } else {
                format!("{value:0width$}")
            }
        };
        let text = match directive {
            Some('a') => WEEKDAYS[weekday][..3].to_string(),
            Some('A') => WEEKDAYS[weekday].to_string(),
            Some('b') | Some('h') => MONTHS[month as usize - 1][..3].to_string(),
            Some('B') => MONTHS[month as usize - 1].to_string(),
            Some('d') => number(day as i64, 2),
            Some('e') if no_pad => day.to_string(),
            Some('e') => format!("{day:>2}"),
            Some('H') => number(hour, 2),
            Some('I') => number((hour + 11) % 12 + 1, 2),
            Some('j') => number(yday, 3),
            Some('m') => number(month as i64, 2),
            Some('M') => number(minute, 2),
            Some('p') => if hour < 12 { "AM" } else { "PM" }.to_string(),
            Some('S') => number(second, 2),
            Some('y') => number(year.rem_euclid(100), 2),
            Some('Y') => year.to_string(),
            Some('Z') => "UTC".to_string(),
            Some('z') => "+0000".to_string(),
            Some('F') => format!("{year}-{month:02}-{day:02}"),
            Some('T') => format!("{hour:02}:{minute:02}:{second:02}"),
            Some('%') => "%".to_string(),
            other => {
                let shown = other.map(|c| format!("%{c}")).unwrap_or_else(|| "%".into());
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!("strftime_now: the directive {shown:?} is not supported"),
                ));
            }
        };
        out.push_str(&text);
    }
    Ok(out)
}
