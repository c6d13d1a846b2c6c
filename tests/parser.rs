//! Parser tests: every construct of the grammar from a data file, operator precedence as a table of
//! one-liners, spans of every expression / item / name, and the wording and position of syntax errors.

use std::path::{Path, PathBuf};

use rlx_compiler::syntax::ast::{
    Arg, CriterionAttr, Expr, ExprKind, ImportSource, InputRole, InteractMode, Item, ItemKind,
    KeepLevel, LiteralValue, Module, RolloutValue, RubricEntry, RubricValue, UnaryOp,
};
use rlx_compiler::syntax::parse_module;
use rlx_compiler::{Diagnostic, FileId};
use serde_json::Value;

const FILE: FileId = FileId(0);

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|error| panic!("{}: {error}", path.display()))
}

fn parse(src: &str) -> Module {
    parse_module(FILE, src)
        .unwrap_or_else(|diagnostics| panic!("expected {src:?} to parse, got {diagnostics:#?}"))
}

fn parse_err(src: &str) -> Vec<Diagnostic> {
    match parse_module(FILE, src) {
        Ok(module) => panic!("expected {src:?} to fail, got {module:#?}"),
        Err(diagnostics) => {
            assert!(
                !diagnostics.is_empty(),
                "{src:?}: an error with no diagnostic"
            );
            diagnostics
        }
    }
}

/// The expression of `reward = <text>`.
fn parse_expr(text: &str) -> Expr {
    let src = format!("reward = {text}");
    let mut module = parse(&src);
    assert_eq!(module.items.len(), 1, "{src:?}");
    match module.items.remove(0).kind {
        ItemKind::Reward(expr) => expr,
        other => panic!("{src:?}: not a reward section: {other:?}"),
    }
}

/// The data files whose expressions the span tests walk: the construct file, the recipes, the stdlib.
fn corpus() -> Vec<(PathBuf, String)> {
    let mut files = vec![root().join("tests/parser/every_construct.rlx")];
    for dir in ["recipes", "stdlib"] {
        let mut found: Vec<PathBuf> = std::fs::read_dir(root().join(dir))
            .unwrap_or_else(|error| panic!("{dir}: {error}"))
            .map(|entry| entry.expect("directory entry").path())
            .filter(|path| path.extension().is_some_and(|ext| ext == "rlx"))
            .collect();
        found.sort();
        assert!(!found.is_empty(), "no .rlx file in {dir}");
        files.extend(found);
    }
    files
        .into_iter()
        .map(|path| {
            let text = read(&path);
            (path, text)
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Walking the tree

/// The direct sub-expressions of an expression (written here rather than borrowed from the parser).
fn sub_exprs(expr: &Expr) -> Vec<&Expr> {
    match &expr.kind {
        ExprKind::Number { .. } | ExprKind::Bool(_) | ExprKind::Name(_) | ExprKind::Other(_) => {
            Vec::new()
        }
        ExprKind::Unary { operand, .. } => vec![operand],
        ExprKind::Binary { lhs, rhs, .. } => vec![lhs, rhs],
        ExprKind::Paren(inner) => vec![inner],
        ExprKind::Call { args, .. } => args.iter().map(|arg| &arg.value).collect(),
        ExprKind::Index { base, .. } => vec![base],
        ExprKind::Block { lets, body } => lets
            .iter()
            .map(|local| &local.value)
            .chain([&**body])
            .collect(),
    }
}

/// The expressions written directly in an item (not their sub-expressions).
fn item_roots(item: &Item) -> Vec<&Expr> {
    match &item.kind {
        ItemKind::Import(_) | ItemKind::Input(_) | ItemKind::Param(_) | ItemKind::Rubric(_) => {
            Vec::new()
        }
        ItemKind::Fn(decl) => decl
            .params
            .iter()
            .filter_map(|param| param.default.as_ref())
            .chain([&decl.body])
            .collect(),
        ItemKind::Let(decl) => vec![&decl.value],
        ItemKind::Reward(expr) | ItemKind::Advantage(expr) | ItemKind::Loss(expr) => vec![expr],
        ItemKind::Metric { value, .. } => vec![value],
        ItemKind::Keep { condition, .. } => vec![condition],
        ItemKind::State(decl) => vec![&decl.update],
        ItemKind::Rollout(entries) => entries
            .iter()
            .filter_map(|entry| match &entry.value {
                RolloutValue::Expr(expr) => Some(expr),
                RolloutValue::Strings(_) => None,
            })
            .collect(),
    }
}

/// Every expression node of a module, parents before children.
fn all_exprs(module: &Module) -> Vec<&Expr> {
    let mut out = Vec::new();
    let mut stack: Vec<&Expr> = module.items.iter().flat_map(item_roots).collect();
    stack.reverse();
    while let Some(expr) = stack.pop() {
        out.push(expr);
        let mut children = sub_exprs(expr);
        children.reverse();
        stack.extend(children);
    }
    out
}

/// A serialised AST with every `span` and `*_span` key removed, so two trees compare by structure.
fn without_spans(value: Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.into_iter()
                .filter(|(key, _)| key != "span" && !key.ends_with("_span"))
                .map(|(key, value)| (key, without_spans(value)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.into_iter().map(without_spans).collect()),
        other => other,
    }
}

fn shape(expr: &Expr) -> Value {
    without_spans(serde_json::to_value(expr).expect("an Expr serialises"))
}

fn span_text<'s>(src: &'s str, value: &Value) -> &'s str {
    let start = value["start"].as_u64().expect("span.start") as usize;
    let end = value["end"].as_u64().expect("span.end") as usize;
    assert!(
        start <= end && end <= src.len(),
        "span {start}..{end} out of bounds"
    );
    &src[start..end]
}

/// Calls `visit(object)` for every JSON object in `value`.
fn visit_objects(value: &Value, visit: &mut dyn FnMut(&serde_json::Map<String, Value>)) {
    match value {
        Value::Object(map) => {
            visit(map);
            map.values().for_each(|child| visit_objects(child, visit));
        }
        Value::Array(items) => items.iter().for_each(|child| visit_objects(child, visit)),
        _ => {}
    }
}

// ---------------------------------------------------------------------------------------------
// Printing with every operation parenthesised

fn render(expr: &Expr) -> String {
    match &expr.kind {
        ExprKind::Number { text, .. } => text.clone(),
        ExprKind::Bool(value) => value.to_string(),
        ExprKind::Name(name) => name.name.clone(),
        ExprKind::Other(name) => format!("other.{}", name.name),
        ExprKind::Unary { op, operand } => match op {
            UnaryOp::Neg => format!("(-{})", render(operand)),
            UnaryOp::Not => format!("(not {})", render(operand)),
        },
        ExprKind::Binary { op, lhs, rhs } => {
            format!("({} {} {})", render(lhs), op.symbol(), render(rhs))
        }
        // Source parentheses only group; the rendering already shows the grouping.
        ExprKind::Paren(inner) => render(inner),
        ExprKind::Call { func, args, over } => {
            let args: Vec<String> = args.iter().map(render_arg).collect();
            let over = over.as_ref().map_or(String::new(), |over| {
                let axes: Vec<&str> = over.axes.iter().map(|axis| axis.name.as_str()).collect();
                format!(" over {}", axes.join(", "))
            });
            match args.split_first() {
                Some((first, rest)) if !over.is_empty() => {
                    let mut all = vec![format!("{first}{over}")];
                    all.extend(rest.iter().cloned());
                    format!("{}({})", func.name, all.join(", "))
                }
                _ => format!("{}({})", func.name, args.join(", ")),
            }
        }
        ExprKind::Index { base, criterion } => format!("{}[{}]", render(base), criterion.name),
        ExprKind::Block { lets, body } => {
            let mut parts: Vec<String> = lets
                .iter()
                .map(|local| format!("let {} = {}", local.name.name, render(&local.value)))
                .collect();
            parts.push(render(body));
            format!("{{ {} }}", parts.join("; "))
        }
    }
}

fn render_arg(arg: &Arg) -> String {
    match &arg.name {
        Some(name) => format!("{} = {}", name.name, render(&arg.value)),
        None => render(&arg.value),
    }
}

// ---------------------------------------------------------------------------------------------
// Every construct

fn kind_name(kind: &ItemKind) -> &'static str {
    match kind {
        ItemKind::Import(_) => "import",
        ItemKind::Input(_) => "input",
        ItemKind::Param(_) => "param",
        ItemKind::Fn(_) => "fn",
        ItemKind::Let(_) => "let",
        ItemKind::Rubric(_) => "rubric",
        ItemKind::Reward(_) => "reward",
        ItemKind::Advantage(_) => "advantage",
        ItemKind::Loss(_) => "loss",
        ItemKind::Metric { .. } => "metric",
        ItemKind::Keep { .. } => "keep",
        ItemKind::Rollout(_) => "rollout",
        ItemKind::State(_) => "state",
    }
}

fn every_construct() -> (String, Module) {
    let src = read(&root().join("tests/parser/every_construct.rlx"));
    let module = parse(&src);
    (src, module)
}

#[test]
fn every_construct_parses_with_items_in_order() {
    let (_, module) = every_construct();
    let kinds: Vec<&str> = module
        .items
        .iter()
        .map(|item| kind_name(&item.kind))
        .collect();
    let mut expected = vec!["import"; 5];
    expected.extend(["input"; 9]);
    expected.extend(["param"; 11]);
    expected.extend(["fn"; 3]);
    expected.extend([
        "let",
        "rubric",
        "reward",
        "advantage",
        "loss",
        "metric",
        "metric",
        "keep",
        "keep",
        "rollout",
        "state",
        "state",
    ]);
    assert_eq!(kinds, expected);
}

#[test]
fn every_construct_imports() {
    let (_, module) = every_construct();
    let imports: Vec<(ImportSource, Option<Vec<String>>)> = module
        .items
        .iter()
        .filter_map(|item| match &item.kind {
            ItemKind::Import(import) => Some((
                import.source.clone(),
                import
                    .names
                    .as_ref()
                    .map(|names| names.iter().map(|name| name.name.clone()).collect()),
            )),
            _ => None,
        })
        .collect();
    let names = |list: &[&str]| Some(list.iter().map(|name| name.to_string()).collect());
    assert_eq!(
        imports,
        vec![
            (ImportSource::Std("loss".into()), None),
            (
                ImportSource::Std("advantage".into()),
                names(&["group_zscore"])
            ),
            (
                ImportSource::Std("agg".into()),
                names(&["token_mean", "seq_mean_token_mean"])
            ),
            (ImportSource::Relative("./mine.rlx".into()), None),
            (
                ImportSource::Relative("./helpers/more.rlx".into()),
                names(&["helper_a", "helper_b"])
            ),
        ]
    );
}

#[test]
fn every_construct_inputs_and_params() {
    let (src, module) = every_construct();
    let inputs: Vec<String> = module
        .items
        .iter()
        .filter_map(|item| match &item.kind {
            ItemKind::Input(input) => {
                let axes: Vec<&str> = input.ty.axes.iter().map(|a| a.name.as_str()).collect();
                let role = match input.role {
                    Some(InputRole::Policy) => " policy",
                    Some(InputRole::Value) => " value",
                    None => "",
                };
                let default = input
                    .default
                    .as_ref()
                    .map_or(String::new(), |literal| format!(" = {}", literal.text));
                Some(format!(
                    "{}: {}[{}]{role}{default} @{}",
                    input.name.name,
                    input.ty.elem.name(),
                    axes.join(","),
                    &src[input.ty.span.range()],
                ))
            }
            _ => None,
        })
        .collect();
    assert_eq!(
        inputs,
        [
            "logp: f32[tok] policy @f32[tok]",
            "values: f32[tok] value @f32[tok]",
            "old_logp: f32[tok] @f32[tok]",
            "mask: bool[tok] = true @bool[tok]",
            "judged: f32[resp,style] = 0 @f32[resp, style]",
            "emb: f32[resp,dim] @f32[resp, dim]",
            "cluster: i32[resp] = -1 @i32[resp]",
            "points: f32[group,crit] = 0.5 @f32[group, crit]",
            "bias: f32[] = -inf @f32",
        ]
    );

    let params: Vec<(String, Option<&str>, String, LiteralValue)> = module
        .items
        .iter()
        .filter_map(|item| match &item.kind {
            ItemKind::Param(param) => Some((
                param.name.name.clone(),
                param.ty.map(|(elem, span)| {
                    assert_eq!(&src[span.range()], elem.name());
                    elem.name()
                }),
                param.value.text.clone(),
                param.value.value.clone(),
            )),
            _ => None,
        })
        .collect();
    let number = |value: f64, is_int: bool| LiteralValue::Number { value, is_int };
    let expected = vec![
        ("eps_low", None, "0.2", number(0.2, false)),
        ("eps_high", Some("f32"), "0.28", number(0.28, false)),
        ("clip_c", Some("f32"), "+3.0", number(3.0, false)),
        ("steps", Some("i32"), "-12", number(-12.0, true)),
        ("enabled", Some("bool"), "false", LiteralValue::Bool(false)),
        ("on", None, "true", LiteralValue::Bool(true)),
        ("hi", None, "inf", number(f64::INFINITY, false)),
        ("lo", Some("f32"), "-inf", number(f64::NEG_INFINITY, false)),
        ("tiny", None, "1e-6", number(1e-6, false)),
        ("big", None, "2.5E+3", number(2500.0, false)),
        ("dot", None, ".5", number(0.5, false)),
    ];
    let expected: Vec<(String, Option<&str>, String, LiteralValue)> = expected
        .into_iter()
        .map(|(name, ty, text, value)| (name.to_string(), ty, text.to_string(), value))
        .collect();
    assert_eq!(params, expected);
}

#[test]
fn every_construct_functions_and_blocks() {
    let (src, module) = every_construct();
    let fns: Vec<_> = module
        .items
        .iter()
        .filter_map(|item| match &item.kind {
            ItemKind::Fn(decl) => Some((item, decl)),
            _ => None,
        })
        .collect();
    let (item, clip) = fns[0];
    assert_eq!(clip.name.name, "clip_higher");
    assert_eq!(
        item.doc,
        ["A function with typed parameters, defaults, a return type and a block body."]
    );
    let params: Vec<String> = clip
        .params
        .iter()
        .map(|param| {
            let ty = param
                .ty
                .as_ref()
                .map_or(String::new(), |ty| format!(": {}", &src[ty.span.range()]));
            let default = param
                .default
                .as_ref()
                .map_or(String::new(), |default| format!(" = {}", render(default)));
            format!("{}{ty}{default}", param.name.name)
        })
        .collect();
    assert_eq!(
        params,
        [
            "r: f32[tok]",
            "a: f32[resp]",
            "lo: f32 = (1 - eps_low)",
            "hi = (1 + eps_high)"
        ]
    );
    assert_eq!(
        &src[clip.ret.as_ref().expect("a return type").span.range()],
        "f32[tok]"
    );
    assert_eq!(
        render(&clip.body),
        "{ let clipped = clamp(r, lo, hi); let worst = max(((-a) * r), ((-a) * clipped)); worst }"
    );
    assert!(matches!(fns[1].1.params.as_slice(), [p] if p.ty.is_none() && p.default.is_none()));
    assert!(fns[2].1.params.is_empty() && fns[2].1.ret.is_none());
}

#[test]
fn every_construct_rubric() {
    let (_, module) = every_construct();
    let rubric = module
        .items
        .iter()
        .find_map(|item| match &item.kind {
            ItemKind::Rubric(rubric) => Some(rubric),
            _ => None,
        })
        .expect("a rubric");
    assert_eq!(rubric.name.name, "style");
    let value = |value: &RubricValue| match value {
        RubricValue::Number(literal) => literal.text.clone(),
        RubricValue::Param(name) => format!("${}", name.name),
    };
    let shape = |call: &rlx_compiler::syntax::ast::ShapeCall| {
        let args: Vec<String> = call
            .args
            .iter()
            .map(|(key, arg)| format!("{}={}", key.name, value(arg)))
            .collect();
        if call.parens {
            format!("{}({})", call.name.name, args.join(","))
        } else {
            assert!(args.is_empty());
            call.name.name.clone()
        }
    };
    let entries: Vec<String> = rubric
        .entries
        .iter()
        .map(|entry| match entry {
            RubricEntry::Criteria(file) => format!("criteria {}", file.source.written()),
            RubricEntry::Criterion(criterion) => {
                let attrs: Vec<String> = criterion
                    .attrs
                    .iter()
                    .map(|attr| match attr {
                        CriterionAttr::Weight(v) => format!("weight {}", value(v)),
                        CriterionAttr::Points(v) => format!("points {}", value(v)),
                        CriterionAttr::Levels(levels, _) => {
                            let levels: Vec<&str> =
                                levels.iter().map(|level| level.text.as_str()).collect();
                            format!("levels [{}]", levels.join(","))
                        }
                        CriterionAttr::Veto(_) => "veto".to_string(),
                        CriterionAttr::Critical(_) => "critical".to_string(),
                        CriterionAttr::Saturate(call) => format!("saturate {}", shape(call)),
                    })
                    .collect();
                format!("criterion {} {}", criterion.name.name, attrs.join(" "))
                    .trim_end()
                    .to_string()
            }
            RubricEntry::Interact(interact) => format!(
                "interact {},{}:{} {}",
                interact.first.name,
                interact.second.name,
                match interact.mode {
                    None => "",
                    Some(InteractMode::Product) => "product",
                    Some(InteractMode::Min) => "min",
                },
                value(&interact.gamma)
            ),
            RubricEntry::Aggregate(name) => format!("aggregate {}", name.name),
            RubricEntry::OnVeto(call) => format!("on_veto {}", shape(call)),
            RubricEntry::Shape(call) => format!("shape {}", shape(call)),
        })
        .collect();
    assert_eq!(
        entries,
        [
            "criterion voice weight 3 levels [0,0.25,0.5,0.75,1]",
            "criterion grounded weight 2 saturate tanh(k=3)",
            "criterion structure points -1.5 weight $eps_low",
            "criterion flattering veto",
            "criterion capped saturate cap(kappa=0.8,floor=$eps_low) veto",
            "criterion plain critical",
            "interact voice,grounded: +0.5",
            "interact voice,structure:product 0.25",
            "interact grounded,structure:min $eps_high",
            "aggregate weighted_sum",
            "on_veto penalty(value=-1)",
            "shape power(gamma=2)",
            "shape identity()",
            "on_veto zero",
        ]
    );
}

#[test]
fn every_construct_sections_and_rollout() {
    let (src, module) = every_construct();
    let rendered: Vec<String> = module
        .items
        .iter()
        .filter_map(|item| match &item.kind {
            ItemKind::Reward(e) => Some(format!("reward {}", render(e))),
            ItemKind::Advantage(e) => Some(format!("advantage {}", render(e))),
            ItemKind::Loss(e) => Some(format!("loss {}", render(e))),
            ItemKind::Metric { name, value } => {
                Some(format!("metric {} {}", name.name, render(value)))
            }
            ItemKind::Keep {
                level,
                level_span,
                condition,
            } => {
                let word = match level {
                    KeepLevel::Group => "group",
                    KeepLevel::Resp => "resp",
                };
                assert_eq!(&src[level_span.range()], word);
                Some(format!("keep {word} {}", render(condition)))
            }
            _ => None,
        })
        .collect();
    assert_eq!(
        rendered,
        [
            "reward ((where(mask, (judged[voice] * 2), (-1)) + style(judged)) + { let t = 1; (t * 2) })",
            "advantage (group_zscore(reward, eps = 1e-4) - mean(reward over resp))",
            "loss ((token_mean(clip_higher(ratio, advantage)) + (0.001 * mean((-(ratio ^ 2)) over tok, batch))) \
             - (0.1 * mean((1 - cos(emb, other.emb)) over others)))",
            "metric clip_frac mean(((ratio < (1 - eps_low)) or (ratio > (1 + eps_high))) over tok, batch)",
            "metric bools mean(((((not (ratio == 1)) and (ratio != 2)) and (ratio <= 3)) and (ratio >= 0)) \
             over tok, batch)",
            "keep group (std(reward over resp) > 0)",
            "keep resp (not false)",
        ]
    );

    let rollout = module
        .items
        .iter()
        .find_map(|item| match &item.kind {
            ItemKind::Rollout(entries) => Some(entries),
            _ => None,
        })
        .expect("a rollout block");
    let entries: Vec<String> = rollout
        .iter()
        .map(|entry| match &entry.value {
            RolloutValue::Expr(expr) => format!("{} = {}", entry.key.name, render(expr)),
            RolloutValue::Strings(strings) => {
                for (_, span) in strings {
                    let text = &src[span.range()];
                    assert!(text.starts_with('"') && text.ends_with('"'), "{text:?}");
                }
                let strings: Vec<String> = strings.iter().map(|(s, _)| format!("{s:?}")).collect();
                format!("{} = [{}]", entry.key.name, strings.join(", "))
            }
        })
        .collect();
    assert_eq!(
        entries,
        [
            "n = 8",
            "temperature = 1.0",
            r#"modes = ["<think>", "say \"hi\"\n", "tab\tend\\"]"#,
            "empty = []",
            "share = (1 - progress)",
        ]
    );
}

#[test]
fn doc_comments_attach_to_the_next_item_only() {
    let (_, module) = every_construct();
    let documented: Vec<(&str, &[String])> = module
        .items
        .iter()
        .filter(|item| !item.doc.is_empty())
        .map(|item| (kind_name(&item.kind), item.doc.as_slice()))
        .collect();
    assert_eq!(documented.len(), 4, "{documented:?}");
    assert_eq!(documented[0].0, "input");
    assert_eq!(
        documented[0].1,
        ["The policy's log-probs.", "Two doc lines."]
    );
    assert_eq!(documented[1].0, "fn");
    assert_eq!(
        documented[2],
        ("metric", &["Logged every step.".to_string()][..])
    );
    assert_eq!(
        documented[3],
        (
            "state",
            &["An EMA of the reward, carried across steps.".to_string()][..]
        )
    );

    // `////` and `//` are comments; a `///` line must precede an item.
    let module = parse("//// not doc\n/// doc\n//plain\nparam a = 1 // trailing\n");
    assert_eq!(module.items[0].doc, ["doc"]);
    parse_err("param a = 1\n/// dangling doc comment\n");
}

// ---------------------------------------------------------------------------------------------
// Precedence

#[test]
fn precedence_table() {
    let cases = [
        ("-x^2", "(-(x ^ 2))"),
        ("-2 ^ 2", "(-(2 ^ 2))"),
        ("a - b - c", "((a - b) - c)"),
        ("a / b * c", "((a / b) * c)"),
        ("a - b + c", "((a - b) + c)"),
        ("2 ^ 3 ^ 2", "(2 ^ (3 ^ 2))"),
        ("2 ^ -1", "(2 ^ (-1))"),
        ("2 ^ -1 ^ 2", "(2 ^ (-(1 ^ 2)))"),
        ("-a ^ -b", "(-(a ^ (-b)))"),
        ("a * -b", "(a * (-b))"),
        ("a - -b", "(a - (-b))"),
        ("-a - b", "((-a) - b)"),
        ("- -a", "(-(-a))"),
        ("--a", "(-(-a))"),
        ("-a * b", "((-a) * b)"),
        ("not not a", "(not (not a))"),
        ("not a and b", "((not a) and b)"),
        ("not a < b", "(not (a < b))"),
        ("not a == b or c", "((not (a == b)) or c)"),
        ("not -a < b", "(not ((-a) < b))"),
        ("a or b and c", "(a or (b and c))"),
        ("a and b or c", "((a and b) or c)"),
        ("a or b or c", "((a or b) or c)"),
        ("a and not b", "(a and (not b))"),
        ("a + b * c ^ d", "(a + (b * (c ^ d)))"),
        ("a ^ b * c + d", "(((a ^ b) * c) + d)"),
        ("x[c] ^ 2", "(x[c] ^ 2)"),
        ("a ^ x[c]", "(a ^ x[c])"),
        ("-x[c]", "(-x[c])"),
        ("x[c][d]", "x[c][d]"),
        ("(a + b)[c]", "(a + b)[c]"),
        ("f(a)[c] * 2", "(f(a)[c] * 2)"),
        ("a + 1 < b * 2", "((a + 1) < (b * 2))"),
        ("a <= b + c * d - e", "(a <= ((b + (c * d)) - e))"),
        ("a == b and c != d", "((a == b) and (c != d))"),
        ("a >= b or a > c", "((a >= b) or (a > c))"),
        ("(a < b) == c", "((a < b) == c)"),
        ("a < (b < c)", "(a < (b < c))"),
        ("(a + b) * c", "((a + b) * c)"),
        ("a * (b + c)", "(a * (b + c))"),
        ("-(a + b)", "(-(a + b))"),
        ("f(a, b = c + 1) * 2", "(f(a, b = (c + 1)) * 2)"),
        (
            "mean(x * 2 over tok, batch) / n",
            "(mean((x * 2) over tok, batch) / n)",
        ),
        (
            "mean(a != other.a over others)",
            "mean((a != other.a) over others)",
        ),
        (
            "{ let y = a + b  y * y } ^ 2",
            "({ let y = (a + b); (y * y) } ^ 2)",
        ),
        (
            "true and false or not true",
            "((true and false) or (not true))",
        ),
        ("1.5e-3 * .5 + 2.", "((1.5e-3 * .5) + 2.)"),
        ("a+b*c", "(a + (b * c))"),
        ("notable and orange", "(notable and orange)"),
        ("a or\n b", "(a or b)"),
    ];
    let mut failures = Vec::new();
    for (src, expected) in cases {
        let got = render(&parse_expr(src));
        if got != expected {
            failures.push(format!("{src:?}: got {got}, expected {expected}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn comparison_chains_are_diagnosed() {
    for src in [
        "a < b < c",
        "a == b == c",
        "a < b == c",
        "a <= b >= c",
        "a + 1 < b != c * 2",
        "not a < b < c",
        "x and a > b > c",
    ] {
        let text = format!("reward = {src}");
        let diagnostics = parse_err(&text);
        assert_eq!(diagnostics.len(), 1, "{src:?}: {diagnostics:#?}");
        let diagnostic = &diagnostics[0];
        assert_eq!(diagnostic.code, "rlx::comparison_chain", "{src:?}");
        let span = diagnostic.primary_span().expect("a primary span");
        let underlined = &text[span.range()];
        assert!(
            underlined.matches(['<', '>', '=', '!']).count() >= 2,
            "{src:?}: the label should cover both comparisons, covers {underlined:?}"
        );
    }
    for src in [
        "(a < b) == c",
        "a < (b < c)",
        "a < b and b < c",
        "(a == b) != (c == d)",
    ] {
        parse_expr(src);
    }
}

// ---------------------------------------------------------------------------------------------
// Spans

#[test]
fn every_expression_span_reparses_to_the_same_tree() {
    let mut checked = 0;
    for (path, src) in corpus() {
        let module = parse(&src);
        for expr in all_exprs(&module) {
            let text = &src[expr.span.range()];
            let reparsed = parse_module(FILE, &format!("reward = {text}"));
            let reparsed = match reparsed {
                Ok(mut module) if module.items.len() == 1 => match module.items.remove(0).kind {
                    ItemKind::Reward(expr) => expr,
                    other => panic!("{}: {text:?} reparsed as {other:?}", path.display()),
                },
                other => panic!(
                    "{}: the span of {} is {text:?}, which does not reparse: {other:?}",
                    path.display(),
                    render(expr)
                ),
            };
            assert_eq!(
                shape(&reparsed),
                shape(expr),
                "{}: {text:?} is not the source of {}",
                path.display(),
                render(expr)
            );
            // The text carries no surrounding whitespace or comment.
            assert_eq!(text.trim(), text, "{}: {text:?}", path.display());
            checked += 1;
        }
    }
    assert!(checked > 300, "only {checked} expressions walked");
}

#[test]
fn nested_expression_spans() {
    let src = "reward = -f(a[c] * (b + 1), k = { let t = 2 ^ -x  t }) ^ 2 or not y";
    let module = parse(src);
    let texts: Vec<&str> = all_exprs(&module)
        .into_iter()
        .map(|expr| &src[expr.span.range()])
        .collect();
    assert_eq!(
        texts,
        [
            "-f(a[c] * (b + 1), k = { let t = 2 ^ -x  t }) ^ 2 or not y",
            "-f(a[c] * (b + 1), k = { let t = 2 ^ -x  t }) ^ 2",
            "f(a[c] * (b + 1), k = { let t = 2 ^ -x  t }) ^ 2",
            "f(a[c] * (b + 1), k = { let t = 2 ^ -x  t })",
            "a[c] * (b + 1)",
            "a[c]",
            "a",
            "(b + 1)",
            "b + 1",
            "b",
            "1",
            "{ let t = 2 ^ -x  t }",
            "2 ^ -x",
            "2",
            "-x",
            "x",
            "t",
            "2",
            "not y",
            "y",
        ]
    );
}

/// The first word of an item as written: its keyword.
fn keyword_of(kind: &ItemKind) -> &'static str {
    match kind {
        ItemKind::Metric { .. } => "metric",
        ItemKind::Keep { .. } => "keep",
        other => kind_name(other),
    }
}

#[test]
fn item_spans_cover_exactly_the_declaration() {
    for (path, src) in corpus() {
        let module = parse(&src);
        let mut previous_end = 0;
        for item in &module.items {
            let text = &src[item.span.range()];
            let name = path.display();
            assert!(
                text.starts_with(keyword_of(&item.kind)),
                "{name}: item span starts at {text:?}"
            );
            assert!(
                item.span.start as usize >= previous_end,
                "{name}: items overlap"
            );
            previous_end = item.span.end as usize;
            // No trailing blank or comment: the span ends on the declaration's last token.
            assert_eq!(
                text.trim_end(),
                text,
                "{name}: item span ends with blank: {text:?}"
            );
            let last_line = text.lines().last().unwrap_or("");
            assert!(
                !last_line.contains("//") || last_line.contains('"'),
                "{name}: item span ends with a comment: {text:?}"
            );
            // What follows the item on its line is a comment or nothing.
            let rest_of_line = src[item.span.end as usize..].lines().next().unwrap_or("");
            let rest = rest_of_line.trim_start();
            assert!(
                rest.is_empty() || rest.starts_with("//"),
                "{name}: the span of {text:?} stops before {rest:?}"
            );
        }
    }
    // A few exact ones.
    let src = "/// doc\nparam a = 1   // c\ninput x : f32[tok] policy  \n\nfn f(y) = y + 1 // c\n\
               import std/loss.{k3}  \nkeep group when x > 0 \n";
    let module = parse(src);
    let texts: Vec<&str> = module
        .items
        .iter()
        .map(|item| &src[item.span.range()])
        .collect();
    assert_eq!(
        texts,
        [
            "param a = 1",
            "input x : f32[tok] policy",
            "fn f(y) = y + 1",
            "import std/loss.{k3}",
            "keep group when x > 0",
        ]
    );
}

#[test]
fn names_and_literals_span_their_text() {
    let mut names = 0;
    for (path, src) in corpus() {
        let module = parse(&src);
        let value = serde_json::to_value(&module).expect("a Module serialises");
        visit_objects(&value, &mut |object| {
            let Some(span) = object.get("span") else {
                return;
            };
            // Ident: `{ name, span }`; Literal: `{ value, text, span }`.
            if let (Some(Value::String(name)), 2) = (object.get("name"), object.len()) {
                assert_eq!(span_text(&src, span), name, "{}", path.display());
                names += 1;
            }
            if let Some(Value::String(text)) = object.get("text") {
                assert_eq!(span_text(&src, span), text, "{}", path.display());
            }
            // Every span is trimmed.
            let text = span_text(&src, span);
            assert_eq!(text.trim(), text, "{}: span {text:?}", path.display());
        });
        // Number expressions carry their text too.
        for expr in all_exprs(&module) {
            if let ExprKind::Number { text, .. } = &expr.kind {
                assert_eq!(&src[expr.span.range()], text);
            }
        }
    }
    assert!(names > 200, "only {names} names checked");

    // Spans of the other named parts.
    let (src, module) = every_construct();
    for item in &module.items {
        match &item.kind {
            ItemKind::Import(import) => {
                let text = &src[import.source_span.range()];
                assert!(
                    text.starts_with("std/") || text.starts_with('"'),
                    "{text:?}"
                );
            }
            ItemKind::Rubric(rubric) => {
                for entry in &rubric.entries {
                    match entry {
                        RubricEntry::Criteria(file) => {
                            assert!(src[file.span.range()].starts_with("criteria "));
                        }
                        RubricEntry::Criterion(criterion) => {
                            let text = &src[criterion.span.range()];
                            assert!(text.starts_with("criterion "), "{text:?}");
                            assert_eq!(text.trim_end(), text, "criterion span {text:?}");
                            for attr in &criterion.attrs {
                                match attr {
                                    CriterionAttr::Levels(_, span) => {
                                        assert!(src[span.range()].starts_with("levels ["));
                                        assert!(src[span.range()].ends_with(']'));
                                    }
                                    CriterionAttr::Veto(span) => {
                                        assert_eq!(&src[span.range()], "veto")
                                    }
                                    CriterionAttr::Critical(span) => {
                                        assert_eq!(&src[span.range()], "critical")
                                    }
                                    CriterionAttr::Saturate(call) => {
                                        assert!(src[call.span.range()].ends_with(')'))
                                    }
                                    CriterionAttr::Weight(_) | CriterionAttr::Points(_) => {}
                                }
                            }
                        }
                        RubricEntry::Interact(interact) => {
                            let text = &src[interact.span.range()];
                            assert!(text.starts_with("interact "), "{text:?}");
                            assert_eq!(
                                &src[interact.gamma.span().range()],
                                text.rsplit(' ').next().expect("a coefficient")
                            );
                        }
                        RubricEntry::OnVeto(call) | RubricEntry::Shape(call) => {
                            let text = &src[call.span.range()];
                            assert!(text.starts_with(call.name.name.as_str()), "{text:?}");
                            assert_eq!(text.trim_end(), text, "shape span {text:?}");
                        }
                        RubricEntry::Aggregate(_) => {}
                    }
                }
            }
            ItemKind::Rollout(entries) => {
                for entry in entries {
                    let text = &src[entry.span.range()];
                    assert!(text.starts_with(entry.key.name.as_str()), "{text:?}");
                    assert_eq!(text.trim_end(), text, "rollout entry span {text:?}");
                    assert!(!text.ends_with(','), "rollout entry span {text:?}");
                }
            }
            _ => {}
        }
    }
    let call = parse_expr("mean(x over tok, batch )");
    let ExprKind::Call {
        over: Some(over), ..
    } = &call.kind
    else {
        panic!("a reduction")
    };
    let src = "reward = mean(x over tok, batch )";
    assert_eq!(&src[over.span.range()], "over tok, batch");
}

// ---------------------------------------------------------------------------------------------
// Syntax errors

/// The comma- or `or`-separated entries of an "expected …" list, split outside parentheses.
fn expected_entries(list: &str) -> Vec<String> {
    let mut entries = Vec::new();
    let mut depth = 0usize;
    let mut current = String::new();
    let mut rest = list;
    while let Some(c) = rest.chars().next() {
        if depth == 0 {
            if let Some(after) = rest
                .strip_prefix(", ")
                .or_else(|| rest.strip_prefix(" or "))
            {
                entries.push(std::mem::take(&mut current));
                rest = after;
                continue;
            }
        }
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            _ => {}
        }
        current.push(c);
        rest = &rest[c.len_utf8()..];
    }
    entries.push(current);
    entries
}

/// Parse `src`, expect one `rlx::syntax` error at byte `at`, and return its message. An error at the
/// end of the file is labelled on the last character before it (a label past the final newline would
/// not show), so there the label must end where the text does.
fn syntax_error_at(src: &str, at: usize) -> String {
    let diagnostics = parse_err(src);
    assert_eq!(diagnostics.len(), 1, "{src:?}: {diagnostics:#?}");
    let diagnostic = &diagnostics[0];
    assert_eq!(diagnostic.code, "rlx::syntax", "{src:?}: {diagnostic:#?}");
    let span = diagnostic.primary_span().expect("a primary span");
    let (start, end) = (span.start as usize, span.end as usize);
    let text_end = src.trim_end().len();
    if at >= text_end {
        assert!(
            end == text_end && start < end && src[start..end].chars().count() == 1,
            "{src:?}: an error at the end of the file is labelled {start}..{end}, \
             not on the last character before {text_end}"
        );
        assert!(diagnostic.message.ends_with("found end of file"), "{src:?}");
    } else {
        assert_eq!(
            start,
            at,
            "{src:?}: error at {start}, expected at {at} ({:?} | {:?})",
            &src[..at],
            &src[at..]
        );
    }
    assert!(span.end as usize <= src.len());
    let message = &diagnostic.message;
    let expected = message
        .split_once("expected ")
        .and_then(|(_, rest)| rest.rsplit_once(", found "))
        .map(|(list, _)| list)
        .unwrap_or_else(|| panic!("{src:?}: message {message:?} lacks `expected …, found …`"));
    let entries = expected_entries(expected);
    let mut unique = entries.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(
        unique.len(),
        entries.len(),
        "{src:?}: repeated entries in {message:?}"
    );
    assert!(
        entries.iter().all(|entry| !entry.trim().is_empty()),
        "{message:?}"
    );
    message.clone()
}

#[test]
fn syntax_errors_point_at_the_right_byte() {
    // (source, byte of the error, what the message must say was found)
    let cases: &[(&str, usize, &str)] = &[
        ("reward = ", 9, "found end of file"),
        ("reward =", 8, "found end of file"),
        ("loss = (a + b", 13, "found end of file"),
        ("loss = (a + b\n", 14, "found end of file"),
        ("reward = 1 +* 2", 12, "found `*`"),
        ("reward = a b", 11, "found `b`"),
        ("reward = f(a,, b)", 13, "found `,`"),
        ("input x f32[tok]", 8, "found `f32`"),
        ("input x : f64[tok]", 10, "found `f64`"),
        ("param p = x", 10, "found `x`"),
        ("param = 1", 6, "found `=`"),
        ("let let = 1", 4, "found `let`"),
        ("fn f(x = ) = x", 9, "found `)`"),
        ("keep batch when x", 5, "found `batch`"),
        ("reward = a && b", 11, "found `&`"),
        ("reward = a\n# comment\n", 11, "found `#`"),
        ("rubric r { criterion c weight }", 30, "found `}`"),
        ("rubric r { interact a b : 1 }", 22, "found `b`"),
        ("rollout { n = [1] }", 15, "found `1`"),
        ("metric = 1", 7, "found `=`"),
        ("reward = x\n  )", 13, "found `)`"),
        ("import std/loss.{}", 17, "found `}`"),
        ("reward = mean(x over )", 21, "found `)`"),
        ("reward = \"text\"", 9, "found `\"`"),
        ("reward = 1\nloss = ", 18, "found end of file"),
        ("reward = é", 9, "found `é`"),
    ];
    for &(src, at, found) in cases {
        let message = syntax_error_at(src, at);
        assert!(
            message.ends_with(found),
            "{src:?}: message {message:?} should end with {found:?}"
        );
    }
}

#[test]
fn syntax_errors_say_what_was_expected() {
    let message = syntax_error_at("reward = ", 9);
    assert!(message.contains("expected an expression"), "{message}");
    let message = syntax_error_at("input x : f32[tok", 17);
    assert!(
        message.contains("`]`") && message.contains("`,`"),
        "{message}"
    );
    let message = syntax_error_at("input x f32[tok]", 8);
    assert!(message.contains("expected `:`"), "{message}");
    let message = syntax_error_at("keep when x", 5);
    assert!(message.contains("`group` or `resp`"), "{message}");
    let message = syntax_error_at("loss = (a + b", 13);
    assert!(
        message.contains("`)`"),
        "the missing parenthesis is not named: {message}"
    );
    let message = syntax_error_at("reward = f(a", 12);
    assert!(
        message.contains("`)`"),
        "the missing parenthesis is not named: {message}"
    );
    let message = syntax_error_at("param p 1", 8);
    assert!(
        message.contains("`=`"),
        "the missing `=` is not named: {message}"
    );
}

#[test]
fn reserved_words_and_foreign_operators_get_help() {
    let diagnostics = parse_err("let over = 1");
    let help = diagnostics[0].help.as_deref().unwrap_or("");
    assert!(help.contains("`over` is a reserved word"), "{help:?}");
    let diagnostics = parse_err("reward = a || b");
    let help = diagnostics[0].help.as_deref().unwrap_or("");
    assert!(help.contains("`or`"), "{help:?}");
    let diagnostics = parse_err("reward = !a");
    let help = diagnostics[0].help.as_deref().unwrap_or("");
    assert!(help.contains("`not`"), "{help:?}");
}

#[test]
fn limits_are_diagnosed_by_the_parser() {
    let deep = format!("reward = {}1{}", "(".repeat(65), ")".repeat(65));
    let diagnostics = parse_err(&deep);
    assert_eq!(diagnostics[0].code, "rlx::too_deep");
    let ok = format!("reward = {}1{}", "(".repeat(60), ")".repeat(60));
    parse(&ok);
    let diagnostics = parse_err("reward = 99999999999");
    assert_eq!(diagnostics[0].code, "rlx::bad_number");
    assert_eq!(
        diagnostics[0].primary_span().map(|s| s.range()),
        Some(9..20)
    );
    let diagnostics = parse_err("reward = 1e999");
    assert_eq!(diagnostics[0].code, "rlx::bad_number");
    parse("reward = 2147483647");
}
#[test]
fn deep_operator_chains_do_not_overflow_the_callers_stack() {
    // `parse_module` is also called outside `check_source` (formatter, `rlxc --emit ast`), from
    // ordinary stacks: run it on a small one.
    let worker = std::thread::Builder::new()
        .stack_size(512 << 10)
        .spawn(|| {
            let mut codes = Vec::new();
            for text in [
                format!("reward = {}x\n", "-".repeat(200_000)),
                format!("reward = {}x\n", "not ".repeat(100_000)),
                format!("reward = 2{}\n", "^2".repeat(100_000)),
                format!("reward = x{}\n", " + x".repeat(100_000)),
                format!("reward = x{}\n", "[c]".repeat(100_000)),
            ] {
                let diagnostics = parse_module(FILE, &text).expect_err("too deep");
                codes.push(diagnostics[0].code);
            }
            // Within the limit: returned, walked and dropped on the small stack.
            let module = parse(&format!("reward = {}x\n", "-".repeat(200)));
            assert_eq!(all_exprs(&module).len(), 201);
            codes
        })
        .expect("a thread");
    let codes = worker.join().expect("no overflow, no panic");
    assert_eq!(codes, ["rlx::too_deep"; 5]);
}

/// A call's name touches its `(`: a parenthesised block body is not an argument list.
#[test]
fn a_parenthesised_block_body_is_not_a_call() {
    let text = "input x : f32[resp]\nfn f(a) = { let y = a\n  (y + 1) * 2 }\nreward = f(x)\n";
    let checked = rlx_compiler::check_source("call_name.rlx", text);
    assert!(!checked.has_errors(), "{:?}", checked.diagnostics);
    let spaced =
        rlx_compiler::check_source("spaced.rlx", "input x : f32[resp]\nreward = exp (x)\n");
    assert!(spaced.has_errors(), "`exp (x)` must not parse as a call");
}
