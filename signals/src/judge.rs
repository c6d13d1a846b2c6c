//! Rubric criteria as yes/no questions to a language model, and the model interfaces the caller
//! provides ([`YesNo`] for judges, [`Embed`] for sentence embeddings).

use crate::data::Message;

/// A model that answers yes/no questions. `p_yes` gets one question per entry (the user message; the
/// implementation adds its answer-format instruction and chat template — `rlx_trainer::judge::p_yes`
/// appends "Answer with yes or no." — and reads P(yes) from the next token) and returns P(yes) for
/// each, in `[0, 1]`, in order.
pub trait YesNo {
    fn p_yes(&self, prompts: &[String]) -> Result<Vec<f64>, String>;
}

/// A sentence-embedding model: one vector per text, all of the same length.
pub trait Embed {
    fn embed(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, String>;
}

/// The default judge template. Placeholders: `{conversation}` (the prompt's messages, one
/// `role: content` line each, as HealthBench's grader formats them), `{response}` (the completion) and
/// `{criterion}` (the criterion's text). The wording follows HealthBench's grader instructions, asking
/// for a one-word verdict instead of JSON so that P(yes) can be read from the next-token distribution.
pub const DEFAULT_TEMPLATE: &str = "\
Look at a conversation and a rubric item, and decide whether the last assistant response meets the rubric item.

# Conversation
{conversation}
assistant: {response}

# Rubric item
{criterion}

# Instructions
If the rubric item has several parts, it is met only if all of them are met; examples introduced by \"such as\", \"for example\" or \"including\" need not all be present. If the rubric item describes something undesirable, answer whether the response does that undesirable thing.

Is the rubric item met?";

/// Every placeholder a template may use.
pub const PLACEHOLDERS: [&str; 3] = ["{conversation}", "{response}", "{criterion}"];

/// Checks a template: it must contain `{response}` and `{criterion}`; any other `{…}` is an error (so a
/// typo such as `{critrion}` is caught). Literal braces are written `{{` and `}}`.
pub fn validate_template(template: &str) -> Result<(), String> {
    let mut rest = template;
    while let Some(i) = rest.find(['{', '}']) {
        let tail = &rest[i..];
        if tail.starts_with("{{") || tail.starts_with("}}") {
            rest = &tail[2..];
            continue;
        }
        if tail.starts_with('}') {
            return Err("judge template: unmatched `}` (write `}}` for a literal brace)".into());
        }
        let end = tail.find('}').ok_or_else(|| {
            "judge template: unmatched `{` (write `{{` for a literal brace)".to_string()
        })?;
        let ph = &tail[..=end];
        if !PLACEHOLDERS.contains(&ph) {
            return Err(format!(
                "judge template: unknown placeholder `{ph}`; the placeholders are {}",
                PLACEHOLDERS.join(", ")
            ));
        }
        rest = &tail[end + 1..];
    }
    for needed in ["{response}", "{criterion}"] {
        if !template.contains(needed) {
            return Err(format!("judge template: missing placeholder `{needed}`"));
        }
    }
    Ok(())
}

/// The prompt's messages as HealthBench's grader writes them: `role: content`, one per line.
pub fn format_conversation(messages: &[Message]) -> String {
    messages
        .iter()
        .map(|m| format!("{}: {}", m.role, m.content))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Fills a (validated) template. Substitution is one pass, so a placeholder inside the response or the
/// criterion text is left as written.
pub fn render(template: &str, conversation: &str, response: &str, criterion: &str) -> String {
    let mut out = String::with_capacity(template.len() + conversation.len() + response.len());
    let mut rest = template;
    while let Some(i) = rest.find(['{', '}']) {
        out.push_str(&rest[..i]);
        let tail = &rest[i..];
        if let Some(r) = tail.strip_prefix("{{") {
            out.push('{');
            rest = r;
        } else if let Some(r) = tail.strip_prefix("}}") {
            out.push('}');
            rest = r;
        } else if let Some(r) = tail.strip_prefix("{conversation}") {
            out.push_str(conversation);
            rest = r;
        } else if let Some(r) = tail.strip_prefix("{response}") {
            out.push_str(response);
            rest = r;
        } else if let Some(r) = tail.strip_prefix("{criterion}") {
            out.push_str(criterion);
            rest = r;
        } else {
            out.push_str(&tail[..1]);
            rest = &tail[1..];
        }
    }
    out.push_str(rest);
    out
}

/// Calls the judge and checks its answer: one probability per prompt, each finite and in [0, 1].
pub fn ask(judge: &dyn YesNo, prompts: &[String]) -> Result<Vec<f64>, String> {
    if prompts.is_empty() {
        return Ok(Vec::new());
    }
    let ps = judge
        .p_yes(prompts)
        .map_err(|e| format!("judge failed: {e}"))?;
    if ps.len() != prompts.len() {
        return Err(format!(
            "judge returned {} probabilities for {} questions",
            ps.len(),
            prompts.len()
        ));
    }
    if let Some((i, p)) = ps
        .iter()
        .enumerate()
        .find(|(_, p)| !(p.is_finite() && (0.0..=1.0).contains(*p)))
    {
        return Err(format!(
            "judge returned P(yes) = {p} for question {i}; expected a probability in [0, 1]"
        ));
    }
    Ok(ps)
}
