//! Signal specs from TOML: strict parsing and validation, with the messages asserted.

use rlx_signals::spec::parse_toml;
use rlx_signals::types::{Elem, Feature, InputDecl, Level};
use rlx_signals::Registry;

fn inputs() -> Vec<InputDecl> {
    vec![
        InputDecl::new("correct", Elem::Bool, Level::Resp, Feature::None),
        InputDecl::new("score", Elem::F32, Level::Resp, Feature::None),
        InputDecl::new("count", Elem::I32, Level::Resp, Feature::None),
        InputDecl::new("met", Elem::Bool, Level::Resp, Feature::Crit),
        InputDecl::new("points", Elem::F32, Level::Group, Feature::Crit),
        InputDecl::new("emb", Elem::F32, Level::Resp, Feature::Dim),
        InputDecl::new("logp", Elem::F32, Level::Tok, Feature::None),
        InputDecl::new(
            "judged",
            Elem::F32,
            Level::Resp,
            Feature::Rubric {
                name: "style".into(),
                criteria: vec!["short".into(), "polite".into()],
            },
        ),
    ]
}

fn error(toml: &str) -> String {
    match Registry::from_toml(toml, &inputs()) {
        Ok(_) => panic!("accepted:\n{toml}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn a_full_config_binds() {
    let reg = Registry::from_toml(
        r#"
        [signals.correct]
        kind = "numeric_answer"
        abs_tol = 1e-4

        [signals.count]
        kind = "regex"
        pattern = "\\d+"
        output = "count"

        [signals.score]
        kind = "exact_answer"

        [signals.met]
        kind = "judge"
        output = "verdict"
        threshold = 0.6

        [signals.points]
        kind = "points"

        [signals.emb]
        kind = "embedding"
        text = "answer"

        [signals.judged]
        kind = "ifeval"
        output = "each"
        [[signals.judged.checks]]
        id = "punctuation:no_comma"
        name = "polite"
        [[signals.judged.checks]]
        id = "length_constraints:number_words"
        name = "short"
        relation = "less than"
        num_words = 50
        "#,
        &inputs(),
    )
    .unwrap();
    let names: Vec<&str> = reg.inputs().collect();
    assert_eq!(
        names,
        vec!["correct", "count", "emb", "judged", "met", "points", "score"]
    );
    assert!(reg.needs_judge());
    assert!(reg.needs_embedder());
    assert_eq!(reg.output_type("count").unwrap().to_string(), "i32[resp]");
    assert_eq!(
        reg.output_type("met").unwrap().to_string(),
        "bool[resp, crit]"
    );
    assert_eq!(
        reg.output_type("judged").unwrap().to_string(),
        "bool[resp, <polite, short>]"
    );
}

#[test]
fn unknown_kind_and_keys_are_errors() {
    let e = error("[signals.correct]\nkind = \"exact\"\n");
    assert!(e.starts_with("signal config: "), "{e}");
    assert!(
        e.contains("unknown variant `exact`, expected one of `exact_answer`, `numeric_answer`, `regex`, `contains`, `length`, `ifeval`, `partition`, `embedding`, `similarity`, `judge`, `points`, `wrong_script`"),
        "{e}"
    );
    let e = error("[signals.correct]\nkind = \"regex\"\npatern = \"a\"\n");
    assert!(
        e.contains(
            "unknown field `patern`, expected one of `pattern`, `output`, `case_insensitive`"
        ),
        "{e}"
    );
    assert!(e.contains("TOML parse error at line 1, column 1"), "{e}");
    let e = error("[signals.correct]\npattern = \"a\"\n");
    assert!(e.contains("missing field `kind`"), "{e}");
    let e = error("[signals.correct]\nkind = \"regex\"\n");
    assert!(e.contains("missing field `pattern`"), "{e}");
    let e = error("[other]\nx = 1\n");
    assert!(e.contains("unknown field `other`"), "{e}");
    let e = error("[signals.correct]\nkind = \"length\"\nunit = \"lines\"\n");
    assert!(
        e.contains("unknown variant `lines`, expected one of `words`, `chars`, `tokens`"),
        "{e}"
    );
    let e = error("[signals.correct]\nkind = \"points\"\nextra = 1\n");
    assert!(e.contains("unknown field `extra`"), "{e}");
}

#[test]
fn value_errors_name_the_signal() {
    assert_eq!(
        error("[signals.correct]\nkind = \"regex\"\npattern = \"(\"\n"),
        "signal `correct`: regex: invalid regex `(`: regex parse error:\n    (\n    ^\nerror: unclosed group"
    );
    assert_eq!(
        error("[signals.correct]\nkind = \"numeric_answer\"\nabs_tol = -1.0\n"),
        "signal `correct`: numeric_answer: `abs_tol` must be finite and ≥ 0, got -1"
    );
    assert_eq!(
        error("[signals.correct]\nkind = \"length\"\nunit = \"words\"\nmin = 5\nmax = 2\n"),
        "signal `correct`: length: `min` (5) is greater than `max` (2)"
    );
    assert_eq!(
        error("[signals.correct]\nkind = \"contains\"\nkeywords = []\n"),
        "signal `correct`: contains: `keywords` is empty"
    );
    assert_eq!(
        error("[signals.count]\nkind = \"partition\"\nthreshold = 1.5\n"),
        "signal `count`: partition: `threshold` is a cosine similarity in [-1, 1], got 1.5"
    );
    assert_eq!(
        error("[signals.met]\nkind = \"judge\"\nthreshold = 0.5\n"),
        "signal `met`: judge: `threshold` applies only to `output = \"verdict\"`"
    );
    assert_eq!(
        error("[signals.met]\nkind = \"judge\"\ntemplate = \"{response} {critrion}\"\n"),
        "signal `met`: judge: judge template: unknown placeholder `{critrion}`; the placeholders are {conversation}, {response}, {criterion}"
    );
    assert_eq!(
        error("[signals.met]\nkind = \"judge\"\ntemplate = \"{criterion}\"\n"),
        "signal `met`: judge: judge template: missing placeholder `{response}`"
    );
    assert_eq!(
        error(
            "[signals.correct]\nkind = \"ifeval\"\n[[signals.correct.checks]]\nid = \"length_constraints:number_words\"\nnum_words = 3\n"
        ),
        "signal `correct`: ifeval: check 1 (`length_constraints:number_words`): `length_constraints:number_words`: missing argument `relation`"
    );
    let e = error(
        "[signals.correct]\nkind = \"ifeval\"\n[[signals.correct.checks]]\nid = \"language:response_language\"\nlanguage = \"de\"\n",
    );
    assert!(
        e.starts_with("signal `correct`: ifeval: check 1 (`language:response_language`): unsupported IFEval instruction `language:response_language`; supported ids: punctuation:no_comma, "),
        "{e}"
    );
    assert_eq!(
        error("[signals.correct]\nkind = \"ifeval\"\nchecks = []\n"),
        "signal `correct`: ifeval: `checks` is empty (leave it out to check the prompt's own IFEval instructions)"
    );
}

#[test]
fn type_mismatches_are_errors() {
    assert_eq!(
        error("[signals.nope]\nkind = \"points\"\n"),
        "signal `nope`: the recipe has no input `nope` to fill (its inputs: `correct`, `score`, `count`, `met`, `points`, `emb`, `logp`, `judged`)"
    );
    assert_eq!(
        error("[signals.correct]\nkind = \"regex\"\npattern = \"a\"\noutput = \"count\"\n"),
        "signal `correct`: regex: produces i32[resp] but input `correct` is bool[resp]; a i32 value does not convert to bool (only bool → i32 → f32 widen)"
    );
    assert_eq!(
        error("[signals.logp]\nkind = \"exact_answer\"\n"),
        "signal `logp`: exact_answer: produces bool[resp] but input `logp` is f32[tok]"
    );
    assert_eq!(
        error("[signals.score]\nkind = \"points\"\n"),
        "signal `score`: points: produces f32[group, crit] but input `score` is f32[resp]"
    );
    assert_eq!(
        error("[signals.met]\nkind = \"judge\"\n"),
        "signal `met`: judge: produces f32[resp, crit] but input `met` is bool[resp, crit]; a f32 value does not convert to bool (only bool → i32 → f32 widen)"
    );
    assert_eq!(
        error("[signals.judged]\nkind = \"judge\"\n"),
        "signal `judged`: judge: produces f32[resp, crit] but input `judged` is f32[resp, style]; the prompt's criteria have no names to match rubric `style`: give the signal a list of named criteria"
    );
    assert_eq!(
        error(
            "[signals.judged]\nkind = \"judge\"\ncriteria = [{ name = \"short\", text = \"Is it short?\" }]\n"
        ),
        "signal `judged`: judge: produces f32[resp, <short>] but input `judged` is f32[resp, style]; rubric `style` has criterion `polite`, which the signal does not name"
    );
    assert_eq!(
        error(
            "[signals.judged]\nkind = \"judge\"\ncriteria = [{ name = \"short\", text = \"a\" }, { name = \"polite\", text = \"b\" }, { name = \"warm\", text = \"c\" }]\n"
        ),
        "signal `judged`: judge: produces f32[resp, <short, polite, warm>] but input `judged` is f32[resp, style]; the signal names `warm`, which is not a criterion of rubric `style`"
    );
    assert_eq!(
        error(
            "[signals.judged]\nkind = \"judge\"\ncriteria = [{ name = \"short\", text = \"a\" }, { name = \"short\", text = \"b\" }]\n"
        ),
        "signal `judged`: judge: `criteria`: name `short` appears twice"
    );
    // An ifeval "all" verdict is per response and cannot fill a criterion input.
    assert_eq!(
        error("[signals.met]\nkind = \"ifeval\"\n"),
        "signal `met`: ifeval: produces bool[resp] but input `met` is bool[resp, crit]"
    );
}

#[test]
fn parse_toml_reads_only_signals() {
    let specs = parse_toml("").unwrap();
    assert!(specs.is_empty());
    let specs = parse_toml("[signals.a]\nkind = \"points\"\n").unwrap();
    assert_eq!(specs["a"].kind_name(), "points");
}

/// A trainer config embeds the signal tables in its own strict struct.
#[test]
fn specs_embed_in_a_larger_config() {
    use std::collections::BTreeMap;
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Config {
        #[allow(dead_code)]
        seed: u64,
        #[serde(default)]
        signals: BTreeMap<String, rlx_signals::SignalSpec>,
    }
    let cfg: Config = toml::from_str(
        "seed = 3\n[signals.correct]\nkind = \"contains\"\nkeywords = [\"yes\"]\nmode = \"all\"\n",
    )
    .unwrap();
    let reg = Registry::new(&cfg.signals, &inputs()).unwrap();
    assert_eq!(reg.inputs().collect::<Vec<_>>(), vec!["correct"]);
    let e = toml::from_str::<Config>(
        "seed = 3\n[signals.correct]\nkind = \"contains\"\nkeyword = [\"yes\"]\n",
    )
    .err()
    .unwrap()
    .to_string();
    assert!(e.contains("unknown field `keyword`"), "{e}");
}

#[test]
fn a_judge_on_a_rubric_from_a_rubric_file_asks_its_texts() {
    let toml = "[signals.judged]\nkind = \"judge\"\n";
    // Without texts, a judge on a rubric input needs named criteria.
    assert!(error(toml).contains("give the signal a list of named criteria"));
    let mut specs = parse_toml(toml).unwrap();
    let texts = [(
        "judged".to_string(),
        vec![
            ("short".to_string(), "The response is short.".to_string()),
            ("polite".to_string(), "The response is polite.".to_string()),
        ],
    )]
    .into_iter()
    .collect();
    rlx_signals::spec::judge_rubric_texts(&mut specs, &texts);
    let registry = Registry::new(&specs, &inputs()).unwrap_or_else(|e| panic!("{e}"));
    assert!(registry.needs_judge());
    assert!(registry
        .output_type("judged")
        .unwrap()
        .to_string()
        .starts_with("f32[resp, "));
    // A rubric with a criterion without text is left alone.
    let mut specs = parse_toml(toml).unwrap();
    let partial = [(
        "judged".to_string(),
        vec![
            ("short".to_string(), "The response is short.".to_string()),
            ("polite".to_string(), String::new()),
        ],
    )]
    .into_iter()
    .collect();
    rlx_signals::spec::judge_rubric_texts(&mut specs, &partial);
    assert!(Registry::new(&specs, &inputs()).is_err());
}
