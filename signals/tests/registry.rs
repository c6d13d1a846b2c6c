//! The registry on small batches: every kind computed, flattened in the runtime's element order,
//! with fake judge and embedding models.

use std::cell::RefCell;

use rlx_signals::data::{Criterion, PromptInstruction};
use rlx_signals::ifeval::Instruction;
use rlx_signals::judge::{format_conversation, render, DEFAULT_TEMPLATE};
use rlx_signals::types::{Elem, Feature, InputDecl, Level};
use rlx_signals::{Completion, Embed, Group, Message, Models, Prompt, Registry, YesNo};
use serde_json::{json, Map, Value};

fn c(text: &str, tokens: usize) -> Completion {
    Completion {
        text: text.into(),
        tokens,
    }
}

fn decl(name: &str, elem: Elem, level: Level, feature: Feature) -> InputDecl {
    InputDecl::new(name, elem, level, feature)
}

fn resp(name: &str, elem: Elem) -> InputDecl {
    decl(name, elem, Level::Resp, Feature::None)
}

fn arith(id: &str, answer: &str) -> Prompt {
    Prompt {
        answer: Some(answer.into()),
        ..Prompt::user(id, "What is it?")
    }
}

#[test]
fn answers_regex_contains_length() {
    let p1 = arith("a", "42");
    let p2 = arith("b", "Paris");
    let g1 = [c("17+25=42", 7), c("it is 41", 4), c(r"\boxed{42.0}", 5)];
    let g2 = [c("The answer is paris.", 6), c("London", 1)];
    let groups = [
        Group {
            prompt: &p1,
            completions: &g1,
        },
        Group {
            prompt: &p2,
            completions: &g2,
        },
    ];
    let inputs = [
        resp("exact", Elem::F32),
        resp("digits", Elem::I32),
        resp("has_is", Elem::Bool),
        resp("words", Elem::F32),
        resp("short", Elem::Bool),
        resp("toks", Elem::I32),
    ];
    let reg = Registry::from_toml(
        r#"
        [signals.exact]
        kind = "exact_answer"
        [signals.digits]
        kind = "regex"
        pattern = "[0-9]"
        output = "count"
        [signals.has_is]
        kind = "contains"
        keywords = ["IS"]
        whole_word = true
        [signals.words]
        kind = "length"
        unit = "words"
        [signals.short]
        kind = "length"
        unit = "chars"
        max = 8
        [signals.toks]
        kind = "length"
        unit = "tokens"
        "#,
        &inputs,
    )
    .unwrap();
    let out = reg.compute(&groups, &Models::default()).unwrap();
    assert_eq!(out.crit_counts, None);
    assert_eq!(out.dim, None);
    // exact: "42" last number ✓; "41" ✗; boxed "42.0" ≠ "42" as strings ✗; "paris" ✓; "London" ✗.
    assert_eq!(
        out.get("exact").unwrap().data,
        vec![1.0, 0.0, 0.0, 1.0, 0.0]
    );
    assert_eq!(
        out.get("digits").unwrap().data,
        vec![6.0, 2.0, 3.0, 0.0, 0.0]
    );
    assert_eq!(
        out.get("has_is").unwrap().data,
        vec![0.0, 1.0, 0.0, 1.0, 0.0]
    );
    // words: "17", "25", "42" | "it", "is", "41" | "boxed", "42", "0" | 4 | 1
    assert_eq!(
        out.get("words").unwrap().data,
        vec![3.0, 3.0, 3.0, 4.0, 1.0]
    );
    assert_eq!(
        out.get("short").unwrap().data,
        vec![1.0, 1.0, 0.0, 0.0, 1.0]
    );
    assert_eq!(out.get("toks").unwrap().data, vec![7.0, 4.0, 5.0, 6.0, 1.0]);
    assert!((out.get("exact").unwrap().mean() - 0.4).abs() < 1e-12);
}

#[test]
fn numeric_answer_and_missing_reference() {
    let p = arith("a", "1/3");
    let g = [c("0.333", 1), c("0.3", 1)];
    let groups = [Group {
        prompt: &p,
        completions: &g,
    }];
    let inputs = [resp("ok", Elem::Bool)];
    let reg = Registry::from_toml(
        "[signals.ok]\nkind = \"numeric_answer\"\nabs_tol = 0.001\n",
        &inputs,
    )
    .unwrap();
    let out = reg.compute(&groups, &Models::default()).unwrap();
    assert_eq!(out.values[0].data, vec![1.0, 0.0]);

    let bad = arith("q7", "about three");
    let groups = [Group {
        prompt: &bad,
        completions: &g,
    }];
    assert_eq!(
        reg.compute(&groups, &Models::default())
            .unwrap_err()
            .to_string(),
        "signal `ok`: prompt `q7`: reference answer `about three` is not a number"
    );
    let none = Prompt::user("q8", "hi");
    let groups = [Group {
        prompt: &none,
        completions: &g,
    }];
    assert_eq!(
        reg.compute(&groups, &Models::default())
            .unwrap_err()
            .to_string(),
        "signal `ok`: prompt `q8` has no reference answer"
    );
}

fn instr(id: &str, kwargs: Value) -> PromptInstruction {
    let kwargs: Map<String, Value> = kwargs.as_object().cloned().unwrap();
    PromptInstruction {
        id: id.into(),
        check: Instruction::from_id(id, &kwargs).unwrap(),
        kwargs,
    }
}

#[test]
fn ifeval_from_the_prompt_each_and_all() {
    let mut p1 = Prompt::user("p1", "no commas, 3+ words");
    p1.instructions = vec![
        instr("punctuation:no_comma", json!({})),
        instr(
            "length_constraints:number_words",
            json!({"relation": "at least", "num_words": 3}),
        ),
    ];
    let mut p2 = Prompt::user("p2", "end with bye");
    p2.instructions = vec![instr("startend:end_checker", json!({"end_phrase": "bye"}))];
    let g1 = [
        c("one two three", 3),
        c("one, two", 3),
        c("one, two, three", 3),
    ];
    let g2 = [c("ok bye", 2), c("bye ok", 2)];
    let groups = [
        Group {
            prompt: &p1,
            completions: &g1,
        },
        Group {
            prompt: &p2,
            completions: &g2,
        },
    ];
    let inputs = [
        decl("follows", Elem::F32, Level::Resp, Feature::Crit),
        resp("all", Elem::Bool),
    ];
    let reg = Registry::from_toml(
        "[signals.follows]\nkind = \"ifeval\"\noutput = \"each\"\n[signals.all]\nkind = \"ifeval\"\n",
        &inputs,
    )
    .unwrap();
    let out = reg.compute(&groups, &Models::default()).unwrap();
    assert_eq!(out.crit_counts, Some(vec![2, 1]));
    // For each response, its group's criteria: p1 has 2, p2 has 1.
    assert_eq!(
        out.get("follows").unwrap().data,
        vec![1.0, 1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0]
    );
    assert_eq!(out.get("all").unwrap().data, vec![1.0, 0.0, 0.0, 1.0, 0.0]);

    // A prompt with nothing to check is an error for the combined verdict.
    let mut p3 = Prompt::user("p3", "x");
    p3.unsupported = vec!["language:response_language".into()];
    let g3 = [c("x", 1)];
    let groups = [Group {
        prompt: &p3,
        completions: &g3,
    }];
    assert_eq!(
        reg.compute(&groups, &Models::default()).unwrap_err().to_string(),
        "signal `all`: prompt `p3` has no IFEval instruction to check (unsupported: language:response_language)"
    );
}

#[test]
fn fixed_checks_fill_a_rubric_in_its_order() {
    let p = Prompt::user("p", "x");
    let g = [
        c("short, polite", 2),
        c("a much longer answer without commas", 6),
    ];
    let groups = [Group {
        prompt: &p,
        completions: &g,
    }];
    let inputs = [decl(
        "judged",
        Elem::F32,
        Level::Resp,
        Feature::Rubric {
            name: "style".into(),
            criteria: vec!["short".into(), "no_comma".into()],
        },
    )];
    let reg = Registry::from_toml(
        r#"
        [signals.judged]
        kind = "ifeval"
        output = "each"
        [[signals.judged.checks]]
        id = "punctuation:no_comma"
        name = "no_comma"
        [[signals.judged.checks]]
        id = "length_constraints:number_words"
        name = "short"
        relation = "less than"
        num_words = 4
        "#,
        &inputs,
    )
    .unwrap();
    let out = reg.compute(&groups, &Models::default()).unwrap();
    // Rubric order: short, no_comma.
    assert_eq!(out.values[0].data, vec![1.0, 0.0, 0.0, 1.0]);
    // A rubric axis is not `crit`: no criterion counts.
    assert_eq!(out.crit_counts, None);
}

/// Answers P(yes) = 0.9 when the response contains the criterion's first word, else 0.2; records the
/// prompts it was asked.
struct KeywordJudge {
    asked: RefCell<Vec<String>>,
}

impl YesNo for KeywordJudge {
    fn p_yes(&self, prompts: &[String]) -> Result<Vec<f64>, String> {
        self.asked.borrow_mut().extend(prompts.iter().cloned());
        Ok(prompts
            .iter()
            .map(|p| {
                let crit = p
                    .split("# Rubric item\n")
                    .nth(1)
                    .unwrap()
                    .lines()
                    .next()
                    .unwrap();
                let resp = p
                    .split("\nassistant: ")
                    .last()
                    .unwrap()
                    .split("\n\n# Rubric")
                    .next()
                    .unwrap();
                let key = crit.split_whitespace().next().unwrap().to_lowercase();
                if resp.to_lowercase().contains(&key) {
                    0.9
                } else {
                    0.2
                }
            })
            .collect())
    }
}

fn rubric_prompt(id: &str, items: &[(&str, f64)]) -> Prompt {
    Prompt {
        rubric: items
            .iter()
            .map(|(t, p)| Criterion {
                text: t.to_string(),
                points: *p,
                tags: vec![],
            })
            .collect(),
        ..Prompt::user(id, "Question?")
    }
}

#[test]
fn judge_and_points_fill_healthbench_inputs() {
    let p1 = rubric_prompt(
        "h1",
        &[("Rest is advised", 5.0), ("Panic is induced", -3.0)],
    );
    let p2 = rubric_prompt("h2", &[("Water helps", 4.0)]);
    let g1 = [c("Get rest.", 3), c("Panic now!", 3)];
    let g2 = [c("Drink water.", 3)];
    let groups = [
        Group {
            prompt: &p1,
            completions: &g1,
        },
        Group {
            prompt: &p2,
            completions: &g2,
        },
    ];
    let inputs = [
        decl("met", Elem::Bool, Level::Resp, Feature::Crit),
        decl("p_met", Elem::F32, Level::Resp, Feature::Crit),
        decl("points", Elem::F32, Level::Group, Feature::Crit),
    ];
    let reg = Registry::from_toml(
        "[signals.met]\nkind = \"judge\"\noutput = \"verdict\"\n[signals.p_met]\nkind = \"judge\"\n[signals.points]\nkind = \"points\"\n",
        &inputs,
    )
    .unwrap();
    let judge = KeywordJudge {
        asked: RefCell::new(vec![]),
    };
    let models = Models {
        judge: Some(&judge),
        embedder: None,
    };
    let out = reg.compute(&groups, &models).unwrap();
    assert_eq!(out.crit_counts, Some(vec![2, 1]));
    assert_eq!(out.get("met").unwrap().data, vec![1.0, 0.0, 0.0, 1.0, 1.0]);
    assert_eq!(
        out.get("p_met").unwrap().data,
        vec![0.9, 0.2, 0.2, 0.9, 0.9]
    );
    assert_eq!(out.get("points").unwrap().data, vec![5.0, -3.0, 4.0]);
    // The exact prompt of the first question, from the documented template.
    let asked = judge.asked.borrow();
    assert_eq!(asked.len(), 10);
    assert_eq!(
        asked[0],
        render(
            DEFAULT_TEMPLATE,
            &format_conversation(&p1.messages),
            "Get rest.",
            "Rest is advised"
        )
    );
    assert!(asked[0].contains(
        "# Conversation\nuser: Question?\nassistant: Get rest.\n\n# Rubric item\nRest is advised\n"
    ));

    // Without a judge: an error naming what is missing.
    assert_eq!(
        reg.compute(&groups, &Models::default())
            .unwrap_err()
            .to_string(),
        "signal `met`: needs a judge model (a `YesNo` implementation), but none was given"
    );
}

struct BadJudge(Vec<f64>);
impl YesNo for BadJudge {
    fn p_yes(&self, _prompts: &[String]) -> Result<Vec<f64>, String> {
        Ok(self.0.clone())
    }
}

#[test]
fn judge_answers_are_checked() {
    let p = rubric_prompt("h", &[("A", 1.0)]);
    let g = [c("x", 1)];
    let groups = [Group {
        prompt: &p,
        completions: &g,
    }];
    let inputs = [decl("m", Elem::F32, Level::Resp, Feature::Crit)];
    let reg = Registry::from_toml("[signals.m]\nkind = \"judge\"\n", &inputs).unwrap();
    let run = |j: &BadJudge| {
        reg.compute(
            &groups,
            &Models {
                judge: Some(j),
                embedder: None,
            },
        )
        .unwrap_err()
        .to_string()
    };
    assert_eq!(
        run(&BadJudge(vec![])),
        "signal `m`: judge returned 0 probabilities for 1 questions"
    );
    assert_eq!(
        run(&BadJudge(vec![f64::NAN])),
        "signal `m`: judge returned P(yes) = NaN for question 0; expected a probability in [0, 1]"
    );
    assert_eq!(
        run(&BadJudge(vec![1.5])),
        "signal `m`: judge returned P(yes) = 1.5 for question 0; expected a probability in [0, 1]"
    );
}

#[test]
fn crit_signals_must_agree_per_prompt() {
    let mut p = rubric_prompt("h", &[("A", 1.0), ("B", 2.0)]);
    p.instructions = vec![instr("punctuation:no_comma", json!({}))];
    let g = [c("x", 1)];
    let groups = [Group {
        prompt: &p,
        completions: &g,
    }];
    let inputs = [
        decl("points", Elem::F32, Level::Group, Feature::Crit),
        decl("follows", Elem::Bool, Level::Resp, Feature::Crit),
    ];
    let reg = Registry::from_toml(
        "[signals.points]\nkind = \"points\"\n[signals.follows]\nkind = \"ifeval\"\noutput = \"each\"\n",
        &inputs,
    )
    .unwrap();
    assert_eq!(
        reg.compute(&groups, &Models::default()).unwrap_err().to_string(),
        "signal `points`: has 2 criteria for prompt `h` but signal `follows` has 1; every `crit` input of a batch shares one criterion list per prompt"
    );
}

/// Embeds a text as (number of `a`, number of `b`) + a small constant, so texts with the same letters
/// are parallel.
struct LetterEmbed;
impl Embed for LetterEmbed {
    fn embed(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, String> {
        Ok(texts
            .iter()
            .map(|t| {
                vec![
                    t.matches('a').count() as f32 + 0.01,
                    t.matches('b').count() as f32,
                ]
            })
            .collect())
    }
}

#[test]
fn partition_and_embedding_per_group() {
    let p1 = Prompt::user("p1", "x");
    let p2 = Prompt::user("p2", "y");
    let g1 = [c("aa", 1), c("bb", 1), c("aaa", 1), c("b", 1)];
    let g2 = [c("b", 1), c("ab", 1)];
    let groups = [
        Group {
            prompt: &p1,
            completions: &g1,
        },
        Group {
            prompt: &p2,
            completions: &g2,
        },
    ];
    let inputs = [
        resp("cluster", Elem::I32),
        decl("emb", Elem::F32, Level::Resp, Feature::Dim),
    ];
    let reg = Registry::from_toml(
        "[signals.cluster]\nkind = \"partition\"\nthreshold = 0.99\n[signals.emb]\nkind = \"embedding\"\n",
        &inputs,
    )
    .unwrap();
    let out = reg
        .compute(
            &groups,
            &Models {
                judge: None,
                embedder: Some(&LetterEmbed),
            },
        )
        .unwrap();
    // Ids restart in every group, numbered by first appearance.
    assert_eq!(
        out.get("cluster").unwrap().data,
        vec![0.0, 1.0, 0.0, 1.0, 0.0, 1.0]
    );
    assert_eq!(out.dim, Some(2));
    let emb = &out.get("emb").unwrap().data;
    assert_eq!(emb.len(), 12);
    assert_eq!(emb[0], 2.01f32 as f64);
    assert_eq!(emb[1], 0.0);
    assert_eq!(
        reg.compute(&groups, &Models::default()).unwrap_err().to_string(),
        "signal `cluster`: needs an embedding model (an `Embed` implementation), but none was given"
    );
}

/// `similarity` fills a pair input: per response, its n − 1 values with the others of its group.
#[test]
fn similarity_fills_pair_inputs_in_the_packed_pair_order() {
    let p1 = Prompt::user("p1", "x");
    let p2 = Prompt::user("p2", "y");
    let g1 = [c("aa", 1), c("bb", 1), c("aaa", 1)];
    let g2 = [c("b", 1)];
    let groups = [
        Group {
            prompt: &p1,
            completions: &g1,
        },
        Group {
            prompt: &p2,
            completions: &g2,
        },
    ];
    let inputs = [
        decl("same", Elem::Bool, Level::Pair, Feature::None),
        decl("sim", Elem::F32, Level::Pair, Feature::None),
    ];
    let reg = Registry::from_toml(
        "[signals.same]\nkind = \"similarity\"\nthreshold = 0.99\n[signals.sim]\nkind = \"similarity\"\n",
        &inputs,
    )
    .unwrap();
    let models = Models {
        judge: None,
        embedder: Some(&LetterEmbed),
    };
    let out = reg.compute(&groups, &models).unwrap();
    // "aa" and "aaa" are parallel, "bb" is orthogonal to both; the singleton group has no pair.
    assert_eq!(
        out.get("same").unwrap().data,
        vec![0.0, 1.0, 0.0, 0.0, 1.0, 0.0]
    );
    let sim = &out.get("sim").unwrap().data;
    assert_eq!(sim.len(), 6);
    let (aa, bb) = ([2.01f64, 0.0], [0.01f64, 2.0]);
    let cos = (aa[0] * bb[0] + aa[1] * bb[1])
        / ((aa[0] * aa[0] + aa[1] * aa[1]) * (bb[0] * bb[0] + bb[1] * bb[1])).sqrt();
    assert!((sim[0] - cos).abs() < 1e-6, "{sim:?}");
    assert!((sim[1] - 1.0).abs() < 1e-12, "{sim:?}");
    assert_eq!(sim[0], sim[2], "the cosine is symmetric");
    // A pair signal does not fit a response input, and a cosine is no verdict.
    let error = Registry::from_toml(
        "[signals.q]\nkind = \"similarity\"\n",
        &[resp("q", Elem::F32)],
    )
    .unwrap_err()
    .to_string();
    assert!(
        error.contains("f32[pair]") && error.contains("f32[resp]"),
        "{error}"
    );
    let error = Registry::from_toml("[signals.same]\nkind = \"similarity\"\n", &inputs[..1])
        .unwrap_err()
        .to_string();
    assert!(error.contains("does not convert"), "{error}");
    let error = Registry::from_toml(
        "[signals.same]\nkind = \"similarity\"\nthreshold = 2\n",
        &inputs[..1],
    )
    .unwrap_err()
    .to_string();
    assert!(error.contains("[-1, 1]"), "{error}");
}

#[test]
fn messages_format_like_healthbench() {
    let m = vec![
        Message {
            role: "user".into(),
            content: "Hi".into(),
        },
        Message {
            role: "assistant".into(),
            content: "Hello".into(),
        },
    ];
    assert_eq!(format_conversation(&m), "user: Hi\nassistant: Hello");
    assert_eq!(
        render(
            "{{literal}} {criterion}: {response}",
            "",
            "R {criterion}",
            "C"
        ),
        "{literal} C: R {criterion}"
    );
}
