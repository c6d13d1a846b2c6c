//! Reading a JSONL rollout file into a packed [`Batch`].
//!
//! # The file
//!
//! One JSON object per non-blank line, one line per response. The key `"group"` (a string or an integer,
//! required) names the prompt; the responses with the same `"group"` value form a group. Groups are
//! ordered by their first appearance, the responses of a group keep their file order. Every other key is
//! a recipe input, by name; keys the recipe does not declare are ignored with one warning. A key given
//! twice in one object is an error (no "last wins"); the file is UTF-8 ([`decode`] names the line of
//! an invalid byte).
//!
//! # Response length
//!
//! A response's tokens are the values its token arrays list; a mask is a weight, never a marker of
//! which tokens exist. A padded line says where the response ends with `"response_mask"` (0/1: 1 on
//! each token, then 0 on padding; a 0 before a 1 is an error) or `"length"` (its token count): every
//! token-level value of the line is cut to that length. Without either, a line whose mask
//! ([`is_mask_key`]: `mask`, `*_mask`, declared or not) ends with 0 is refused rather than read with
//! a guessed length. `"length"` also gives the token count of a line without token arrays;
//! [`Rollouts::unknown_length`] records a line with neither.
//!
//! | input type | value on a line |
//! |---|---|
//! | `T` (batch level) | a number (or boolean); the same on every line |
//! | `T[group]` | a number (or boolean); the same on every line of the group |
//! | `T[resp]` | a number (or boolean) |
//! | `T[tok]` | an array, one element per token; all token arrays of a line have the same length, the response's token count (0 when the recipe has no token-level input) |
//! | `T[pair]` | an array of `n − 1` values, `n` the group's response count: the value of the pair (this response, j) for each other response j of the group, in the group's order (file order), this response left out |
//! | `T[resp, crit]` | an array of the group's criterion count `C_g` |
//! | `T[group, crit]` | an array of length `C_g`; the same on every line of the group |
//! | `T[L, dim]` | an array of length `D`, one `D` for the whole file |
//! | `T[L, rubric]` | an array in the rubric's criterion order, or an object keyed by criterion name (all criteria, no others) |
//! | `T[L, A, B]` (a matrix) | an array of rows (one per element of axis A: D for `dim`, a rubric's K in criterion order), each an array of B's length; `dim, dim` is square |
//!
//! Element types: `f32` takes any finite number, `i32` integers (`1.0` is fine, `1.5` is not), `bool`
//! `true`/`false` or `0`/`1`. Values are stored as `f64` (`true` is 1). A missing input takes its
//! declared default (repeated to the length the line needs), else it is an error. Bare `NaN`,
//! `Infinity` and `-Infinity` (as Python's `json` writes them) and numbers too large for `f64` are
//! reported as errors naming the line and key.
//!
//! # Element order (a contract with the interpreter)
//!
//! `Batch::inputs[i]` holds recipe input `i`, flat, in this order. With `G` groups, `R` responses in
//! packed order (groups in order, the responses of each group in order), `T` tokens (the tokens of the
//! packed responses, concatenated), `C_g` criteria of group `g` and `D` dimensions:
//!
//! | type | length | order |
//! |---|---|---|
//! | batch | 1 | |
//! | `[group]` | G | groups |
//! | `[resp]` | R | packed responses |
//! | `[tok]` | T | tokens of packed responses, concatenated |
//! | `[pair]` | Σ_g n_g(n_g − 1) | for each packed response i, its line's n_g − 1 values (the pairs (i, j), j ≠ i in group order) |
//! | `[group, crit]` | Σ_g C_g | for each group, its C_g criteria |
//! | `[resp, crit]` | Σ_r C_{g(r)} | for each packed response, its group's C_g criteria |
//! | `[L, dim]` | size(L) × D | row-major: for each element of level L, its D values |
//! | `[L, rubric]` with K criteria | size(L) × K | row-major, criteria in declaration order |
//! | `[L, A, B]` | size(L) × \|A\| × \|B\| | for each element of level L, its rows in order, each row's values in order |
//!
//! size(batch) = 1, size(group) = G, size(resp) = R. `Layout::crit_offsets` are the prefix sums of the
//! per-group criterion counts (all zero when the recipe has no `crit` input) and `Layout::dim` is `D`
//! (0 when the recipe has no `dim` input). `rlx_core::Sizes` computes these lengths; [`validate_batch`]
//! checks a batch against them.

use std::borrow::Cow;
use std::cell::RefCell;
use std::collections::HashMap;
use std::fmt;

use rlx_core::{Elem, Feature, HasSignature, Level, Signature};
use serde::de::{DeserializeSeed, Deserializer, Error as _, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

use crate::batch::{Batch, Layout};

/// The key that names a response's group (prompt).
pub const GROUP_KEY: &str = "group";

/// The key of a padded line's response mask: 1 on each token of the response, then 0 on padding.
pub const RESPONSE_MASK_KEY: &str = "response_mask";

/// The key of a response's token count, when its token arrays are padded or absent.
pub const LENGTH_KEY: &str = "length";

/// The most tokens `length` may give one response, and all responses whose tokens no array lists
/// (their token-level inputs are defaults, allocated here): a typo cannot exhaust memory.
pub const MAX_LENGTH: usize = 1 << 20;
const MAX_UNLISTED_TOKENS: usize = 1 << 26;

/// Whether a key names a mask (`mask`, `completion_mask`, `loss_mask`, …): a weight per token, which
/// rlx never reads as "this token exists", so one that ends with 0 makes a line ambiguous.
pub fn is_mask_key(key: &str) -> bool {
    key == "mask" || key.ends_with("_mask")
}

/// A parsed rollout file.
#[derive(Clone, Debug, PartialEq)]
pub struct Rollouts {
    pub batch: Batch,
    /// Each group's `"group"` value as given, in group order.
    pub groups: Vec<Value>,
    /// For each packed response, the 0-based index of its line among the file's non-blank lines.
    pub line_of_response: Vec<usize>,
    /// Things worth telling the user that do not stop the run (e.g. ignored keys).
    pub warnings: Vec<String>,
    /// The first (1-based) line that gives neither a token array nor `length`, so its token count is
    /// unknown (taken as 0): only possible for a recipe without token-level inputs, and an error for
    /// one whose graph reads token counts (`rlx_runtime::score`).
    pub unknown_length: Option<usize>,
}

/// Why a rollout file cannot be read: where (1-based file line, key) and what.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RolloutError {
    pub line: Option<usize>,
    pub key: Option<String>,
    pub message: String,
}

impl RolloutError {
    fn new(line: Option<usize>, key: Option<&str>, message: impl Into<String>) -> RolloutError {
        RolloutError {
            line,
            key: key.map(str::to_string),
            message: message.into(),
        }
    }
}

impl fmt::Display for RolloutError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.line, &self.key) {
            (Some(line), Some(key)) => write!(f, "line {line}, key `{key}`: {}", self.message),
            (Some(line), None) => write!(f, "line {line}: {}", self.message),
            (None, Some(key)) => write!(f, "key `{key}`: {}", self.message),
            (None, None) => f.write_str(&self.message),
        }
    }
}

impl std::error::Error for RolloutError {}

/// Check that `batch` fits `recipe` (`rlx_core::Signature::validate`): a valid layout, one vector per
/// input, each of the length of its shape over the layout.
pub fn validate_batch(batch: &Batch, recipe: &(impl HasSignature + ?Sized)) -> Result<(), String> {
    recipe
        .signature()
        .validate(&batch.layout, batch.inputs.iter().map(Vec::len))
        .map(drop)
        .map_err(|error| error.to_string())
}

// ---------------------------------------------------------------------------------------------------
// Reading

/// What a line gives for one input, before defaults.
enum Axis<'r> {
    /// One value per element of the level (an array at token level).
    Plain,
    Crit,
    Dim,
    Rubric {
        name: &'r str,
        criteria: Vec<&'r str>,
    },
    /// A matrix: rows along the first axis, columns along the second (each `Dim` or `Rubric`).
    Matrix(Box<Axis<'r>>, Box<Axis<'r>>),
}

impl Axis<'_> {
    /// How many values a matrix axis has: a rubric's criteria, else `dim`.
    fn width(&self, dim: usize) -> usize {
        match self {
            Axis::Rubric { criteria, .. } => criteria.len(),
            _ => dim,
        }
    }

    /// The `dim` length a matrix value of `len` numbers implies (None: no `dim` axis, or not whole).
    fn matrix_dim(&self, len: usize) -> Option<usize> {
        let Axis::Matrix(rows, cols) = self else {
            return None;
        };
        match (&**rows, &**cols) {
            (Axis::Dim, Axis::Dim) => (0..=len).find(|d| d * d >= len).filter(|d| d * d == len),
            (Axis::Dim, other) | (other, Axis::Dim) => {
                let k = other.width(0);
                (k > 0 && len.is_multiple_of(k)).then(|| len / k)
            }
            _ => None,
        }
    }
}

struct Slot<'r> {
    name: &'r str,
    elem: Elem,
    level: Level,
    /// The input's type as declared (`f32[resp, style]`), for messages.
    ty: String,
    axis: Axis<'r>,
    default: Option<f64>,
}

impl Slot<'_> {
    /// Whether the value on a line is an array (rather than one number).
    fn is_array(&self) -> bool {
        !matches!(self.axis, Axis::Plain) || matches!(self.level, Level::Tok | Level::Pair)
    }
}

fn slots(signature: &Signature) -> Result<Vec<Slot<'_>>, RolloutError> {
    let mut slots = Vec::with_capacity(signature.inputs.len());
    for input in &signature.inputs {
        let name = input.name.as_str();
        let ty = signature.input_type(input);
        let unsupported = |why: &str| {
            Err(RolloutError::new(
                None,
                Some(name),
                format!("input type {ty} cannot be read from a rollout file: {why}"),
            ))
        };
        if name == GROUP_KEY {
            return unsupported("the key `group` names the response's prompt");
        }
        if name == RESPONSE_MASK_KEY || name == LENGTH_KEY {
            return unsupported(&format!(
                "the key `{name}` says where a padded response ends (docs/formats.md); rename the input"
            ));
        }
        let level = input.shape.level;
        let axis = match &input.shape.feature {
            None => Axis::Plain,
            Some(_) if level == Level::Tok => {
                return unsupported("a token-level value has no feature axis")
            }
            Some(_) if level == Level::Pair => {
                return unsupported("a pair-level value has no feature axis")
            }
            Some(Feature::Crit) if level == Level::Batch => {
                return unsupported("criterion lists are per group")
            }
            Some(Feature::Crit) => Axis::Crit,
            Some(Feature::Dim) => Axis::Dim,
            Some(feature) => match rectangular_axis(signature, feature) {
                Some(axis) => axis,
                None => return unsupported("the recipe does not declare that rubric"),
            },
        };
        slots.push(Slot {
            name,
            elem: input.elem,
            level,
            ty,
            axis,
            default: input.default,
        });
    }
    Ok(slots)
}

/// One response line, parsed.
struct Line {
    /// 1-based line number in the file.
    number: usize,
    group: usize,
    /// Per recipe input: the values given, or `None` where the default applies.
    values: Vec<Option<Vec<f64>>>,
    tokens: usize,
}

/// A rollout file's bytes as text: UTF-8, else an error naming the line and column of the first
/// invalid byte.
pub fn decode(bytes: &[u8]) -> Result<&str, RolloutError> {
    std::str::from_utf8(bytes).map_err(|error| {
        let valid = bytes.get(..error.valid_up_to()).unwrap_or(&[]);
        let line = valid.iter().filter(|&&b| b == b'\n').count() + 1;
        let line_start = valid.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
        RolloutError::new(
            Some(line),
            None,
            format!(
                "invalid UTF-8 at byte {} of the line (a rollout file is UTF-8 text)",
                valid.len() - line_start + 1
            ),
        )
    })
}

/// The largest rollout file read by default (4 GiB): the packed batch it becomes is held in memory
/// whole, so a larger file is refused up front instead of exhausting memory. `RLX_MAX_ROLLOUT_BYTES`
/// sets another bound.
pub const MAX_ROLLOUT_BYTES: u64 = 4 << 30;

/// The bound in force: `RLX_MAX_ROLLOUT_BYTES` (bytes) when set, else [`MAX_ROLLOUT_BYTES`].
pub fn max_rollout_bytes() -> Result<u64, String> {
    match std::env::var("RLX_MAX_ROLLOUT_BYTES") {
        Err(_) => Ok(MAX_ROLLOUT_BYTES),
        Ok(text) => text
            .trim()
            .parse::<u64>()
            .ok()
            .filter(|n| *n > 0)
            .ok_or_else(|| {
                format!("RLX_MAX_ROLLOUT_BYTES = {text:?} is not a positive number of bytes")
            }),
    }
}

/// Read the rollout file at `path` ([`decode`]), at most [`max_rollout_bytes`]; the error names the
/// file.
pub fn read_file(path: &std::path::Path) -> Result<String, String> {
    let limit = max_rollout_bytes()?;
    // Any readable file, a pipe too (`--rollouts <(dump.py)`), read up to one byte past the bound.
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|file| {
            std::io::Read::read_to_end(&mut std::io::Read::take(file, limit + 1), &mut bytes)
        })
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if bytes.len() as u64 > limit {
        return Err(format!(
            "{}: larger than {limit} bytes, the bound on a rollout file (RLX_MAX_ROLLOUT_BYTES sets another)",
            path.display()
        ));
    }
    decode(&bytes)
        .map(str::to_string)
        .map_err(|e| format!("{}: {e}", path.display()))
}

/// Parse a JSONL rollout file (see the module doc) into a packed batch for `recipe`.
pub fn read_rollouts(
    text: &str,
    recipe: &(impl HasSignature + ?Sized),
) -> Result<Rollouts, RolloutError> {
    let signature = recipe.signature();
    let slots = slots(&signature)?;
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let has_tok = slots.iter().any(|s| s.level == Level::Tok);

    let mut lines: Vec<Line> = Vec::new();
    let mut groups: Vec<Value> = Vec::new();
    let mut group_index: HashMap<GroupId, usize> = HashMap::new();
    let mut unknown: Vec<String> = Vec::new();
    // The dim length: (D, input name, line) of the first line that gives a dim-axis input.
    let mut dim: Option<(usize, &str, usize)> = None;
    // Tokens of responses that gave `length` but no token array, and the first line with neither.
    let mut unlisted_tokens = 0usize;
    let mut unknown_length: Option<usize> = None;

    for (index, raw) in text.lines().enumerate() {
        if raw.trim().is_empty() {
            continue;
        }
        let number = index + 1;
        let object = parse_line(raw, number)?;
        if let Some(state) = signature.states.iter().find(|s| object.contains_key(*s)) {
            return Err(RolloutError::new(
                Some(number),
                Some(state),
                format!(
                    "`{state}` is the recipe's `state`, carried across steps: a rollout line cannot set it (`rlx score --state FILE` gives it)"
                ),
            ));
        }

        let group_value = object.get(GROUP_KEY).ok_or_else(|| {
            RolloutError::new(
                Some(number),
                Some(GROUP_KEY),
                "missing key `group` (the prompt this response belongs to)",
            )
        })?;
        let id = group_id(group_value)
            .map_err(|message| RolloutError::new(Some(number), Some(GROUP_KEY), message))?;
        let group = *group_index.entry(id).or_insert_with(|| {
            groups.push(group_value.clone());
            groups.len() - 1
        });

        for key in object.keys() {
            let reserved = [GROUP_KEY, RESPONSE_MASK_KEY, LENGTH_KEY].contains(&key.as_str());
            if !reserved && !slots.iter().any(|s| s.name == key) && !unknown.contains(key) {
                unknown.push(key.clone());
            }
        }
        let explicit = explicit_length(&object, number)?;

        let mut values = Vec::with_capacity(slots.len());
        for slot in &slots {
            let at = |message: String| RolloutError::new(Some(number), Some(slot.name), message);
            match object.get(slot.name) {
                Some(value) => values.push(Some(parse_input(slot, value).map_err(at)?)),
                None if slot.default.is_some() => values.push(None),
                None => {
                    return Err(at(format!(
                        "missing key: the recipe's input `{} : {}` has no default",
                        slot.name, slot.ty
                    )))
                }
            }
        }

        // The token count: every token array of the line agrees.
        let mut tokens: Option<(usize, &str)> = None;
        for (slot, value) in slots.iter().zip(&values) {
            let (Level::Tok, Some(value)) = (slot.level, value) else {
                continue;
            };
            match tokens {
                None => tokens = Some((value.len(), slot.name)),
                Some((len, first)) if len != value.len() => {
                    return Err(RolloutError::new(
                        Some(number),
                        Some(slot.name),
                        format!(
                            "token arrays of one response differ in length: {first} has {len}, {} has {}",
                            slot.name,
                            value.len()
                        ),
                    ));
                }
                Some(_) => {}
            }
        }
        let tokens = match (tokens, explicit) {
            (Some((width, first)), Some(explicit)) => {
                explicit.fits(width, first, number)?;
                // The padding is dropped from every token-level value of the line.
                for (slot, value) in slots.iter().zip(values.iter_mut()) {
                    if let (Level::Tok, Some(value)) = (slot.level, value) {
                        value.truncate(explicit.length);
                    }
                }
                explicit.length
            }
            (Some((width, first)), None) => {
                refuse_padding_masks(&object, width, first, number)?;
                width
            }
            (None, Some(explicit)) => {
                unlisted_tokens = unlisted_tokens.saturating_add(explicit.length);
                if unlisted_tokens > MAX_UNLISTED_TOKENS {
                    return Err(RolloutError::new(
                        Some(number),
                        Some(explicit.key),
                        format!(
                            "the responses whose tokens no array lists add up to more than {MAX_UNLISTED_TOKENS} tokens"
                        ),
                    ));
                }
                explicit.length
            }
            (None, None) if has_tok => {
                let names = names_of(&slots, |s| s.level == Level::Tok);
                let first = slots.iter().find(|s| s.level == Level::Tok).map(|s| s.name);
                return Err(RolloutError::new(
                    Some(number),
                    first,
                    format!(
                        "cannot tell the response's token count: the line gives no token-level input ({names}) and no `length`"
                    ),
                ));
            }
            (None, None) => {
                unknown_length.get_or_insert(number);
                0
            }
        };

        // The dim length: one for the whole file.
        for (slot, value) in slots.iter().zip(&values) {
            let Some(value) = value else {
                continue;
            };
            let given = match &slot.axis {
                Axis::Dim => value.len(),
                axis @ Axis::Matrix(..) => match axis.matrix_dim(value.len()) {
                    Some(d) => d,
                    None => continue,
                },
                _ => continue,
            };
            match dim {
                None => dim = Some((given, slot.name, number)),
                Some((len, first, first_line)) if len != given => {
                    return Err(RolloutError::new(
                        Some(number),
                        Some(slot.name),
                        format!(
                            "the dim length differs: {first} has {len} on line {first_line}, {} has {given} on line {number}",
                            slot.name,
                        ),
                    ));
                }
                Some(_) => {}
            }
        }

        lines.push(Line {
            number,
            group,
            values,
            tokens,
        });
    }

    if lines.is_empty() {
        return Err(RolloutError::new(
            None,
            None,
            "the rollout file has no responses",
        ));
    }

    let dim = match dim {
        Some((len, _, _)) => len,
        None => match slots.iter().find(|s| {
            matches!(s.axis, Axis::Dim)
                || matches!(&s.axis, Axis::Matrix(r, c) if matches!(**r, Axis::Dim) || matches!(**c, Axis::Dim))
        }) {
            Some(slot) => {
                return Err(RolloutError::new(
                    None,
                    Some(slot.name),
                    "cannot tell the dim length: no line gives a dim-axis input",
                ))
            }
            None => 0,
        },
    };

    // Lines of each group, in file order.
    let mut members: Vec<Vec<usize>> = vec![Vec::new(); groups.len()];
    for (index, line) in lines.iter().enumerate() {
        if let Some(list) = members.get_mut(line.group) {
            list.push(index);
        }
    }

    // Criterion counts per group.
    let has_crit = slots.iter().any(|s| matches!(s.axis, Axis::Crit));
    let mut crits: Vec<usize> = Vec::new();
    if has_crit {
        for (group, list) in members.iter().enumerate() {
            let mut count: Option<(usize, &str, usize)> = None;
            for line in list.iter().filter_map(|&i| lines.get(i)) {
                for (slot, value) in slots.iter().zip(&line.values) {
                    let (Axis::Crit, Some(value)) = (&slot.axis, value) else {
                        continue;
                    };
                    match count {
                        None => count = Some((value.len(), slot.name, line.number)),
                        Some((len, first, first_line)) if len != value.len() => {
                            return Err(RolloutError::new(
                                Some(line.number),
                                Some(slot.name),
                                format!(
                                    "the criterion count differs within group {}: {first} has {len} on line {first_line}, {} has {} on line {}",
                                    show_group(&groups, group),
                                    slot.name,
                                    value.len(),
                                    line.number
                                ),
                            ));
                        }
                        Some(_) => {}
                    }
                }
            }
            match count {
                Some((len, _, _)) => crits.push(len),
                None => {
                    let first_line = list.first().and_then(|&i| lines.get(i)).map(|l| l.number);
                    let first = slots
                        .iter()
                        .find(|s| matches!(s.axis, Axis::Crit))
                        .map(|s| s.name);
                    return Err(RolloutError::new(
                        first_line,
                        first,
                        format!(
                            "cannot tell the criterion count of group {}: none of its lines gives a crit-axis input ({})",
                            show_group(&groups, group),
                            names_of(&slots, |s| matches!(s.axis, Axis::Crit))
                        ),
                    ));
                }
            }
        }
    }

    // A pair input lists one value per other response of the line's group.
    let group_sizes: Vec<usize> = members.iter().map(Vec::len).collect();
    for (index, slot) in slots.iter().enumerate() {
        if slot.level != Level::Pair {
            continue;
        }
        for line in &lines {
            let Some(Some(values)) = line.values.get(index) else {
                continue;
            };
            let n = group_sizes.get(line.group).copied().unwrap_or(0);
            if values.len() + 1 != n {
                return Err(RolloutError::new(
                    Some(line.number),
                    Some(slot.name),
                    format!(
                        "pair input `{}` has {} values, but group {} has {n} responses: a pair input lists one value per other response of the group (n − 1 = {}), in the group's order, leaving this response out",
                        slot.name,
                        values.len(),
                        show_group(&groups, line.group),
                        n.saturating_sub(1)
                    ),
                ));
            }
        }
    }

    let sizes = Sizes {
        crits,
        dim,
        group_sizes,
    };
    let value_at = |line, index| value_of(line, index, &slots, &sizes);

    // Group- and batch-level inputs agree across the lines they repeat on.
    let everything: Vec<usize> = (0..lines.len()).collect();
    for (index, slot) in slots.iter().enumerate() {
        let scopes: Vec<(Option<usize>, &[usize])> = match slot.level {
            Level::Group => members
                .iter()
                .enumerate()
                .map(|(g, list)| (Some(g), list.as_slice()))
                .collect(),
            Level::Batch => vec![(None, everything.as_slice())],
            Level::Resp | Level::Tok | Level::Pair => continue,
        };
        for (group, list) in scopes {
            let mut rows = list.iter().filter_map(|&i| lines.get(i));
            let Some(first) = rows.next() else { continue };
            let reference = value_at(first, index);
            for line in rows {
                let here = value_at(line, index);
                if !same(&reference, &here) {
                    let show = |values: &[f64], line: &Line| {
                        let defaulted = matches!(line.values.get(index), Some(None));
                        format!(
                            "{}{} on line {}",
                            show_values(slot, values),
                            if defaulted { " (the default)" } else { "" },
                            line.number
                        )
                    };
                    let message = match group {
                        Some(group) => format!(
                            "group-level input `{}` differs within group {}: {}, {}",
                            slot.name,
                            show_group(&groups, group),
                            show(&reference, first),
                            show(&here, line)
                        ),
                        None => format!(
                            "batch-level input `{}` differs between lines: {}, {}",
                            slot.name,
                            show(&reference, first),
                            show(&here, line)
                        ),
                    };
                    return Err(RolloutError::new(
                        Some(line.number),
                        Some(slot.name),
                        message,
                    ));
                }
            }
        }
    }

    // Pack.
    let order: Vec<usize> = members.iter().flatten().copied().collect();
    let responses_per_group: Vec<usize> = members.iter().map(Vec::len).collect();
    let tokens_per_response: Vec<usize> = order
        .iter()
        .filter_map(|&i| lines.get(i))
        .map(|line| line.tokens)
        .collect();
    let layout = Layout::from_counts(
        &responses_per_group,
        &tokens_per_response,
        &sizes.crits,
        sizes.dim,
    )
    .map_err(|error| RolloutError::new(None, None, format!("internal error: {error}")))?;

    let mut inputs = Vec::with_capacity(slots.len());
    for (index, slot) in slots.iter().enumerate() {
        let rows: Vec<&Line> = match slot.level {
            Level::Batch => lines.first().into_iter().collect(),
            Level::Group => members
                .iter()
                .filter_map(|list| list.first().and_then(|&i| lines.get(i)))
                .collect(),
            Level::Resp | Level::Tok | Level::Pair => {
                order.iter().filter_map(|&i| lines.get(i)).collect()
            }
        };
        let mut flat = Vec::new();
        for line in rows {
            flat.extend_from_slice(&value_at(line, index));
        }
        inputs.push(flat);
    }

    // Every non-blank line is a response, so indices into `lines` are line indices among non-blank lines.
    let line_of_response = order.clone();

    let mut warnings = Vec::new();
    if !unknown.is_empty() {
        warnings.push(format!(
            "ignored keys not used by the recipe: {}",
            unknown.join(", ")
        ));
    }

    // The reader built every column for the layout; the recipe's signature is the one judge of that.
    signature
        .validate(&layout, inputs.iter().map(Vec::len))
        .map_err(|e| RolloutError::new(None, None, format!("internal error: {e}")))?;
    Ok(Rollouts {
        batch: Batch { layout, inputs },
        groups,
        line_of_response,
        warnings,
        unknown_length,
    })
}

/// A line's own account of its token count: `response_mask` or `length` (both: they must agree).
struct Explicit {
    length: usize,
    /// The key it came from (`response_mask` when given, for messages about its width).
    key: &'static str,
    /// The values `response_mask` listed (padding included), when given.
    mask_width: Option<usize>,
}

impl Explicit {
    /// Check against the width `width` of the line's token arrays (of which `first` is one).
    fn fits(&self, width: usize, first: &str, number: usize) -> Result<(), RolloutError> {
        if let Some(mask_width) = self.mask_width {
            if mask_width != width {
                return Err(RolloutError::new(
                    Some(number),
                    Some(RESPONSE_MASK_KEY),
                    format!(
                        "`response_mask` has {mask_width} values but the token arrays have {width} ({first})"
                    ),
                ));
            }
        } else if self.length > width {
            return Err(RolloutError::new(
                Some(number),
                Some(LENGTH_KEY),
                format!(
                    "`length` is {} but the token arrays have only {width} values ({first})",
                    self.length
                ),
            ));
        }
        Ok(())
    }
}

/// Read `response_mask` and `length` from a line (see the module doc).
fn explicit_length(
    object: &Map<String, Value>,
    number: usize,
) -> Result<Option<Explicit>, RolloutError> {
    let mut from_mask = None;
    if let Some(value) = object.get(RESPONSE_MASK_KEY) {
        let at =
            |message: String| RolloutError::new(Some(number), Some(RESPONSE_MASK_KEY), message);
        let Value::Array(items) = value else {
            return Err(at(format!(
                "expected an array of 0/1 (1 on each token of the response, then 0 on padding), found {}",
                describe(value)
            )));
        };
        let mut length = 0;
        for (index, item) in items.iter().enumerate() {
            let one = parse_elem(item, Elem::Bool)
                .map_err(|e| at(format!("element {index}: {e}")))?
                != 0.0;
            if one && length < index {
                return Err(at(format!(
                    "element {index} is 1 after a 0 at element {length}: `response_mask` is 1 on each token of the response, then 0 on padding; a weight of the response's own tokens belongs in an input such as `mask`"
                )));
            }
            if one {
                length += 1;
            }
        }
        from_mask = Some((length, items.len()));
    }
    let mut from_length = None;
    if let Some(value) = object.get(LENGTH_KEY) {
        let at = |message: String| RolloutError::new(Some(number), Some(LENGTH_KEY), message);
        let length = match value.as_u64() {
            Some(n) => n,
            None => match value.as_f64() {
                Some(x) if x >= 0.0 && x.fract() == 0.0 => x as u64,
                _ => {
                    return Err(at(format!(
                        "expected the response's token count (a whole number ≥ 0), found {}",
                        describe(value)
                    )))
                }
            },
        };
        if length > MAX_LENGTH as u64 {
            return Err(at(format!(
                "{length} tokens is more than the {MAX_LENGTH} a response may have"
            )));
        }
        from_length = Some(length as usize);
    }
    Ok(match (from_mask, from_length) {
        (Some((masked, _)), Some(length)) if masked != length => {
            return Err(RolloutError::new(
                Some(number),
                Some(LENGTH_KEY),
                format!("`length` is {length} but `response_mask` has {masked} ones"),
            ))
        }
        (Some((length, width)), _) => Some(Explicit {
            length,
            key: RESPONSE_MASK_KEY,
            mask_width: Some(width),
        }),
        (None, Some(length)) => Some(Explicit {
            length,
            key: LENGTH_KEY,
            mask_width: None,
        }),
        (None, None) => None,
    })
}

/// Without `response_mask` or `length`, a line's token count is its token arrays' width; a mask that
/// ends with 0 there may mark padding, so rlx refuses to guess (docs/formats.md).
fn refuse_padding_masks(
    object: &Map<String, Value>,
    width: usize,
    first: &str,
    number: usize,
) -> Result<(), RolloutError> {
    for (key, value) in object {
        let Value::Array(items) = value else { continue };
        let ends_with_zero = match items.last() {
            Some(Value::Bool(b)) => !b,
            Some(Value::Number(n)) => n.as_f64() == Some(0.0),
            _ => false,
        };
        if is_mask_key(key) && ends_with_zero {
            return Err(RolloutError::new(
                Some(number),
                Some(key),
                format!(
                    "`{key}` ends with 0, so the response may be padded, and rlx does not guess its length: a response's tokens are all the values its token arrays list ({width} in {first}) and a mask is only a weight. Add `\"{RESPONSE_MASK_KEY}\": [1, …, 1, 0, …]` (1 on each token of the response, 0 on padding) or `\"{LENGTH_KEY}\": N`; if all {width} tokens are real, add `\"{LENGTH_KEY}\": {width}`"
                ),
            ));
        }
    }
    Ok(())
}

/// The reader's axis for a `dim`, rubric or matrix feature (`None`: an undeclared rubric).
fn rectangular_axis<'r>(signature: &'r Signature, feature: &'r Feature) -> Option<Axis<'r>> {
    Some(match feature {
        Feature::Crit => Axis::Crit,
        Feature::Dim => Axis::Dim,
        Feature::Rubric { index, .. } => {
            let found = signature.rubrics.get(*index as usize)?;
            Axis::Rubric {
                name: &found.name,
                criteria: found.criteria.iter().map(String::as_str).collect(),
            }
        }
        Feature::Matrix { rows, cols } => Axis::Matrix(
            Box::new(rectangular_axis(signature, rows)?),
            Box::new(rectangular_axis(signature, cols)?),
        ),
    })
}

/// The data-given axis lengths: criteria per group (empty without a `crit` input) and `dim`.
struct Sizes {
    crits: Vec<usize>,
    dim: usize,
    /// Responses per group.
    group_sizes: Vec<usize>,
}

impl Sizes {
    /// The length input `slot`'s value must have on a line of group `group` with `tokens` tokens.
    fn needed(&self, slot: &Slot, group: usize, tokens: usize) -> usize {
        match &slot.axis {
            Axis::Plain if slot.level == Level::Tok => tokens,
            Axis::Plain if slot.level == Level::Pair => self
                .group_sizes
                .get(group)
                .copied()
                .unwrap_or(0)
                .saturating_sub(1),
            Axis::Plain => 1,
            Axis::Crit => self.crits.get(group).copied().unwrap_or(0),
            Axis::Dim => self.dim,
            Axis::Rubric { criteria, .. } => criteria.len(),
            Axis::Matrix(rows, cols) => rows.width(self.dim) * cols.width(self.dim),
        }
    }
}

/// Input `index` on `line`: as given, or its default repeated to the needed length.
fn value_of<'l>(line: &'l Line, index: usize, slots: &[Slot], sizes: &Sizes) -> Cow<'l, [f64]> {
    match (line.values.get(index), slots.get(index)) {
        (Some(Some(values)), _) => Cow::Borrowed(values.as_slice()),
        (_, Some(slot)) => {
            let len = sizes.needed(slot, line.group, line.tokens);
            Cow::Owned(vec![slot.default.unwrap_or(0.0); len])
        }
        (_, None) => Cow::Owned(Vec::new()),
    }
}

fn names_of(slots: &[Slot], keep: impl Fn(&Slot) -> bool) -> String {
    slots
        .iter()
        .filter(|s| keep(s))
        .map(|s| s.name)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Exact agreement (values are finite, so `==` is exact; 0 and -0 agree).
fn same(a: &[f64], b: &[f64]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x == y)
}

fn show_group(groups: &[Value], group: usize) -> String {
    groups
        .get(group)
        .map_or_else(|| format!("#{group}"), Value::to_string)
}

fn show_number(elem: Elem, x: f64) -> String {
    if elem == Elem::Bool {
        return if x != 0.0 { "true" } else { "false" }.to_string();
    }
    if x == x.trunc() && x.abs() < 1e16 {
        format!("{x}")
    } else {
        format!("{x:?}")
    }
}

fn show_values(slot: &Slot, values: &[f64]) -> String {
    let elem = slot.elem;
    if !slot.is_array() {
        if let [x] = values {
            return show_number(elem, *x);
        }
    }
    let shown: Vec<String> = values.iter().map(|&x| show_number(elem, x)).collect();
    format!("[{}]", shown.join(", "))
}

/// The identity of a group value: strings and integers are different groups even when they print alike.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum GroupId {
    Str(String),
    Int(i128),
}

fn group_id(value: &Value) -> Result<GroupId, String> {
    match value {
        Value::String(s) => match sentinel(s) {
            Some(text) => Err(format!(
                "expected a string or an integer, found {}",
                non_finite(text)
            )),
            None => Ok(GroupId::Str(s.clone())),
        },
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                Ok(GroupId::Int(i128::from(i)))
            } else if let Some(u) = n.as_u64() {
                Ok(GroupId::Int(i128::from(u)))
            } else {
                Err(format!(
                    "expected a string or an integer, found the number {n}"
                ))
            }
        }
        other => Err(format!(
            "expected a string or an integer, found {}",
            describe(other)
        )),
    }
}

// ---------------------------------------------------------------------------------------------------
// Values

fn elem_noun(elem: Elem) -> &'static str {
    match elem {
        Elem::F32 => "a number",
        Elem::I32 => "an integer",
        Elem::Bool => "a boolean",
    }
}

fn array_noun(elem: Elem) -> &'static str {
    match elem {
        Elem::F32 => "an array of numbers",
        Elem::I32 => "an array of integers",
        Elem::Bool => "an array of booleans",
    }
}

/// What a JSON value is, for messages.
fn describe(value: &Value) -> String {
    match value {
        Value::Null => "null".into(),
        Value::Bool(_) => "a boolean".into(),
        Value::Number(n) => format!("the number {n}"),
        Value::String(s) => match sentinel(s) {
            Some(text) => non_finite(text),
            None => "a string".into(),
        },
        Value::Array(_) => "an array".into(),
        Value::Object(_) => "an object".into(),
    }
}

/// One element of type `elem`.
fn parse_elem(value: &Value, elem: Elem) -> Result<f64, String> {
    match value {
        Value::Number(n) => {
            let Some(x) = n.as_f64().filter(|x| x.is_finite()) else {
                return Err(format!("number {n} is out of range for f64"));
            };
            match elem {
                _ if elem.admits(x) => Ok(x),
                Elem::I32 if x.fract() != 0.0 => Err(format!("expected an integer, found {n}")),
                Elem::I32 => Err(format!("integer {n} is out of range for i32")),
                // `f32` admits every finite number.
                Elem::Bool | Elem::F32 => {
                    Err(format!("expected a boolean (true/false or 0/1), found {n}"))
                }
            }
        }
        Value::Bool(b) if elem == Elem::Bool => Ok(if *b { 1.0 } else { 0.0 }),
        Value::String(s) if sentinel(s).is_some() => Err(describe(value)),
        other => Err(format!(
            "expected {}, found {}",
            elem_noun(elem),
            describe(other)
        )),
    }
}

fn parse_array(value: &Value, elem: Elem) -> Result<Vec<f64>, String> {
    match value {
        Value::Array(items) => items
            .iter()
            .enumerate()
            .map(|(i, item)| parse_elem(item, elem).map_err(|e| format!("element {i}: {e}")))
            .collect(),
        other => Err(format!(
            "expected {}, found {}",
            array_noun(elem),
            describe(other)
        )),
    }
}

/// A matrix value: an array of rows, each an array of the same length; a rubric axis has exactly
/// its criterion count, `dim` on both axes is square (its length is checked against the file's `dim`
/// like a vector's). Flattened row-major.
fn parse_matrix(value: &Value, elem: Elem, rows: &Axis, cols: &Axis) -> Result<Vec<f64>, String> {
    let Value::Array(items) = value else {
        return Err(format!(
            "expected a matrix (an array of rows, each {}), found {}",
            array_noun(elem),
            describe(value)
        ));
    };
    if let Axis::Rubric { name, criteria } = rows {
        if items.len() != criteria.len() {
            return Err(format!(
                "expected {} rows, one per criterion of rubric `{name}` ({}), found {}",
                criteria.len(),
                criteria.join(", "),
                items.len()
            ));
        }
    }
    let mut flat = Vec::new();
    let mut width = None;
    for (i, row) in items.iter().enumerate() {
        let values = parse_array(row, elem).map_err(|e| format!("row {i}: {e}"))?;
        if let Axis::Rubric { name, criteria } = cols {
            if values.len() != criteria.len() {
                return Err(format!(
                    "row {i}: expected {} values, one per criterion of rubric `{name}` ({}), found {}",
                    criteria.len(),
                    criteria.join(", "),
                    values.len()
                ));
            }
        }
        match width {
            None => width = Some(values.len()),
            Some(w) if w != values.len() => {
                return Err(format!(
                    "row {i} has {} values and row 0 has {w}: a matrix's rows have one length",
                    values.len()
                ))
            }
            Some(_) => {}
        }
        flat.extend(values);
    }
    if matches!((rows, cols), (Axis::Dim, Axis::Dim)) && width.unwrap_or(0) != items.len() {
        return Err(format!(
            "a `dim, dim` matrix is square: {} rows of {} values",
            items.len(),
            width.unwrap_or(0)
        ));
    }
    Ok(flat)
}

fn parse_input(slot: &Slot, value: &Value) -> Result<Vec<f64>, String> {
    let elem = slot.elem;
    match &slot.axis {
        Axis::Plain if matches!(slot.level, Level::Tok | Level::Pair) => {
            parse_array(value, elem)
        }
        Axis::Plain => parse_elem(value, elem).map(|x| vec![x]),
        Axis::Crit | Axis::Dim => parse_array(value, elem),
        Axis::Matrix(rows, cols) => parse_matrix(value, elem, rows, cols),
        Axis::Rubric { name, criteria } => match value {
            Value::Array(items) => {
                if items.len() != criteria.len() {
                    return Err(format!(
                        "expected {} values, one per criterion of rubric `{name}` ({}), found {}",
                        criteria.len(),
                        criteria.join(", "),
                        items.len()
                    ));
                }
                parse_array(value, elem)
            }
            Value::Object(map) => {
                if let Some(extra) = map.keys().find(|k| !criteria.contains(&k.as_str())) {
                    return Err(format!(
                        "unknown criterion `{extra}` of rubric `{name}` (its criteria: {})",
                        criteria.join(", ")
                    ));
                }
                criteria
                    .iter()
                    .map(|criterion| match map.get(*criterion) {
                        Some(item) => parse_elem(item, elem)
                            .map_err(|e| format!("criterion `{criterion}`: {e}")),
                        None => Err(format!(
                            "missing criterion `{criterion}` of rubric `{name}`"
                        )),
                    })
                    .collect()
            }
            other => Err(format!(
                "expected {} in the criterion order of rubric `{name}` or an object keyed by criterion, found {}",
                array_noun(elem),
                describe(other)
            )),
        },
    }
}

// ---------------------------------------------------------------------------------------------------
// Lines: non-finite tokens, JSON

/// Marks a string that stood for a bare non-finite or out-of-range number token.
const SENTINEL: &str = "\u{0}rlx-number:";

fn sentinel(s: &str) -> Option<&str> {
    s.strip_prefix(SENTINEL)
}

fn non_finite(text: &str) -> String {
    match text {
        "NaN" | "Infinity" | "-Infinity" => format!("non-finite value {text}"),
        _ => format!("number {text} is out of range for f64"),
    }
}

/// A replaced token: where it was in the original line, its length there and in the sanitized line.
struct Edit {
    start: usize,
    old_len: usize,
    new_len: usize,
}

fn is_word_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// Replace bare `NaN`, `Infinity`, `-Infinity` and numbers beyond f64 outside strings by sentinel strings.
fn sanitize(line: &str) -> (Cow<'_, str>, Vec<Edit>) {
    let bytes = line.as_bytes();
    let mut out = String::new();
    let mut copied = 0;
    let mut edits = Vec::new();
    let mut replace = |out: &mut String, start: usize, end: usize| {
        out.push_str(line.get(copied..start).unwrap_or(""));
        let token = line.get(start..end).unwrap_or("");
        let before = out.len();
        out.push_str("\"\\u0000");
        out.push_str(SENTINEL.get(1..).unwrap_or(""));
        out.push_str(token);
        out.push('"');
        edits.push(Edit {
            start,
            old_len: end - start,
            new_len: out.len() - before,
        });
        copied = end;
    };
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'"' => {
                i += 1;
                while i < bytes.len() {
                    match bytes[i] {
                        b'\\' => i += 2,
                        b'"' => {
                            i += 1;
                            break;
                        }
                        _ => i += 1,
                    }
                }
            }
            b'-' | b'0'..=b'9' => {
                let start = i;
                let rest = bytes.get(i + 1..).unwrap_or(&[]);
                if bytes[i] == b'-'
                    && rest.starts_with(b"Infinity")
                    && !rest.get(8).is_some_and(|&b| is_word_byte(b))
                {
                    i += 9;
                    replace(&mut out, start, i);
                    continue;
                }
                i += 1;
                while i < bytes.len()
                    && matches!(bytes[i], b'0'..=b'9' | b'.' | b'e' | b'E' | b'+' | b'-')
                {
                    i += 1;
                }
                let token = line.get(start..i).unwrap_or("");
                let may_overflow = token.len() > 300 || token.contains(['e', 'E']);
                if may_overflow && token.parse::<f64>().is_ok_and(f64::is_infinite) {
                    replace(&mut out, start, i);
                }
            }
            b if b.is_ascii_alphabetic() || b == b'_' => {
                let start = i;
                while i < bytes.len() && is_word_byte(bytes[i]) {
                    i += 1;
                }
                if matches!(line.get(start..i), Some("NaN" | "Infinity")) {
                    replace(&mut out, start, i);
                }
            }
            _ => i += 1,
        }
    }
    if edits.is_empty() {
        return (Cow::Borrowed(line), edits);
    }
    out.push_str(line.get(copied..).unwrap_or(""));
    (Cow::Owned(out), edits)
}

/// Map a 1-based byte column of the sanitized line back to the original line.
fn original_column(column: usize, edits: &[Edit]) -> usize {
    let position = column.saturating_sub(1);
    let mut delta: isize = 0;
    for edit in edits {
        let start = edit.start.saturating_add_signed(delta);
        if position < start {
            break;
        }
        if position < start + edit.new_len {
            return edit.start + 1;
        }
        delta += edit.new_len as isize - edit.old_len as isize;
    }
    position.saturating_add_signed(-delta) + 1
}

/// A key given twice in one JSON object: (the line's top-level key it is under, if nested; the key).
type Duplicate = RefCell<Option<(Option<String>, String)>>;

/// Deserializes a JSON value like `serde_json::Value`, but a key given twice in one object is an error
/// (recorded in `duplicate`) rather than "last wins".
struct Strict<'d> {
    duplicate: &'d Duplicate,
    /// The top-level key this value is under (`None` for the line itself).
    under: Option<&'d str>,
}

impl<'de> DeserializeSeed<'de> for Strict<'_> {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Strict<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, b: bool) -> Result<Value, E> {
        Ok(Value::Bool(b))
    }

    fn visit_i64<E>(self, i: i64) -> Result<Value, E> {
        Ok(Value::from(i))
    }

    fn visit_u64<E>(self, u: u64) -> Result<Value, E> {
        Ok(Value::from(u))
    }

    fn visit_f64<E>(self, x: f64) -> Result<Value, E> {
        Ok(serde_json::Number::from_f64(x).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E>(self, s: &str) -> Result<Value, E> {
        Ok(Value::String(s.to_string()))
    }

    fn visit_string<E>(self, s: String) -> Result<Value, E> {
        Ok(Value::String(s))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(4096));
        while let Some(item) = seq.next_element_seed(Strict {
            duplicate: self.duplicate,
            under: self.under,
        })? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut object = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if object.contains_key(&key) {
                let error = A::Error::custom(format!("duplicate key `{key}`"));
                *self.duplicate.borrow_mut() = Some((self.under.map(str::to_string), key));
                return Err(error);
            }
            let value = map.next_value_seed(Strict {
                duplicate: self.duplicate,
                under: Some(self.under.unwrap_or(&key)),
            })?;
            object.insert(key, value);
        }
        Ok(Value::Object(object))
    }
}

/// Parse one line as JSON: [`Strict`] (duplicate keys are errors), the whole line one value.
fn parse_strict(text: &str, duplicate: &Duplicate) -> Result<Value, serde_json::Error> {
    let mut deserializer = serde_json::Deserializer::from_str(text);
    let value = Strict {
        duplicate,
        under: None,
    }
    .deserialize(&mut deserializer)?;
    deserializer.end()?;
    Ok(value)
}

fn parse_line(raw: &str, number: usize) -> Result<Map<String, Value>, RolloutError> {
    let (text, edits) = sanitize(raw);
    let duplicate = Duplicate::default();
    let parsed = parse_strict(&text, &duplicate);
    if let Some((under, key)) = duplicate.into_inner() {
        let message = match &under {
            None => format!("duplicate key `{key}`: a key may appear once per line (JSON readers disagree on which copy counts)"),
            Some(top) => format!("duplicate key `{key}` in the object of `{top}`: a key may appear once per object"),
        };
        return Err(RolloutError::new(
            Some(number),
            Some(under.as_deref().unwrap_or(&key)),
            message,
        ));
    }
    match parsed {
        Ok(Value::Object(object)) => Ok(object),
        Ok(other) => Err(RolloutError::new(
            Some(number),
            None,
            format!("expected a JSON object, found {}", describe(&other)),
        )),
        Err(error) => {
            let full = error.to_string();
            let message = if error.line() == 0 {
                full
            } else {
                let suffix = format!(" at line {} column {}", error.line(), error.column());
                let what = full.strip_suffix(&suffix).unwrap_or(&full);
                format!(
                    "{what} at column {}",
                    original_column(error.column(), &edits)
                )
            };
            Err(RolloutError::new(
                Some(number),
                None,
                format!("invalid JSON: {message}"),
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sanitize_replaces_bare_tokens_outside_strings_only() {
        let (text, edits) =
            sanitize(r#"{"a": NaN, "b": [Infinity, -Infinity], "c": "NaN", "d": 1e999}"#);
        assert_eq!(edits.len(), 4);
        let value: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(value["a"].as_str().and_then(sentinel), Some("NaN"));
        assert_eq!(value["b"][1].as_str().and_then(sentinel), Some("-Infinity"));
        assert_eq!(value["c"], "NaN");
        assert_eq!(value["d"].as_str().and_then(sentinel), Some("1e999"));
        let (same, none) = sanitize(r#"{"a": [1, -2.5e3, true], "b": "x\"NaN"}"#);
        assert!(none.is_empty());
        assert!(matches!(same, Cow::Borrowed(_)));
    }

    #[test]
    fn columns_map_back_across_replacements() {
        let raw = r#"{"a": NaN, "b": }"#;
        let (text, edits) = sanitize(raw);
        let error = serde_json::from_str::<Value>(&text).unwrap_err();
        let column = original_column(error.column(), &edits);
        assert_eq!(&raw[column - 1..column], "}");
    }

    #[test]
    fn a_broken_layout_is_an_error_not_a_panic() {
        let layout = Layout {
            group_offsets: vec![],
            token_offsets: vec![3, 1],
            crit_offsets: vec![5],
            dim: usize::MAX,
        };
        for level in Level::ALL {
            for feature in [None, Some(Feature::Crit), Some(Feature::Dim)] {
                let signature = Signature {
                    inputs: vec![rlx_core::InputInfo {
                        name: "x".into(),
                        elem: Elem::F32,
                        shape: rlx_core::Shape { level, feature },
                        differentiable: false,
                        default: None,
                    }],
                    ..Signature::default()
                };
                let batch = Batch {
                    layout: layout.clone(),
                    inputs: vec![Vec::new()],
                };
                assert!(validate_batch(&batch, &signature).is_err());
            }
        }
    }
}
