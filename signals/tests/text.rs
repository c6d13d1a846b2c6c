//! Text checks: words, `contains` modes, length bounds, regex limits, scripts.

use rlx_signals::text::{
    compile_regex, count_chars, count_words, dominant_script, script_of, within, wrong_script,
    Contains, Mode, Script,
};

fn kw(words: &[&str]) -> Vec<String> {
    words.iter().map(|s| s.to_string()).collect()
}

#[test]
fn words_and_chars() {
    // Hello · world · It · s · 3 · 5 · e · mail_x
    assert_eq!(count_words("Hello, world! It's 3.5 e-mail_x"), 8);
    assert_eq!(count_words(""), 0);
    assert_eq!(count_words("naïve café"), 2);
    assert_eq!(count_chars("naïve"), 5);
}

#[test]
fn contains_modes() {
    let any = Contains::new(&kw(&["cat", "dog"]), Mode::Any, false, false).unwrap();
    let all = Contains::new(&kw(&["cat", "dog"]), Mode::All, false, false).unwrap();
    let none = Contains::new(&kw(&["cat", "dog"]), Mode::None, false, false).unwrap();
    assert!(any.check("a CAT"));
    assert!(!all.check("a CAT"));
    assert!(all.check("Dog and cat"));
    assert!(!none.check("concatenate"));
    assert!(none.check("bird"));
    let word = Contains::new(&kw(&["cat"]), Mode::Any, true, true).unwrap();
    assert!(!word.check("concatenate"));
    assert!(!word.check("Cat"));
    assert!(word.check("the cat."));
    // Keywords are literal: a regex metacharacter matches itself only.
    let lit = Contains::new(&kw(&["a.c"]), Mode::Any, false, false).unwrap();
    assert!(!lit.check("abc"));
    assert!(lit.check("xa.cx"));
    assert_eq!(
        Contains::new(&kw(&["x", ""]), Mode::Any, false, false).unwrap_err(),
        "`keywords` contains an empty string"
    );
}

#[test]
fn length_bounds_are_inclusive() {
    assert!(within(5, Some(5), Some(5)));
    assert!(!within(4, Some(5), None));
    assert!(!within(6, None, Some(5)));
    assert!(within(0, None, None));
}

#[test]
fn regex_size_limit() {
    assert!(compile_regex("a{1000}{1000}", false)
        .unwrap_err()
        .contains("exceeds size limit"));
    assert!(compile_regex("(?i)abc", false).unwrap().is_match("ABC"));
}

#[test]
fn scripts() {
    assert_eq!(script_of('a'), Some(Script::Latin));
    assert_eq!(script_of('é'), Some(Script::Latin));
    assert_eq!(script_of('ж'), Some(Script::Cyrillic));
    assert_eq!(script_of('中'), Some(Script::Cjk));
    assert_eq!(script_of('か'), Some(Script::Cjk));
    assert_eq!(script_of('한'), Some(Script::Hangul));
    assert_eq!(script_of('ह'), Some(Script::Indic(0)));
    assert_eq!(script_of('ব'), Some(Script::Indic(1)));
    assert_eq!(script_of('7'), None);
    assert_eq!(dominant_script("Привет, John!"), Some(Script::Cyrillic));
    assert_eq!(dominant_script("123 !"), None);
    assert!(wrong_script(
        "What is the capital of France?",
        "法国的首都是巴黎。"
    ));
    assert!(!wrong_script(
        "What is the capital of France?",
        "Paris (巴黎) is the capital."
    ));
    // Same script, other language: not detected (documented limitation).
    assert!(!wrong_script(
        "What is the capital of France?",
        "La capitale est Paris."
    ));
    assert!(!wrong_script("What is 2+2?", "4"));
}
