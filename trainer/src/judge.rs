//! A yes/no judge: P(yes) of a model for a question, read from its next-token distribution.
//!
//! The rule. Each question is put in the chat template as one user turn, `{question}\nAnswer with yes or
//! no.`, followed by the assistant generation prompt (`<|im_start|>assistant\n`). From the logits `l` of
//! the next token, with Y = the ids of the single tokens `Yes`, `yes`, ` Yes`, ` yes` and N = those of `No`,
//! `no`, ` No`, ` no` (the ones the vocabulary has as single tokens; at least one of each is required):
//!
//! `P(yes) = Σ_{i∈Y} exp(l_i) / Σ_{i∈Y∪N} exp(l_i)`
//!
//! i.e. the softmax restricted to the yes/no tokens, so it does not depend on how much mass the model puts
//! elsewhere. Questions are evaluated in left-padded batches (padding masked out of attention) on the
//! model's [`Model::no_grad`] view, so a batch holds one layer's activations at a time instead of the
//! backpropagation graph of all of them.

use candle_core::{Device, Result, Tensor};

use crate::model::Model;
use crate::sample::left_pad;
use crate::tokenizer::{ChatTokenizer, Message};

/// Questions per forward pass unless the caller says otherwise (`task.judge_batch`).
pub const DEFAULT_BATCH: usize = 16;

/// The instruction appended to each question.
pub const INSTRUCTION: &str = "Answer with yes or no.";

/// The token ids counted as "yes" and as "no".
#[derive(Clone, Debug, PartialEq)]
pub struct YesNo {
    pub yes: Vec<u32>,
    pub no: Vec<u32>,
}

impl YesNo {
    pub fn new(tokenizer: &ChatTokenizer) -> Result<YesNo> {
        let ids = |words: [&str; 4]| -> Vec<u32> {
            let mut ids: Vec<u32> = words
                .iter()
                .filter_map(|w| tokenizer.single_token(w).ok())
                .collect();
            ids.sort_unstable();
            ids.dedup();
            ids
        };
        let yes = ids(["Yes", "yes", " Yes", " yes"]);
        let no = ids(["No", "no", " No", " no"]);
        if yes.is_empty() || no.is_empty() {
            candle_core::bail!(
                "the judge needs `yes` and `no` as single tokens; this vocabulary has yes {yes:?}, no {no:?}"
            );
        }
        Ok(YesNo { yes, no })
    }

    /// P(yes) from one row of next-token logits (see the module documentation).
    pub fn p_yes(&self, logits: &[f32]) -> f64 {
        let pick =
            |ids: &[u32]| -> Vec<f64> { ids.iter().map(|i| logits[*i as usize] as f64).collect() };
        let (y, n) = (pick(&self.yes), pick(&self.no));
        let max = y
            .iter()
            .chain(&n)
            .cloned()
            .fold(f64::NEG_INFINITY, f64::max);
        let sum = |v: &[f64]| v.iter().map(|l| (l - max).exp()).sum::<f64>();
        let (sy, sn) = (sum(&y), sum(&n));
        sy / (sy + sn)
    }
}

/// The chat prompt the judge asks, in the judge model's chat template.
pub fn judge_prompt(tokenizer: &ChatTokenizer, question: &str) -> Result<String> {
    tokenizer.chat_prompt(
        &[Message::new("user", &format!("{question}\n{INSTRUCTION}"))],
        true,
    )
}

/// The ids of [`judge_prompt`] (encoded as a chat prompt: nothing added).
pub fn judge_ids(tokenizer: &ChatTokenizer, question: &str) -> Result<Vec<u32>> {
    tokenizer.encode_chat(&judge_prompt(tokenizer, question)?)
}

/// P(yes) for each question, in order, `batch` questions per forward pass (≥ 1). Errors (not NaN) for
/// a logit that is not finite.
pub fn p_yes(
    model: &Model,
    tokenizer: &ChatTokenizer,
    questions: &[String],
    batch: usize,
    device: &Device,
) -> Result<Vec<f64>> {
    if batch == 0 {
        candle_core::bail!("judge: the batch size must be at least 1");
    }
    let yes_no = YesNo::new(tokenizer)?;
    let model = &model.no_grad();
    let mut out = Vec::with_capacity(questions.len());
    for chunk in questions.chunks(batch) {
        let prompts: Vec<Vec<u32>> = chunk
            .iter()
            .map(|q| judge_ids(tokenizer, q))
            .collect::<Result<_>>()?;
        let (pads, ids, len) = left_pad(&prompts);
        let ids = Tensor::from_vec(ids, (prompts.len(), len), device)?;
        let hidden = model.hidden(&ids, 0, &pads, None)?;
        let last = hidden.narrow(1, len - 1, 1)?.squeeze(1)?;
        let logits = model.logits(&last)?.to_vec2::<f32>()?;
        for (row, question) in logits.iter().zip(chunk) {
            let p = yes_no.p_yes(row);
            if !p.is_finite() {
                candle_core::bail!("judge: non-finite yes/no logits for question {question:?}");
            }
            out.push(p);
        }
    }
    Ok(out)
}
