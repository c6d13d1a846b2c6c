//! Final-answer extraction, number parsing and the exact/numeric matches, on hand-worked cases.

use rlx_signals::answer::{
    after_answer_is, exact_match, extract, last_boxed, last_number, normalize, numeric_match,
    parse_number, Extract,
};

#[test]
fn boxed_takes_the_last_balanced_box() {
    assert_eq!(
        last_boxed(r"so \boxed{1} then \boxed{\frac{3}{4}}."),
        Some(r"\frac{3}{4}")
    );
    assert_eq!(last_boxed(r"\fbox{ 7 }"), Some(" 7 "));
    assert_eq!(last_boxed(r"\boxed {x^{2}}"), Some("x^{2}"));
    // Unclosed box: ignored, the earlier closed one wins.
    assert_eq!(last_boxed(r"\boxed{5} and \boxed{6"), Some("5"));
    assert_eq!(last_boxed("no box here"), None);
}

#[test]
fn answer_is_takes_the_rest_of_the_line() {
    assert_eq!(
        after_answer_is("I think the answer is 42.\nDone"),
        Some("42")
    );
    assert_eq!(after_answer_is("Final Answer: B"), Some("B"));
    assert_eq!(after_answer_is("answer is: yes"), Some("yes"));
    assert_eq!(
        after_answer_is("first answer: 1, second answer: 2"),
        Some("2")
    );
    assert_eq!(after_answer_is("the answer is"), None);
    // "answers" is not "answer".
    assert_eq!(after_answer_is("answerable: no"), None);
}

#[test]
fn last_number_finds_signed_grouped_and_fractional_numbers() {
    assert_eq!(last_number("17+25=42"), Some("42"));
    assert_eq!(last_number("costs $1,234.50 total"), Some("1,234.50"));
    assert_eq!(last_number("x = -3 or 3/4"), Some("3/4"));
    assert_eq!(last_number("about .5"), Some(".5"));
    assert_eq!(last_number("1e-3"), Some("1e-3"));
    assert_eq!(last_number("none"), None);
}

#[test]
fn parse_number_cases() {
    assert_eq!(parse_number("42"), Some(42.0));
    assert_eq!(parse_number(" -1,234.5 "), Some(-1234.5));
    assert_eq!(parse_number("$12"), Some(12.0));
    assert_eq!(parse_number("50%"), Some(50.0));
    assert_eq!(parse_number("3/4"), Some(0.75));
    assert_eq!(parse_number(r"\frac{1}{8}"), Some(0.125));
    assert_eq!(parse_number(r"-\dfrac{1}{2}"), Some(-0.5));
    assert_eq!(parse_number("2.5e2"), Some(250.0));
    assert_eq!(parse_number("7."), Some(7.0));
    // Not numbers.
    assert_eq!(parse_number("12,34"), None);
    assert_eq!(parse_number("abc"), None);
    assert_eq!(parse_number("1/0"), None);
    assert_eq!(parse_number(""), None);
    assert_eq!(parse_number("4 apples"), None);
}

#[test]
fn auto_extraction_order() {
    // boxed beats "answer is" beats last number.
    assert_eq!(
        extract(r"answer is 3, \boxed{4} 5", Extract::Auto, true),
        Some("4")
    );
    assert_eq!(
        extract("answer is 3. Then 5", Extract::Auto, true),
        Some("3")
    );
    assert_eq!(extract("it is 3 then 5", Extract::Auto, true), Some("5"));
    // Non-numeric reference: fall back to the whole completion.
    assert_eq!(extract("  Paris  ", Extract::Auto, false), Some("Paris"));
    assert_eq!(
        extract("it is 3 then 5", Extract::Whole, true),
        Some("it is 3 then 5")
    );
    assert_eq!(extract("no digits", Extract::LastNumber, true), None);
}

#[test]
fn normalize_strips_markup_and_case() {
    assert_eq!(normalize("  **Paris.** ", false), "paris");
    assert_eq!(normalize("$x$", false), "x");
    assert_eq!(normalize("New   York", true), "New York");
}

#[test]
fn exact_match_positive_and_negative() {
    assert!(exact_match(
        "The answer is Paris.",
        "paris",
        Extract::Auto,
        None,
        false,
        false
    ));
    assert!(!exact_match(
        "The answer is Paris.",
        "paris",
        Extract::Auto,
        None,
        true,
        false
    ));
    assert!(exact_match(
        "17+25=42",
        "42",
        Extract::Auto,
        None,
        false,
        false
    ));
    assert!(!exact_match(
        "17+25=43",
        "42",
        Extract::Auto,
        None,
        false,
        false
    ));
    // Exact is a string comparison: 42.0 is not "42".
    assert!(!exact_match(
        r"\boxed{42.0}",
        "42",
        Extract::Auto,
        None,
        false,
        false
    ));
    assert!(!exact_match(
        "London",
        "Paris",
        Extract::Whole,
        None,
        false,
        false
    ));
    // math_equivalence: numbers compare as numbers.
    for (answer, reference) in [
        (r"\boxed{42.0}", "42"),
        ("<answer>1/2</answer>", "0.5"),
        (r"<answer>\frac{1}{2}</answer>", "0.5"),
        ("The answer is 1,000.", "1000"),
        ("<answer> 0.50 </answer>", "1/2"),
    ] {
        assert!(
            exact_match(answer, reference, Extract::Auto, None, false, true),
            "{answer} = {reference}"
        );
        assert!(
            !exact_match(answer, reference, Extract::Auto, None, false, false),
            "{answer} is not the string {reference}"
        );
    }
    assert!(!exact_match(
        "<answer>0.51</answer>",
        "1/2",
        Extract::Auto,
        None,
        false,
        true
    ));
    assert!(!exact_match(
        "<answer>Paris</answer>",
        "1/2",
        Extract::Auto,
        None,
        false,
        true
    ));
}

#[test]
fn answer_tags_and_user_patterns_extract_the_answer() {
    use rlx_signals::answer::{answer_tag, extract_with};
    // The last tag, trimmed, across lines, tags in any case.
    assert_eq!(
        answer_tag("<answer>3</answer> wait <ANSWER>\n 4 \n</Answer>"),
        Some("4")
    );
    assert_eq!(answer_tag("<answer>unclosed"), None);
    // auto prefers the tag to a later number or \boxed.
    assert_eq!(
        extract(r"<answer>7</answer> \boxed{8} and 9", Extract::Auto, true),
        Some("7")
    );
    assert!(numeric_match(
        "<think>2+2 is 4, not 5</think><answer>4</answer>",
        4.0,
        Extract::AnswerTag,
        None,
        0.0,
        0.0
    ));
    // A user regex: the first capture group, of the last match.
    let re = regex::Regex::new(r"FINAL: (\S+)").unwrap();
    assert_eq!(
        extract_with("FINAL: 1 then FINAL: 2", Extract::Regex, Some(&re), true),
        Some("2")
    );
    // Without a group, the whole match.
    let re = regex::Regex::new(r"\d+ apples").unwrap();
    assert_eq!(
        extract_with("3 apples, 5 apples", Extract::Regex, Some(&re), false),
        Some("5 apples")
    );
    assert_eq!(
        extract_with("nothing", Extract::Regex, Some(&re), false),
        None
    );
    assert!(exact_match(
        "FINAL: B",
        "b",
        Extract::Regex,
        Some(&regex::Regex::new("FINAL: (.)").unwrap()),
        false,
        false
    ));
}

#[test]
fn numeric_match_with_tolerances() {
    assert!(numeric_match(
        r"\boxed{42.0}",
        42.0,
        Extract::Auto,
        None,
        1e-6,
        0.0
    ));
    assert!(numeric_match(
        "so the answer is 1,000 dollars",
        1000.0,
        Extract::Auto,
        None,
        0.0,
        0.0
    ));
    assert!(numeric_match(
        "0.3333",
        1.0 / 3.0,
        Extract::Auto,
        None,
        1e-3,
        0.0
    ));
    assert!(!numeric_match(
        "0.3333",
        1.0 / 3.0,
        Extract::Auto,
        None,
        1e-6,
        0.0
    ));
    // Relative tolerance: 1% of 200 = 2.
    assert!(numeric_match(
        "201.9",
        200.0,
        Extract::Auto,
        None,
        0.0,
        0.01
    ));
    assert!(!numeric_match(
        "202.1",
        200.0,
        Extract::Auto,
        None,
        0.0,
        0.01
    ));
    // Boundary is inclusive: |x − ref| = abs_tol.
    assert!(numeric_match("1.5", 1.0, Extract::Auto, None, 0.5, 0.0));
    assert!(!numeric_match(
        "no number",
        1.0,
        Extract::Auto,
        None,
        0.5,
        0.0
    ));
    assert!(numeric_match(
        r"\boxed{\frac{3}{4}}",
        0.75,
        Extract::Boxed,
        None,
        1e-9,
        0.0
    ));
}
