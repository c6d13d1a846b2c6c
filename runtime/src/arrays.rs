//! A batch from arrays, as a Python trainer holds it (the binding's `Recipe.score(**arrays)` and
//! `Recipe.torch()`, docs/python.md): one array per recipe input, either in the packed layout or
//! padded with the true token counts given explicitly, checked here and laid out for the kernel.
//!
//! | input | packed | padded |
//! |---|---|---|
//! | `T[tok]` | `[N]`, the tokens of all responses concatenated; needs `lengths` | `[R, W]`, with `response_mask` `[R, W]` or `lengths` `[R]` (without either, all `W` tokens of every row are real) |
//! | `T[resp]` | `[R]` | |
//! | `T[group]` | `[G]` | `[R]`: per response, the same within a group |
//! | `T` (batch) | `[]` or `[1]` | |
//! | `T[pair]` | `[P]`, P = Σ_g n_g(n_g − 1): for each response i, the pairs (i, j) with the other responses j of its group in order | `[R, R]`: element `[i, j]` for each other response j of i's group (the torch export's layout); the others are not read |
//! | `T[L, dim]`, `T[L, RUBRIC]` | `[size(L), K]` | group level also `[R, K]` |
//! | `T[L, crit]` | | `[size(L), C]` (group level also `[R, C]`), with `crit_counts` `[G]`: the first `crit_counts[g]` columns are group g's criteria |
//!
//! The groups are `index` `[R]` (the group of each response, an integer; a group's responses are
//! adjacent) or `group_sizes` `[G]`. Every value is checked as `rlx score` checks a rollout file: `f32`
//! inputs finite, `i32` whole, `bool` 0 or 1, group-level values equal within their group, a response
//! mask 1s then 0s; padding is never read. An error names the input and the element (its index in the
//! array as given). An `f32` input whose array is already in the kernel's layout and storage precision
//! (packed, or padded with every row full, in f32 or f64 as the kernel stores) is borrowed, not copied.

use std::fmt;
use std::sync::{Arc, Mutex};

use serde_json::Value;

use rlx_compiler::ir::{Elem, Feature, Graph, InputInfo, Level};

use rlx_core::Sizes;

use crate::batch::{Batch, Layout};
use crate::kernel::{Column, ColumnRef, Precision};
use crate::rollouts::{is_mask_key, Rollouts, MAX_LENGTH};

/// The elements of one array, row-major, in one of the three element types the binding passes.
#[derive(Clone, Copy, Debug)]
pub enum Elements<'a> {
    F32(&'a [f32]),
    F64(&'a [f64]),
    I64(&'a [i64]),
}

impl Elements<'_> {
    fn len(&self) -> usize {
        match self {
            Elements::F32(v) => v.len(),
            Elements::F64(v) => v.len(),
            Elements::I64(v) => v.len(),
        }
    }

    fn get(&self, index: usize) -> f64 {
        match self {
            Elements::F32(v) => f64::from(v[index]),
            Elements::F64(v) => v[index],
            Elements::I64(v) => v[index] as f64,
        }
    }
}

/// One array: its elements and its shape.
#[derive(Clone, Debug)]
pub struct Array<'a> {
    pub elements: Elements<'a>,
    pub shape: Vec<usize>,
}

/// The arrays of one batch: recipe inputs by name and the keys that describe the layout.
#[derive(Clone, Debug, Default)]
pub struct Arrays<'a> {
    pub inputs: Vec<(String, Array<'a>)>,
    /// `[R]`: the group of each response (adjacent responses with the same value form a group).
    pub index: Option<Array<'a>>,
    /// `[G]`: the number of responses of each group (instead of `index`).
    pub group_sizes: Option<Array<'a>>,
    /// `[R]`: each response's token count.
    pub lengths: Option<Array<'a>>,
    /// `[R, W]`: 1 on each token of a response, then 0 on padding.
    pub response_mask: Option<Array<'a>>,
    /// `[G]`: the criterion count of each group (recipes with a `crit` axis).
    pub crit_counts: Option<Array<'a>>,
}

/// The most responses a batch from arrays may have (a typo in `group_sizes` cannot exhaust memory).
pub const MAX_RESPONSES: usize = 1 << 26;

/// The most tokens that `lengths` may give responses whose token arrays are all defaulted.
pub const MAX_UNLISTED_TOKENS: usize = 1 << 26;

/// The keys of [`Arrays`] that are not recipe inputs.
pub const LAYOUT_KEYS: [&str; 5] = [
    "index",
    "group_sizes",
    "lengths",
    "response_mask",
    "crit_counts",
];

/// Why arrays are not a batch: the key (an input or a layout key) and what is wrong, naming the element.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArrayError {
    pub key: Option<String>,
    pub message: String,
}

impl fmt::Display for ArrayError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.key {
            Some(key) => write!(f, "`{key}`: {}", self.message),
            None => f.write_str(&self.message),
        }
    }
}

impl std::error::Error for ArrayError {}

fn error(key: &str, message: impl Into<String>) -> ArrayError {
    ArrayError {
        key: Some(key.to_string()),
        message: message.into(),
    }
}

/// One input's values for the kernel: borrowed from the caller's array, converted, or a defaulted
/// input's filled column kept in a [`Defaults`] between calls.
#[derive(Clone, Debug)]
pub enum Input<'a> {
    Borrowed(ColumnRef<'a>),
    Owned(Column),
    Shared(Arc<Column>),
}

impl Input<'_> {
    pub fn column(&self) -> ColumnRef<'_> {
        match self {
            Input::Borrowed(column) => *column,
            Input::Owned(column) => column.as_column_ref(),
            Input::Shared(column) => column.as_column_ref(),
        }
    }
}

/// The filled columns of defaulted inputs, kept from one call to the next (the binding keeps one per
/// compiled recipe): a trainer calls with batches of one size, and a token-level default such as
/// DAPO's `mask = 1` is as large as the batch, so filling it anew would cost a pass over the batch on
/// every call. One column per input (the last batch's size, value and precision), never written
/// (the kernels only read their inputs).
#[derive(Debug, Default)]
pub struct Defaults(Mutex<Vec<Option<Arc<Column>>>>);

impl Defaults {
    /// Input `input`'s column of `size` copies of `value` in `precision`: the kept one when it
    /// matches, else filled (and kept in place of the last).
    fn column(&self, input: usize, precision: Precision, size: usize, value: f64) -> Arc<Column> {
        let mut kept = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if kept.len() <= input {
            kept.resize(input + 1, None);
        }
        if let Some(column) = &kept[input] {
            let same = column.len() == size
                && column.precision() == precision
                && (size == 0 || column.get(0).to_bits() == filled_value(precision, value));
            if same {
                return column.clone();
            }
        }
        let column = Arc::new(filled(precision, size, value));
        kept[input] = Some(column.clone());
        column
    }
}

/// The bits of `value` as a column of `precision` holds it, widened to f64 (what `Column::get` reads).
fn filled_value(precision: Precision, value: f64) -> u64 {
    match precision {
        Precision::F32 => f64::from(value as f32).to_bits(),
        Precision::F64 => value.to_bits(),
    }
}

/// The position of the first of `values` for which `bad` holds. Blocks of 64 are tested without a
/// branch per element (a loop the compiler vectorizes), and only the block that has one is searched
/// element by element: `position` alone is a scalar loop, several times slower on a batch-sized array.
/// On an x86-64 CPU with AVX2 the same loop is compiled for 256-bit vectors (the build targets plain
/// x86-64, whose 128-bit SSE2 vectors halve the width): the binding's checks of every value it reads
/// took ≈ 10% of a DAPO step from Python with SSE2 (`perf record` of `scripts/python_bench.py`'s
/// step), and `Recipe.run` of that batch went from 4.94–4.96 to 4.71–4.88 ms with AVX2.
pub(crate) fn first_where<T: Copy>(values: &[T], bad: impl Fn(T) -> bool) -> Option<usize> {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2 (detected just now), the only requirement of `first_where_avx2`.
        return unsafe { first_where_avx2(values, bad) };
    }
    first_where_blocks(values, bad)
}

/// `first_where_blocks` compiled with AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn first_where_avx2<T: Copy>(values: &[T], bad: impl Fn(T) -> bool) -> Option<usize> {
    first_where_blocks(values, bad)
}

#[inline(always)]
fn first_where_blocks<T: Copy>(values: &[T], bad: impl Fn(T) -> bool) -> Option<usize> {
    const BLOCK: usize = 64;
    for (b, block) in values.chunks(BLOCK).enumerate() {
        if block.iter().fold(false, |any, &x| any | bad(x)) {
            return block.iter().position(|&x| bad(x)).map(|i| b * BLOCK + i);
        }
    }
    None
}

/// Where the packed elements of an input sit in its array (flat, row-major).
#[derive(Clone, Debug)]
enum Placement {
    /// Padded token rows `width` wide: each response's tokens (the layout's token counts) first in
    /// its row, then padding. Copied row by row, without a map.
    Rows { width: usize },
    /// The flat position of each packed element.
    Map(Vec<usize>),
}

impl Placement {
    fn len(&self, layout: &Layout) -> usize {
        match self {
            Placement::Rows { .. } => layout.tokens(),
            Placement::Map(map) => map.len(),
        }
    }

    /// The flat position of packed element `k`.
    fn flat(&self, layout: &Layout, k: usize) -> usize {
        match self {
            Placement::Rows { width } => {
                let offsets = &layout.token_offsets;
                let r = offsets.partition_point(|&o| o <= k) - 1;
                r * width + (k - offsets[r])
            }
            Placement::Map(map) => map[k],
        }
    }

    /// The flat positions of the packed elements, in order.
    fn positions<'p>(&'p self, layout: &'p Layout) -> Box<dyn Iterator<Item = usize> + 'p> {
        match self {
            Placement::Rows { width } => Box::new(
                layout
                    .token_offsets
                    .windows(2)
                    .enumerate()
                    .flat_map(move |(r, o)| r * width..r * width + (o[1] - o[0])),
            ),
            Placement::Map(map) => Box::new(map.iter().copied()),
        }
    }

    /// `values` (in packed order) at their places in `out`.
    fn scatter<T: Copy>(&self, layout: &Layout, values: &[T], out: &mut [T]) {
        match self {
            Placement::Rows { width } => {
                for (r, o) in layout.token_offsets.windows(2).enumerate() {
                    out[r * width..r * width + (o[1] - o[0])].copy_from_slice(&values[o[0]..o[1]]);
                }
            }
            Placement::Map(map) => {
                for (&at, value) in map.iter().zip(values) {
                    out[at] = *value;
                }
            }
        }
    }

    /// `values` at the packed elements' places, converted.
    fn gather<T: Copy, U>(
        &self,
        layout: &Layout,
        values: &[T],
        convert: impl Fn(T) -> U,
    ) -> Vec<U> {
        match self {
            Placement::Rows { width } => {
                let mut out = Vec::with_capacity(layout.tokens());
                for (r, o) in layout.token_offsets.windows(2).enumerate() {
                    let row = &values[r * width..r * width + (o[1] - o[0])];
                    out.extend(row.iter().map(|&x| convert(x)));
                }
                out
            }
            Placement::Map(map) => map.iter().map(|&at| convert(values[at])).collect(),
        }
    }
}

/// Arrays laid out as a packed batch.
#[derive(Clone, Debug)]
pub struct ArrayBatch<'a> {
    pub layout: Layout,
    /// One per recipe input, in the recipe's input order, in the kernel's storage.
    pub inputs: Vec<Input<'a>>,
    /// The `index` value of each group (or its position, with `group_sizes`).
    pub groups: Vec<Value>,
    /// For each input given as an array, where each of its packed elements sits in that array; `None`
    /// where the array is in the packed order itself, or the input was defaulted.
    placements: Vec<Option<Placement>>,
    /// Each input's array shape as given (`None`: defaulted).
    shapes: Vec<Option<Vec<usize>>>,
}

impl ArrayBatch<'_> {
    /// The input columns, as `Kernel::run_view` takes them.
    pub fn columns(&self) -> Vec<ColumnRef<'_>> {
        self.inputs.iter().map(Input::column).collect()
    }

    /// The batch in f64, for the interpreter and `rlx score`'s document.
    pub fn to_batch(&self) -> Batch {
        Batch {
            layout: self.layout.clone(),
            inputs: self.inputs.iter().map(|i| i.column().to_f64()).collect(),
        }
    }

    /// The batch as `rlx score` reads a rollout file (`score::score_read`): responses in the order of
    /// the arrays, each group named by its `index` value.
    pub fn to_rollouts(&self) -> Rollouts {
        Rollouts {
            batch: self.to_batch(),
            groups: self.groups.clone(),
            line_of_response: (0..self.layout.responses()).collect(),
            warnings: Vec::new(),
            unknown_length: None,
        }
    }

    /// The shape of input `input`'s array as given (`None` when it was defaulted).
    pub fn shape(&self, input: usize) -> Option<&[usize]> {
        self.shapes.get(input)?.as_deref()
    }

    /// Values over input `input`'s packed elements (its gradient) laid out like its array: zeros at
    /// padding and at the repeated copies of a group-level value given per response (the first
    /// response's value is the one read). `None` when the array is in packed order (then `values`
    /// already has its layout) or the input was defaulted.
    pub fn spread(&self, input: usize, values: ColumnRef<'_>) -> Option<Column> {
        let placement = self.placements.get(input)?.as_ref()?;
        let size: usize = self.shape(input)?.iter().product();
        let mut out = match values {
            ColumnRef::F32(_) => Column::F32(vec![0.0; size]),
            ColumnRef::F64(_) => Column::F64(vec![0.0; size]),
        };
        match (&mut out, values) {
            (Column::F32(out), ColumnRef::F32(values)) => {
                placement.scatter(&self.layout, values, out)
            }
            (Column::F64(out), ColumnRef::F64(values)) => {
                placement.scatter(&self.layout, values, out)
            }
            _ => {}
        }
        Some(out)
    }
}

/// A position in an array, as Python writes an index: `[3, 17]`.
fn at(shape: &[usize], flat: usize) -> String {
    let mut index = vec![0; shape.len()];
    let mut rest = flat;
    for (axis, &size) in shape.iter().enumerate().rev() {
        if size > 0 {
            index[axis] = rest % size;
            rest /= size;
        }
    }
    let parts: Vec<String> = index.iter().map(usize::to_string).collect();
    format!("[{}]", parts.join(", "))
}

fn shape_text(shape: &[usize]) -> String {
    let parts: Vec<String> = shape.iter().map(usize::to_string).collect();
    format!("[{}]", parts.join(", "))
}

/// The length of one row of a response mask (its leading 1s), or the position of the first element
/// that breaks "1s, then 0s".
fn mask_row_length<T: Copy + PartialEq + From<u8>>(row: &[T]) -> Result<usize, usize> {
    let (one, zero) = (T::from(1), T::from(0));
    let length = first_where(row, |x| x != one).unwrap_or(row.len());
    match first_where(&row[length..], |x| x != zero) {
        None => Ok(length),
        Some(at) => Err(length + at),
    }
}

/// A non-negative whole number (a count), or an error naming the element.
fn count(key: &str, array: &Array, flat: usize, limit: usize) -> Result<usize, ArrayError> {
    let value = array.elements.get(flat);
    if value.fract() != 0.0 || !(0.0..=limit as f64).contains(&value) {
        return Err(error(
            key,
            format!(
                "element {} is {value}, not a whole number from 0 to {limit}",
                at(&array.shape, flat)
            ),
        ));
    }
    Ok(value as usize)
}

fn one_dimensional<'b>(key: &str, array: &'b Array) -> Result<&'b Array<'b>, ArrayError> {
    match array.shape.len() {
        1 => Ok(array),
        _ => Err(error(
            key,
            format!(
                "has shape {}, but it is one value per element: a 1-D array",
                shape_text(&array.shape)
            ),
        )),
    }
}

/// Check one value of input `info` (element `flat` of its array).
fn check_value(info: &InputInfo, array: &Array, flat: usize) -> Result<f64, ArrayError> {
    let value = array.elements.get(flat);
    if value.is_finite() && info.elem.admits(value) {
        return Ok(value);
    }
    let what = match info.elem {
        Elem::F32 if value.is_finite() => "beyond the range of f32".to_string(),
        Elem::F32 => "not finite".to_string(),
        Elem::I32 => "not a whole number within i32".to_string(),
        Elem::Bool => "neither 0 nor 1 (false/true)".to_string(),
    };
    Err(error(
        &info.name,
        format!("element {} is {value}: {what}", at(&array.shape, flat)),
    ))
}

/// Lay `arrays` out as a packed batch for `graph`, `f32` inputs in `storage` (the kernel's).
pub fn from_arrays<'a>(
    graph: &Graph,
    arrays: &'a Arrays<'a>,
    storage: Precision,
) -> Result<ArrayBatch<'a>, ArrayError> {
    from_arrays_with(graph, arrays, storage, &Defaults::default())
}

/// [`from_arrays`], taking defaulted inputs' columns from `defaults` (filled there when it has none
/// of this batch's size).
pub fn from_arrays_with<'a>(
    graph: &Graph,
    arrays: &'a Arrays<'a>,
    storage: Precision,
    defaults: &Defaults,
) -> Result<ArrayBatch<'a>, ArrayError> {
    // What the arrays are checked against, and how messages write an input's type (as declared).
    let signature = graph.signature();
    for (name, _) in &arrays.inputs {
        if !graph.inputs.iter().any(|i| &i.name == name) {
            let names: Vec<&str> = graph.inputs.iter().map(|i| i.name.as_str()).collect();
            return Err(error(
                name,
                format!(
                    "the recipe has no input of that name; its inputs are {}, and the layout keys {}",
                    names.join(", "),
                    LAYOUT_KEYS.join(", ")
                ),
            ));
        }
    }
    let given = |name: &str| {
        arrays
            .inputs
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, a)| a)
    };

    // Groups.
    let (group_sizes, groups): (Vec<usize>, Vec<Value>) =
        match (&arrays.index, &arrays.group_sizes) {
            (Some(_), Some(_)) => {
                return Err(error(
                    "group_sizes",
                    "give either `index` or `group_sizes`, not both",
                ))
            }
            (None, None) => {
                return Err(ArrayError {
                    key: Some("index".into()),
                    message: "missing: the group (prompt) of each response, `index` [R] (adjacent responses with the same value form a group), or `group_sizes` [G]".into(),
                })
            }
            (Some(index), None) => {
                let index = one_dimensional("index", index)?;
                let mut sizes: Vec<usize> = Vec::new();
                let mut ids: Vec<i64> = Vec::new();
                for r in 0..index.elements.len() {
                    let value = index.elements.get(r);
                    if value.fract() != 0.0 || value.abs() > 9.0e15 {
                        return Err(error(
                            "index",
                            format!("element [{r}] is {value}, not a whole number"),
                        ));
                    }
                    let id = value as i64;
                    if ids.last() == Some(&id) {
                        *sizes.last_mut().expect("a group") += 1;
                    } else if let Some(first) = ids.iter().position(|&g| g == id) {
                        return Err(error(
                            "index",
                            format!(
                                "element [{r}] is {id}, a group that ended before: the responses of a group must be adjacent (group {id} is at [{}..], then group {} comes between); sort the batch by index",
                                sizes[..first].iter().sum::<usize>(),
                                ids[first + 1]
                            ),
                        ));
                    } else {
                        ids.push(id);
                        sizes.push(1);
                    }
                }
                (sizes, ids.into_iter().map(Value::from).collect())
            }
            (None, Some(sizes_array)) => {
                let sizes_array = one_dimensional("group_sizes", sizes_array)?;
                let mut sizes = Vec::new();
                for g in 0..sizes_array.elements.len() {
                    let size = count("group_sizes", sizes_array, g, MAX_RESPONSES)?;
                    if size == 0 {
                        return Err(error(
                            "group_sizes",
                            format!("element [{g}] is 0: every group has a response"),
                        ));
                    }
                    sizes.push(size);
                }
                let ids = (0..sizes.len()).map(Value::from).collect();
                (sizes, ids)
            }
        };
    let responses: usize = group_sizes.iter().sum();
    if responses > MAX_RESPONSES {
        return Err(error(
            "group_sizes",
            format!("the groups add up to {responses} responses, more than the {MAX_RESPONSES} a batch may have"),
        ));
    }
    if responses == 0 {
        return Err(error("index", "the batch has no responses"));
    }
    let group_count = group_sizes.len();
    let mut response_group = Vec::with_capacity(responses);
    for (g, &size) in group_sizes.iter().enumerate() {
        response_group.extend(std::iter::repeat_n(g, size));
    }
    let first_response: Vec<usize> = group_sizes
        .iter()
        .scan(0, |start, &size| {
            let first = *start;
            *start += size;
            Some(first)
        })
        .collect();

    // Token counts.
    let mut lengths: Option<(Vec<usize>, &str)> = None;
    if let Some(array) = &arrays.lengths {
        let array = one_dimensional("lengths", array)?;
        if array.shape[0] != responses {
            return Err(error(
                "lengths",
                format!("has {} entries for {responses} responses", array.shape[0]),
            ));
        }
        let values = (0..responses)
            .map(|r| count("lengths", array, r, MAX_LENGTH))
            .collect::<Result<Vec<_>, _>>()?;
        lengths = Some((values, "lengths"));
    }
    if let Some(mask) = &arrays.response_mask {
        if mask.shape.len() != 2 || mask.shape[0] != responses {
            return Err(error(
                "response_mask",
                format!(
                    "has shape {}, but it is [R, W] with R = {responses} responses",
                    shape_text(&mask.shape)
                ),
            ));
        }
        let width = mask.shape[1];
        if mask.elements.len() != responses * width {
            return Err(error(
                "response_mask",
                "internal error: the elements do not fill the shape",
            ));
        }
        let mut values = Vec::with_capacity(responses);
        for r in 0..responses {
            let row = r * width..(r + 1) * width;
            let found = match mask.elements {
                Elements::F32(v) => mask_row_length(&v[row]),
                Elements::F64(v) => mask_row_length(&v[row]),
                Elements::I64(v) => mask_row_length(&v[row]),
            };
            let length = match found {
                Ok(length) => length,
                Err(t) => {
                    let flat = r * width + t;
                    let x = mask.elements.get(flat);
                    return Err(error(
                        "response_mask",
                        if x == 1.0 {
                            format!(
                                "element {} is 1 after a 0 in its row: the mask marks the response's tokens (1s) and then padding (0s); a weight of the response's own tokens belongs in an input such as `mask`",
                                at(&mask.shape, flat)
                            )
                        } else {
                            format!("element {} is {x}, not 0 or 1", at(&mask.shape, flat))
                        },
                    ));
                }
            };
            values.push(length);
        }
        if let Some((given, _)) = &lengths {
            if let Some(r) = (0..responses).find(|&r| given[r] != values[r]) {
                return Err(error(
                    "lengths",
                    format!(
                        "element [{r}] is {} but `response_mask` has {} ones in row {r}",
                        given[r], values[r]
                    ),
                ));
            }
        }
        lengths = Some((values, "response_mask"));
    }
    // The width of padded token arrays must be one for the batch, and fit every length.
    let mut width: Option<(usize, &str)> = None;
    let mut packed_tokens: Option<(usize, &str)> = None;
    for info in graph.inputs.iter().filter(|i| i.shape.level == Level::Tok) {
        let Some(array) = given(&info.name) else {
            continue;
        };
        match array.shape.len() {
            1 => {
                packed_tokens.get_or_insert((array.shape[0], &info.name));
            }
            2 if array.shape[0] == responses => match width {
                None => width = Some((array.shape[1], &info.name)),
                Some((w, first)) if w != array.shape[1] => {
                    return Err(error(
                        &info.name,
                        format!(
                            "has shape {}, but `{first}` is {responses} × {w}: padded token arrays have one width",
                            shape_text(&array.shape)
                        ),
                    ))
                }
                Some(_) => {}
            },
            _ => {
                return Err(error(
                    &info.name,
                    format!(
                        "has shape {}: a token-level input is [R, W] padded (R = {responses} responses) or [N] packed (with `lengths`)",
                        shape_text(&array.shape)
                    ),
                ))
            }
        }
    }
    if let (Some((w, first)), Some(mask)) = (width, &arrays.response_mask) {
        if mask.shape[1] != w {
            return Err(error(
                "response_mask",
                format!(
                    "has shape {}, but `{first}` is {responses} × {w}",
                    shape_text(&mask.shape)
                ),
            ));
        }
    }
    let lengths: Vec<usize> = match (lengths, width, packed_tokens) {
        (Some((lengths, key)), Some((w, first)), _) => {
            if let Some(r) = (0..responses).find(|&r| lengths[r] > w) {
                return Err(error(
                    key,
                    format!(
                        "response {r} has {} tokens, more than the {w} columns of `{first}`",
                        lengths[r]
                    ),
                ));
            }
            lengths
        }
        (Some((lengths, key)), None, _) => {
            // No array lists these tokens: their token-level inputs are defaults, allocated here.
            let total: usize = lengths.iter().sum();
            if total > MAX_UNLISTED_TOKENS {
                return Err(error(
                    key,
                    format!("the responses add up to {total} tokens that no array lists, more than {MAX_UNLISTED_TOKENS}"),
                ));
            }
            lengths
        }
        (None, Some((w, first)), _) => {
            // Every column is a token: refuse a mask that ends with 0, as `rlx score` does.
            for (name, array) in &arrays.inputs {
                if !is_mask_key(name) || array.shape.len() != 2 || w == 0 {
                    continue;
                }
                if let Some(r) = (0..responses).find(|&r| array.elements.get(r * w + w - 1) == 0.0)
                {
                    return Err(error(
                        name,
                        format!(
                            "row {r} ends with 0, so the responses may be padded, and rlx does not guess their length: without `response_mask` or `lengths` every one of the {w} columns of `{first}` is a token, and a mask is only a weight. Pass `response_mask` (1 on each token of a response, 0 on padding) or `lengths`"
                        ),
                    ));
                }
            }
            vec![w; responses]
        }
        (None, None, Some((_, first))) => {
            return Err(error(
                first,
                "is packed ([N], the tokens of all responses concatenated), so `lengths` [R] must say how many tokens each response has",
            ))
        }
        (None, None, None) => {
            if reads_token_counts(graph) {
                return Err(error(
                    "lengths",
                    "missing: the recipe reads each response's token count (`length`, `token_index` or a token-level value) and no token-level input or `response_mask` gives it",
                ));
            }
            vec![0; responses]
        }
    };
    let tokens: usize = lengths.iter().sum();
    if let Some((n, first)) = packed_tokens {
        if n != tokens {
            return Err(error(
                first,
                format!("has {n} tokens, but `lengths` add up to {tokens}"),
            ));
        }
    }

    // Criterion counts and feature widths.
    let has_crit = graph
        .inputs
        .iter()
        .any(|i| i.shape.feature == Some(Feature::Crit));
    let crits: Vec<usize> = match (&arrays.crit_counts, has_crit) {
        (Some(array), true) => {
            let array = one_dimensional("crit_counts", array)?;
            if array.shape[0] != group_count {
                return Err(error(
                    "crit_counts",
                    format!("has {} entries for {group_count} groups", array.shape[0]),
                ));
            }
            (0..group_count)
                .map(|g| count("crit_counts", array, g, 1 << 20))
                .collect::<Result<_, _>>()?
        }
        (None, true) => {
            return Err(error(
                "crit_counts",
                "missing: the recipe has a `crit` axis, so `crit_counts` [G] must give each group's criterion count",
            ))
        }
        (_, false) => Vec::new(),
    };
    let mut dim: Option<(usize, &str)> = None;
    for info in &graph.inputs {
        // The array axis that gives the dim length: the feature column of a vector, a matrix's rows
        // or columns (counted from the end: a batch-level matrix has no leading axis).
        let from_end = match &info.shape.feature {
            Some(Feature::Dim) => 1,
            Some(Feature::Matrix { rows, .. }) if **rows == Feature::Dim => 2,
            Some(Feature::Matrix { cols, .. }) if **cols == Feature::Dim => 1,
            _ => continue,
        };
        let Some(array) = given(&info.name) else {
            continue;
        };
        let matrix_rank = usize::from(info.shape.level != Level::Batch) + 2;
        if from_end == 2 || info.shape.feature != Some(Feature::Dim) {
            // A matrix of the wrong rank gives no dim; its shape error names it below.
            if array.shape.len() != matrix_rank {
                continue;
            }
        }
        let d = match info.shape.feature {
            Some(Feature::Dim) => array.shape.get(1).copied().unwrap_or(0),
            _ => array
                .shape
                .len()
                .checked_sub(from_end)
                .and_then(|axis| array.shape.get(axis))
                .copied()
                .unwrap_or(0),
        };
        match dim {
            None => dim = Some((d, &info.name)),
            Some((other, first)) if other != d => {
                return Err(error(
                    &info.name,
                    format!("has {d} dims, but `{first}` has {other}: one dim length per batch"),
                ))
            }
            Some(_) => {}
        }
    }
    let dim = match dim {
        Some((d, _)) => d,
        None => match graph.inputs.iter().find(|i| {
            i.shape.feature == Some(Feature::Dim)
                || i.shape
                    .feature
                    .as_ref()
                    .and_then(|f| f.matrix())
                    .is_some_and(|(r, c)| *r == Feature::Dim || *c == Feature::Dim)
        }) {
            Some(info) => {
                return Err(error(
                    &info.name,
                    "missing: no array gives the dim length of this `dim` input",
                ))
            }
            None => 0,
        },
    };
    let layout = Layout::from_counts(&group_sizes, &lengths, &crits, dim)
        .map_err(|e| error("index", format!("internal error: {e}")))?;
    let sizes = Sizes::new(&layout).map_err(|e| error("index", e.to_string()))?;
    let input_size = |info: &InputInfo| {
        sizes
            .size(&info.shape)
            .map_err(|e| error(&info.name, e.to_string()))
    };

    // Inputs.
    let mut inputs = Vec::with_capacity(graph.inputs.len());
    let mut placements = Vec::with_capacity(graph.inputs.len());
    let mut shapes = Vec::with_capacity(graph.inputs.len());
    for (input, info) in graph.inputs.iter().enumerate() {
        let precision = match info.elem {
            Elem::F32 => storage,
            _ => Precision::F64,
        };
        let shape = &info.shape;
        let Some(array) = given(&info.name) else {
            let Some(default) = info.default else {
                return Err(error(
                    &info.name,
                    format!(
                        "missing: the recipe's input `{} : {}` has no default",
                        info.name,
                        signature.input_type(info)
                    ),
                ));
            };
            let size = input_size(info)?;
            inputs.push(Input::Shared(
                defaults.column(input, precision, size, default),
            ));
            placements.push(None);
            shapes.push(None);
            continue;
        };
        if array.elements.len() != array.shape.iter().product::<usize>() {
            return Err(error(
                &info.name,
                "internal error: the elements do not fill the shape",
            ));
        }
        // Where each packed element sits in the array (flat); `None`: the identity.
        let bad_shape = |wanted: String| {
            error(
                &info.name,
                format!(
                    "has shape {}, but `{} : {}` is {wanted}",
                    shape_text(&array.shape),
                    info.name,
                    signature.input_type(info)
                ),
            )
        };
        let feature_width = |g: usize| -> usize {
            match &shape.feature {
                None => 1,
                Some(Feature::Crit) => crits[g],
                Some(Feature::Dim) => dim,
                Some(Feature::Rubric { len, .. }) => *len as usize,
                Some(feature @ Feature::Matrix { .. }) => feature.fixed_len(dim).unwrap_or(0),
            }
        };
        let columns = |wanted: &str| -> Result<usize, ArrayError> {
            match (&shape.feature, array.shape.len()) {
                (Some(Feature::Matrix { rows, cols }), 3) => {
                    let want = (rows.fixed_len(dim), cols.fixed_len(dim));
                    if want == (Some(array.shape[1]), Some(array.shape[2])) {
                        Ok(array.shape[1] * array.shape[2])
                    } else {
                        Err(bad_shape(wanted.to_string()))
                    }
                }
                (None, 1) => Ok(1),
                (Some(Feature::Crit), 2) => {
                    let c = array.shape[1];
                    match crits.iter().enumerate().find(|(_, &n)| n > c) {
                        Some((g, n)) => Err(error(
                            &info.name,
                            format!(
                                "has {c} columns, but `crit_counts` gives group {g} {n} criteria"
                            ),
                        )),
                        None => Ok(c),
                    }
                }
                (Some(Feature::Dim), 2) => Ok(array.shape[1]),
                (Some(Feature::Rubric { len, .. }), 2) if array.shape[1] == *len as usize => {
                    Ok(array.shape[1])
                }
                _ => Err(bad_shape(wanted.to_string())),
            }
        };
        let placement: Option<Placement> = match shape.level {
            Level::Tok if shape.feature.is_some() => return Err(bad_shape(
                "a token-level value with a feature axis, which only rows (`score(rows)`) can give"
                    .into(),
            )),
            Level::Tok => match array.shape.len() {
                1 => None,
                _ => {
                    let w = array.shape[1];
                    if lengths.iter().all(|&l| l == w) {
                        None
                    } else {
                        Some(Placement::Rows { width: w })
                    }
                }
            },
            Level::Resp => {
                let c = columns(&format!("[R] or [R, K] with R = {responses}"))?;
                if array.shape[0] != responses {
                    return Err(bad_shape(format!("one row per response, R = {responses}")));
                }
                if shape.feature == Some(Feature::Crit) {
                    let mut map = Vec::new();
                    for (r, &g) in response_group.iter().enumerate() {
                        map.extend((0..crits[g]).map(|f| r * c + f));
                    }
                    Some(Placement::Map(map))
                } else {
                    None
                }
            }
            Level::Group => {
                let c = columns(&format!(
                    "[G] or [G, K] with G = {group_count} groups (or one row per response, R = {responses})"
                ))?;
                let rows = array.shape[0];
                if rows != group_count && rows != responses {
                    return Err(bad_shape(format!(
                        "one row per group (G = {group_count}) or per response (R = {responses})"
                    )));
                }
                let per_response = rows == responses && rows != group_count;
                let row_of = |g: usize| if per_response { first_response[g] } else { g };
                if per_response {
                    // The same values on every response of a group.
                    for (r, &g) in response_group.iter().enumerate() {
                        for f in 0..feature_width(g) {
                            let first = row_of(g) * c + f;
                            let here = r * c + f;
                            let (a, b) = (array.elements.get(first), array.elements.get(here));
                            if a.to_bits() != b.to_bits() && a != b {
                                return Err(error(
                                    &info.name,
                                    format!(
                                        "a group-level input given per response differs within group {}: {a} at {}, {b} at {}",
                                        groups[g],
                                        at(&array.shape, first),
                                        at(&array.shape, here)
                                    ),
                                ));
                            }
                        }
                    }
                }
                if !per_response && shape.feature != Some(Feature::Crit) {
                    None
                } else {
                    let mut map = Vec::new();
                    for g in 0..group_count {
                        map.extend((0..feature_width(g)).map(|f| row_of(g) * c + f));
                    }
                    Some(Placement::Map(map))
                }
            }
            Level::Batch => {
                let width = match &shape.feature {
                    None => 1,
                    Some(Feature::Rubric { len, .. }) => *len as usize,
                    Some(feature @ Feature::Matrix { .. }) => feature.fixed_len(dim).unwrap_or(0),
                    Some(_) => 0,
                };
                let matrix = shape.feature.as_ref().and_then(|f| f.matrix());
                let fits = match matrix {
                    Some((rows, cols)) => {
                        array.shape.len() == 2
                            && Some(array.shape[0]) == rows.fixed_len(dim)
                            && Some(array.shape[1]) == cols.fixed_len(dim)
                    }
                    None => {
                        array.shape.iter().product::<usize>() == width && array.shape.len() <= 1
                    }
                };
                if !fits {
                    return Err(bad_shape(match matrix {
                        Some((rows, cols)) => format!(
                            "one matrix per batch (shape [{}, {}])",
                            rows.fixed_len(dim).unwrap_or(0),
                            cols.fixed_len(dim).unwrap_or(0)
                        ),
                        None => format!("one value per batch (shape [] or [{width}])"),
                    }));
                }
                None
            }
            Level::Pair => match array.shape.as_slice() {
                [_] => None,
                [rows, columns] if *rows == responses && *columns == responses => {
                    let mut map = Vec::new();
                    for g in 0..group_count {
                        let members = layout.group_offsets[g]..layout.group_offsets[g + 1];
                        for i in members.clone() {
                            map.extend(
                                members
                                    .clone()
                                    .filter(|&j| j != i)
                                    .map(|j| i * responses + j),
                            );
                        }
                    }
                    Some(Placement::Map(map))
                }
                _ => {
                    return Err(bad_shape(format!(
                        "[P] with P = Σ n·(n − 1) over the groups, or [R, R] with R = {responses}"
                    )))
                }
            },
        };
        let size = input_size(info)?;
        let count_placed = placement
            .as_ref()
            .map_or(array.elements.len(), |p| p.len(&layout));
        if count_placed != size {
            return Err(bad_shape(format!("{size} values for this batch")));
        }
        // Check every value that is read (never the padding).
        let borrow = placement.is_none() && info.elem == Elem::F32;
        match (borrow, precision, array.elements) {
            (true, Precision::F32, Elements::F32(values)) => {
                if let Some(bad) = first_where(values, |x: f32| !x.is_finite()) {
                    check_value(info, array, bad)?;
                }
                inputs.push(Input::Borrowed(ColumnRef::F32(values)));
            }
            (true, Precision::F64, Elements::F64(values)) => {
                if let Some(bad) = first_where(values, |x: f64| !x.is_finite()) {
                    check_value(info, array, bad)?;
                }
                inputs.push(Input::Borrowed(ColumnRef::F64(values)));
            }
            (_, _, Elements::F32(_) | Elements::F64(_)) if info.elem == Elem::F32 => {
                // Gathered (a padded array) or converted, then checked in one vectorized pass: the
                // first value that is not finite after the conversion is the first bad element.
                let column = gather(array.elements, placement.as_ref(), &layout, precision);
                let bad = match &column {
                    Column::F32(v) => first_where(v, |x: f32| !x.is_finite()),
                    Column::F64(v) => first_where(v, |x: f64| !x.is_finite()),
                };
                if let Some(k) = bad {
                    let flat = placement.as_ref().map_or(k, |p| p.flat(&layout, k));
                    check_value(info, array, flat)?;
                    return Err(error(
                        &info.name,
                        format!(
                            "element {} is {}: beyond the range of f32",
                            at(&array.shape, flat),
                            array.elements.get(flat)
                        ),
                    ));
                }
                inputs.push(Input::Owned(column));
            }
            _ => {
                let positions: Box<dyn Iterator<Item = usize>> = match &placement {
                    Some(p) => p.positions(&layout),
                    None => Box::new(0..size),
                };
                let mut column = match precision {
                    Precision::F32 => Column::F32(Vec::with_capacity(size)),
                    Precision::F64 => Column::F64(Vec::with_capacity(size)),
                };
                for flat in positions {
                    let value = check_value(info, array, flat)?;
                    match &mut column {
                        Column::F32(v) => {
                            let narrow = value as f32;
                            if !narrow.is_finite() {
                                return Err(error(
                                    &info.name,
                                    format!(
                                        "element {} is {value}: beyond the range of f32",
                                        at(&array.shape, flat)
                                    ),
                                ));
                            }
                            v.push(narrow)
                        }
                        Column::F64(v) => v.push(value),
                    }
                }
                inputs.push(Input::Owned(column));
            }
        }
        placements.push(placement);
        shapes.push(Some(array.shape.clone()));
    }
    // Each column was sized above; the recipe's signature is the one judge of that.
    signature
        .validate(&layout, inputs.iter().map(|input| input.column().len()))
        .map_err(|e| error("index", format!("internal error: {e}")))?;
    Ok(ArrayBatch {
        layout,
        inputs,
        groups,
        placements,
        shapes,
    })
}

/// `elements` in `precision`, at their `placement` (in packed order) or all of them.
fn gather(
    elements: Elements<'_>,
    placement: Option<&Placement>,
    layout: &Layout,
    precision: Precision,
) -> Column {
    fn take<T: Copy, U>(
        values: &[T],
        placement: Option<&Placement>,
        layout: &Layout,
        convert: impl Fn(T) -> U,
    ) -> Vec<U> {
        match placement {
            Some(placement) => placement.gather(layout, values, convert),
            None => values.iter().map(|&x| convert(x)).collect(),
        }
    }
    match (elements, precision) {
        (Elements::F32(v), Precision::F32) => Column::F32(take(v, placement, layout, |x| x)),
        (Elements::F32(v), Precision::F64) => Column::F64(take(v, placement, layout, f64::from)),
        (Elements::F64(v), Precision::F32) => Column::F32(take(v, placement, layout, |x| x as f32)),
        (Elements::F64(v), Precision::F64) => Column::F64(take(v, placement, layout, |x| x)),
        (Elements::I64(v), Precision::F32) => Column::F32(take(v, placement, layout, |x| x as f32)),
        (Elements::I64(v), Precision::F64) => Column::F64(take(v, placement, layout, |x| x as f64)),
    }
}

fn filled(precision: Precision, size: usize, value: f64) -> Column {
    match precision {
        Precision::F32 => Column::F32(vec![value as f32; size]),
        Precision::F64 => Column::F64(vec![value; size]),
    }
}

/// Whether `graph` needs each response's token count (`length`, `token_index` or a token-level value).
fn reads_token_counts(graph: &Graph) -> bool {
    crate::score::reads_token_counts(graph)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::interp::Context;
    use crate::kernel::{Kernel, Options};

    fn dapo() -> Graph {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../recipes/dapo.rlx");
        let checked = rlx_compiler::check_path(std::path::Path::new(path)).expect("readable");
        let recipe = checked.recipe.expect("dapo checks");
        rlx_compiler::compile_graph(&recipe, &[]).expect("it lowers")
    }

    fn array<'a>(elements: Elements<'a>, shape: &[usize]) -> Array<'a> {
        Array {
            elements,
            shape: shape.to_vec(),
        }
    }

    #[test]
    fn arrays_in_the_kernels_layout_are_borrowed_and_run_as_the_packed_batch() {
        let graph = dapo();
        // 2 groups of 2 responses, 3 tokens each: padded rows that are all full are packed.
        let logp: Vec<f32> = (0..12).map(|i| -0.5 - 0.01 * i as f32).collect();
        let old: Vec<f32> = (0..12).map(|i| -0.52 - 0.01 * i as f32).collect();
        let score = [1.0f32, 0.0, 0.0, 1.0];
        let index = [7i64, 7, 9, 9];
        let arrays = Arrays {
            inputs: vec![
                ("logp".into(), array(Elements::F32(&logp), &[4, 3])),
                ("old_logp".into(), array(Elements::F32(&old), &[4, 3])),
                ("score".into(), array(Elements::F32(&score), &[4])),
            ],
            index: Some(array(Elements::I64(&index), &[4])),
            ..Arrays::default()
        };
        let batch = from_arrays(&graph, &arrays, Precision::F32).expect("a batch");
        assert!(
            matches!(batch.inputs[0], Input::Borrowed(ColumnRef::F32(v)) if v.as_ptr() == logp.as_ptr())
        );
        assert!(matches!(batch.inputs[2], Input::Borrowed(_)));
        assert!(
            matches!(batch.inputs[3], Input::Shared(_)),
            "the defaulted mask"
        );
        assert_eq!(batch.groups, vec![Value::from(7), Value::from(9)]);
        let kernel = Kernel::compile(&graph, &Options::default()).expect("compiles");
        let viewed = kernel
            .run_view(&batch.layout, &batch.columns(), &Context::default())
            .expect("runs");
        let packed = kernel.pack(&batch.to_batch()).expect("packs");
        let run = kernel
            .run_packed(&packed, &Context::default())
            .expect("runs");
        assert_eq!(viewed, run);
    }

    #[test]
    fn first_where_finds_the_first_in_any_block() {
        let mut values = vec![1.0f32; 300];
        assert_eq!(first_where(&values, |x: f32| x != 1.0), None);
        assert_eq!(first_where(&[] as &[f32], |x: f32| x != 1.0), None);
        for at in [0, 1, 63, 64, 65, 200, 299] {
            values.fill(1.0);
            values[at] = f32::NAN;
            values[299] = 0.0;
            assert_eq!(first_where(&values, |x: f32| x != 1.0), Some(at));
            assert_eq!(
                first_where(&values, |x: f32| !x.is_finite()),
                Some(at).filter(|&a| a != 299)
            );
        }
        assert_eq!(mask_row_length(&[1i64, 1, 1, 0, 0]), Ok(3));
        let mut row = vec![1.0f64; 150];
        row[100..].fill(0.0);
        assert_eq!(mask_row_length(&row), Ok(100));
        row[140] = 1.0;
        assert_eq!(mask_row_length(&row), Err(140));
    }

    #[test]
    fn defaulted_columns_are_kept_between_calls_of_one_size() {
        let graph = dapo();
        let defaults = Defaults::default();
        let batch = |logp: &[f32]| {
            let rows = logp.len() / 2;
            (
                logp.to_vec(),
                vec![0.5f32; rows],
                (0..rows as i64).map(|r| r / 2).collect::<Vec<i64>>(),
                rows,
            )
        };
        let mask_of = |logp: &[f32]| {
            let (logp, score, index, rows) = batch(logp);
            let arrays = Arrays {
                inputs: vec![
                    ("logp".into(), array(Elements::F32(&logp), &[rows, 2])),
                    ("old_logp".into(), array(Elements::F32(&logp), &[rows, 2])),
                    ("score".into(), array(Elements::F32(&score), &[rows])),
                ],
                index: Some(array(Elements::I64(&index), &[rows])),
                ..Arrays::default()
            };
            let batch =
                from_arrays_with(&graph, &arrays, Precision::F32, &defaults).expect("a batch");
            match &batch.inputs[3] {
                Input::Shared(column) => column.clone(),
                other => panic!("the defaulted mask is {other:?}"),
            }
        };
        let first = mask_of(&[-0.5; 8]);
        assert_eq!(*first, Column::F32(vec![1.0; 8]));
        let again = mask_of(&[-0.7; 8]);
        assert!(
            Arc::ptr_eq(&first, &again),
            "the same size reuses the column"
        );
        let larger = mask_of(&[-0.5; 12]);
        assert_eq!(*larger, Column::F32(vec![1.0; 12]));
        assert!(!Arc::ptr_eq(&first, &larger));
        // Another precision or value is filled anew.
        let f64_column = defaults.column(3, Precision::F64, 12, 1.0);
        assert_eq!(*f64_column, Column::F64(vec![1.0; 12]));
        let twos = defaults.column(3, Precision::F64, 12, 2.0);
        assert_eq!(*twos, Column::F64(vec![2.0; 12]));
    }

    #[test]
    fn padded_arrays_are_gathered_and_gradients_spread_back() {
        let graph = dapo();
        let logp = [-0.5f64, -0.6, f64::NAN, -0.7, -0.8, -0.9];
        let old = [-0.55f64, -0.6, 0.0, -0.75, -0.8, -0.85];
        let score = [1.0f64, 0.0];
        let lengths = [2i64, 3];
        let arrays = Arrays {
            inputs: vec![
                ("logp".into(), array(Elements::F64(&logp), &[2, 3])),
                ("old_logp".into(), array(Elements::F64(&old), &[2, 3])),
                ("score".into(), array(Elements::F64(&score), &[2])),
            ],
            group_sizes: Some(array(Elements::I64(&[2]), &[1])),
            lengths: Some(array(Elements::I64(&lengths), &[2])),
            ..Arrays::default()
        };
        let batch = from_arrays(&graph, &arrays, Precision::F64).expect("the NaN is padding");
        assert_eq!(batch.layout.token_offsets, vec![0, 2, 5]);
        let gradient = [1.0, 2.0, 3.0, 4.0, 5.0];
        let spread = batch.spread(0, ColumnRef::F64(&gradient)).expect("padded");
        assert_eq!(spread, Column::F64(vec![1.0, 2.0, 0.0, 3.0, 4.0, 5.0]));
    }

    #[test]
    fn matrices_are_given_as_rows_and_columns() {
        let source = "
            rubric style {
                criterion voice
                criterion grounded
            }
            input judged : f32[resp, style]
            input a      : f32[batch, style, style]
            input w      : f32[group, dim, style]
            input emb    : f32[resp, dim]
            reward = dot(dot(judged, a), judged) + dot(dot(emb, w), judged)
        ";
        let checked = rlx_compiler::check_source("m.rlx", source);
        let graph =
            rlx_compiler::compile_graph(&checked.recipe.expect("checks"), &[]).expect("lowers");
        let judged = [1.0f64, 0.0, 0.5, 0.5];
        let a = [1.0f64, 2.0, 3.0, 4.0];
        let w = [1.0f64, 0.0, 0.0, 1.0, 1.0, 1.0];
        let emb = [1.0f64, 0.0, 0.0, 0.0, 1.0, 0.0];
        let arrays = |a_shape: &[usize], w_shape: &[usize]| Arrays {
            inputs: vec![
                ("judged".into(), array(Elements::F64(&judged), &[2, 2])),
                ("a".into(), array(Elements::F64(&a), a_shape)),
                ("w".into(), array(Elements::F64(&w), w_shape)),
                ("emb".into(), array(Elements::F64(&emb), &[2, 3])),
            ],
            index: Some(array(Elements::I64(&[0, 0]), &[2])),
            ..Arrays::default()
        };
        // One group: w given once per group ([G, D, K]).
        let given = arrays(&[2, 2], &[1, 3, 2]);
        let batch = from_arrays(&graph, &given, Precision::F32).expect("a batch");
        assert_eq!(batch.layout.dim, 3);
        let run = Kernel::compile(&graph, &Options::default())
            .expect("compiles")
            .run_view(&batch.layout, &batch.columns(), &Context::default())
            .expect("runs");
        // Response 1: xᵀAx = 1; e = [1, 0, 0]: e·w = [1, 0], ·x = 1. Response 2: x = [0.5, 0.5]:
        // xᵀAx = 0.25·(1 + 2 + 3 + 4) = 2.5; e = [0, 1, 0]: e·w = [0, 1], ·x = 0.5.
        assert_eq!(run.reward, Some(vec![2.0, 3.0]));
        for (a_shape, w_shape, wanted) in [
            (
                vec![4],
                vec![1, 3, 2],
                "one matrix per batch (shape [2, 2])",
            ),
            (vec![2, 2], vec![1, 6], "[G] or [G, K]"),
            // Rows and columns swapped: w's rows say D = 2, emb's columns D = 3.
            (vec![2, 2], vec![1, 2, 3], "one dim length per batch"),
        ] {
            let given = arrays(&a_shape, &w_shape);
            let message = match from_arrays(&graph, &given, Precision::F32) {
                Ok(_) => panic!("{a_shape:?} {w_shape:?}: accepted"),
                Err(error) => error.to_string(),
            };
            assert!(message.contains(wanted), "{message}\nwanted: {wanted}");
        }
        // The input's type as declared, its rubric by name.
        let message = from_arrays(&graph, &arrays(&[2, 2], &[1, 6]), Precision::F32)
            .expect_err("w is [G, D·K]")
            .to_string();
        assert!(
            message.contains("but `w : f32[group, dim, style]` is"),
            "{message}"
        );
    }

    #[test]
    fn errors_name_the_input_and_element() {
        let graph = dapo();
        let logp = [-0.5f64, f64::INFINITY, -0.6, -0.7];
        let score = [1.0f64, 0.0];
        let arrays = Arrays {
            inputs: vec![
                ("logp".into(), array(Elements::F64(&logp), &[2, 2])),
                ("old_logp".into(), array(Elements::F64(&logp), &[2, 2])),
                ("score".into(), array(Elements::F64(&score), &[2])),
            ],
            index: Some(array(Elements::I64(&[0, 0]), &[2])),
            ..Arrays::default()
        };
        let error = from_arrays(&graph, &arrays, Precision::F32).expect_err("infinite");
        assert_eq!(error.key.as_deref(), Some("logp"));
        assert!(error.message.contains("element [0, 1] is inf"), "{error}");
        let arrays = Arrays {
            index: Some(array(Elements::I64(&[0, 1, 0]), &[3])),
            ..arrays
        };
        let error = from_arrays(&graph, &arrays, Precision::F32).expect_err("not adjacent");
        assert_eq!(error.key.as_deref(), Some("index"));
        // Padded arrays that are gathered: the element is named in the array as given, padding is
        // never read, and a finite f64 too large for f32 storage is refused.
        let padded = |logp: &[f64], storage: Precision| {
            let score = [1.0f64, 0.0];
            let arrays = Arrays {
                inputs: vec![
                    ("logp".into(), array(Elements::F64(logp), &[2, 3])),
                    ("old_logp".into(), array(Elements::F64(&[-0.5; 6]), &[2, 3])),
                    ("score".into(), array(Elements::F64(&score), &[2])),
                ],
                group_sizes: Some(array(Elements::I64(&[2]), &[1])),
                lengths: Some(array(Elements::I64(&[2, 3]), &[2])),
                ..Arrays::default()
            };
            from_arrays(&graph, &arrays, storage).map(|batch| batch.inputs[0].column().to_f64())
        };
        let nan_in_padding = [-0.5, -0.6, f64::NAN, -0.7, -0.8, -0.9];
        assert_eq!(
            padded(&nan_in_padding, Precision::F32).expect("padding is not read"),
            vec![
                -0.5,
                f64::from(-0.6f32),
                f64::from(-0.7f32),
                f64::from(-0.8f32),
                f64::from(-0.9f32)
            ]
        );
        let error =
            padded(&[-0.5, -0.6, 0.0, -0.7, f64::NAN, 1e39], Precision::F32).expect_err("NaN");
        assert!(
            error.message.contains("element [1, 1] is NaN: not finite"),
            "{error}"
        );
        let error =
            padded(&[-0.5, -0.6, 0.0, -0.7, -0.8, 1e39], Precision::F32).expect_err("too large");
        assert!(
            error.message.starts_with("element [1, 2] is 1000000000000000000000000000000000000000: beyond the range of f32"),
            "{error}"
        );
        assert!(padded(&[-0.5, -0.6, 0.0, -0.7, -0.8, 1e39], Precision::F64).is_ok());
    }
}
